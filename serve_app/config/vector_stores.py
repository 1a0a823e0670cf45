"""Vector stores and `file_search` (docs/file-search.md): the index, the embedding model, the
chunking tokenizer, and what one tenant and one replica take on."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from serve_app.api.vector_stores import MAX_FILE_IDS
from serve_app.config.base import Strict
from serve_app.config.models import DeploymentConfig
from serve_app.families.smollm2 import SMOLLM2


class EmbeddingConfig(Strict):
    """The embedding model of chunks and queries.

    hashing: the deterministic hashing model (words and character trigrams hashed into
      `dimensions` buckets): no weights, any machine; for tests and the demo, not a language model.
    vllm: `model` on vLLM's pooling runner (pooled into one vector per text), served by an
      `EmbeddingServer` deployment of its own (`deployment`); `dimensions` is its hidden size.
    """

    type: Literal["hashing", "vllm"] = Field("hashing", description="the model, see above")
    dimensions: int = Field(384, ge=8, le=16384, description="the vectors' dimensions (vllm: the model's hidden size; checked at start)")
    model: str | None = Field(None, description=f"vllm: a hub id or folder, or {SMOLLM2} (the built-in SmolLM2-135M-Instruct)")
    max_model_len: int = Field(2048, ge=16, description="vllm: tokens of a text the model reads (longer texts are truncated)")
    dtype: str = Field("auto", description="vllm: the weights' dtype")
    deployment: DeploymentConfig = Field(
        default_factory=lambda: DeploymentConfig(num_replicas=1, max_ongoing_requests=64),
        description="vllm: Serve options of the EmbeddingServer deployment (ray_actor_options: num_gpus for a GPU)",
    )

    @model_validator(mode="after")
    def _model_for_vllm(self) -> EmbeddingConfig:
        if self.type == "vllm" and not self.model:
            raise ValueError("an embedding of type vllm needs a 'model'")
        return self


class VectorStoresConfig(Strict):
    """The Vector Stores API (`/v1/vector_stores`) and the `file_search` tool."""

    index: Literal["embedded", "pgvector"] = Field(
        "embedded",
        description="embedded: usearch (vectors) and bm25s (keywords) in `directory`, one index per vector store; "
        "pgvector: a PostgreSQL server with pgvector at `url` (clusters)",
    )
    url: str | None = Field(None, description="pgvector: postgresql://user@host:5432/db (no password in it)")
    password_env: str = Field("PGVECTOR_PASSWORD", description="pgvector: the environment variable holding the password, if any")
    pool_min_size: int = Field(1, ge=0, le=100, description="pgvector: connections each ingress replica keeps open")
    pool_max_size: int = Field(
        4,
        ge=1,
        le=100,
        description="pgvector: connections each ingress replica opens at most (searches and ingestion share them); "
        "replicas x pool_max_size must stay under PostgreSQL's max_connections (default 100)",
    )
    pool_timeout_s: float = Field(
        5.0, gt=0, le=300, description="pgvector: how long a call waits for a connection (past it: 503 with Retry-After)"
    )
    pool_max_waiting: int = Field(
        256, ge=1, description="pgvector: calls of one replica waiting for a connection at once (past it: 503 at once)"
    )
    statement_timeout_s: float = Field(30.0, gt=0, le=3600, description="pgvector: one statement's time (past it: 503)")
    directory: str = Field(
        "/tmp/responses-serve/vector-stores",
        description="embedded: where the indexes are kept (replicas on several nodes need it on shared storage)",
    )
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig, description="the embedding model")
    tokenizer: str = Field(
        "o200k_harmony", description=f"what chunk sizes count: o200k_harmony (gpt-oss's), {SMOLLM2} (SmolLM2's), or a hub id or folder"
    )
    max_stores_per_tenant: int = Field(100, ge=1, description="vector stores one tenant may hold (400 past it)")
    max_files_per_store: int = Field(10_000, ge=1, description="files one vector store may hold (400 past it)")
    max_file_chars: int = Field(4_000_000, ge=1000, description="characters of one file's text indexed (a longer file fails)")
    max_chunks_per_store: int = Field(1_000_000, ge=1, description="chunks one vector store may hold (a file past it fails)")
    ingest_workers: int = Field(2, ge=1, le=64, description="files each ingress replica ingests at once (off its event loop)")
    ingest_queue: int = Field(1000, ge=1, description="files waiting for ingestion on one replica (past it: 503 with Retry-After)")
    ingest_queue_per_tenant: int | None = Field(
        None,
        ge=1,
        description="files of one tenant waiting for ingestion or being ingested on one replica (past it: 429 with "
        "Retry-After), so that one tenant's uploads cannot fill the queue for the others; default: a quarter of "
        f"ingest_queue, at least {MAX_FILE_IDS} (the files one request may attach), at most ingest_queue; with `auth` only "
        "(without it, everyone is one tenant: ingest_queue applies)",
    )
    ingest_timeout_s: float = Field(
        600.0,
        gt=0,
        description="one file's ingestion, from when a worker takes it (its wait in the queue not counted): past it the file "
        "fails; one still in_progress twice this long after its ingestion started reads as failed",
    )
    max_search_results: int = Field(50, ge=1, le=50, description="results one search returns at most (OpenAI: 50)")

    def tenant_ingest_share(self) -> int:
        """One tenant's share of the ingestion queue (`ingest_queue_per_tenant`, see above)."""
        share = self.ingest_queue_per_tenant
        return min(self.ingest_queue, max(MAX_FILE_IDS, self.ingest_queue // 4) if share is None else share)

    @model_validator(mode="after")
    def _share_within_queue(self) -> VectorStoresConfig:
        if self.ingest_queue_per_tenant is not None and self.ingest_queue_per_tenant > self.ingest_queue:
            raise ValueError("vector_stores.ingest_queue_per_tenant must be at most ingest_queue")
        return self

    @model_validator(mode="after")
    def _pool_sizes(self) -> VectorStoresConfig:
        if self.pool_min_size > self.pool_max_size:
            raise ValueError("vector_stores.pool_min_size must be at most pool_max_size")
        return self

    @model_validator(mode="after")
    def _url_for_pgvector(self) -> VectorStoresConfig:
        if self.index == "pgvector" and not self.url:
            raise ValueError("a pgvector index needs a 'url'")
        if (
            self.url is not None
            and "@" in self.url.split("//", 1)[-1].split("/", 1)[0]
            and ":" in self.url.split("//", 1)[-1].split("@", 1)[0]
        ):
            raise ValueError("the url holds a password: put it in the environment variable password_env names")
        return self

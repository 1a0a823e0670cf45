"""Vector stores and `file_search` (docs/file-search.md): the index, the embedding model, the
chunking tokenizer, and what one tenant and one replica take on."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from serve_app.config.base import Strict


class EmbeddingConfig(Strict):
    """The embedding model of chunks and queries.

    hashing: the deterministic hashing model (words and character trigrams hashed into
      `dimensions` buckets): no weights, any machine; for tests and the demo, not a language model.
    """

    type: Literal["hashing"] = Field("hashing", description="the model, see above")
    dimensions: int = Field(384, ge=8, le=4096, description="the vectors' dimensions")


class VectorStoresConfig(Strict):
    """The Vector Stores API (`/v1/vector_stores`) and the `file_search` tool."""

    index: Literal["embedded"] = Field(
        "embedded", description="embedded: usearch (vectors) and bm25s (keywords) in `directory`, one index per vector store"
    )
    directory: str = Field(
        "/tmp/responses-serve/vector-stores",
        description="embedded: where the indexes are kept (replicas on several nodes need it on shared storage)",
    )
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig, description="the embedding model")
    tokenizer: str = Field(
        "o200k_harmony", description="what chunk sizes count: o200k_harmony (gpt-oss's), smollm2-135m-instruct, or a hub id or folder"
    )
    max_stores_per_tenant: int = Field(100, ge=1, description="vector stores one tenant may hold (400 past it)")
    max_files_per_store: int = Field(10_000, ge=1, description="files one vector store may hold (400 past it)")
    max_file_chars: int = Field(4_000_000, ge=1000, description="characters of one file's text indexed (a longer file fails)")
    max_chunks_per_store: int = Field(1_000_000, ge=1, description="chunks one vector store may hold (a file past it fails)")
    ingest_workers: int = Field(2, ge=1, le=64, description="files each ingress replica ingests at once (off its event loop)")
    ingest_queue: int = Field(1000, ge=1, description="files waiting for ingestion on one replica (past it: 503 with Retry-After)")
    ingest_timeout_s: float = Field(600.0, gt=0, description="one file's ingestion; a file still in_progress after it reads as failed")
    max_search_results: int = Field(50, ge=1, le=50, description="results one search returns at most (OpenAI: 50)")

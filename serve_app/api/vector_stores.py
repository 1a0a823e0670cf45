"""Wire types of the Vector Stores API (`/v1/vector_stores`, its files, file batches and
search), as the `openai` SDK sends them; the responses are the SDK's own types
(`openai.types.VectorStore`, `openai.types.vector_stores.*`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serve_app.api.filters import ComparisonFilter, CompoundFilter, check_attributes, check_filter
from serve_app.api.tools import FileSearchRanking

AUTO_MAX_TOKENS = 800
AUTO_OVERLAP_TOKENS = 400
MIN_CHUNK_TOKENS = 100
MAX_CHUNK_TOKENS = 4096
MAX_FILE_IDS = 500  # in one create or batch request (OpenAI: 500)
MAX_METADATA_KEYS = 16
FileId = Annotated[str, Field(min_length=1, max_length=256)]


class StaticChunking(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_chunk_size_tokens: int = Field(ge=MIN_CHUNK_TOKENS, le=MAX_CHUNK_TOKENS)
    chunk_overlap_tokens: int = Field(ge=0)

    @model_validator(mode="after")
    def _overlap_at_most_half(self) -> StaticChunking:
        if self.chunk_overlap_tokens > self.max_chunk_size_tokens // 2:
            raise ValueError("chunk_overlap_tokens must not exceed half of max_chunk_size_tokens")
        return self


class ChunkingStrategy(BaseModel):
    """`{"type": "auto"}` or `{"type": "static", "static": {...}}` as a request gives it."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["auto", "static"]
    static: StaticChunking | None = None

    @model_validator(mode="after")
    def _static_needs_sizes(self) -> ChunkingStrategy:
        if self.type == "static" and self.static is None:
            raise ValueError("a static chunking_strategy needs 'static': {max_chunk_size_tokens, chunk_overlap_tokens}")
        if self.type == "auto" and self.static is not None:
            raise ValueError("an auto chunking_strategy takes no 'static'")
        return self

    @property
    def sizes(self) -> StaticChunking:
        return self.static or StaticChunking(max_chunk_size_tokens=AUTO_MAX_TOKENS, chunk_overlap_tokens=AUTO_OVERLAP_TOKENS)

    def as_file_strategy(self) -> dict[str, Any]:
        """The strategy a vector store file reports (OpenAI reports `auto` as the static sizes it stands for)."""
        return {"type": "static", "static": self.sizes.model_dump()}


AUTO = ChunkingStrategy(type="auto")


class Strict(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ExpiresAfter(Strict):
    anchor: Literal["last_active_at"]
    days: int = Field(ge=1, le=365)


def _metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    if value is None:
        return None
    if len(value) > MAX_METADATA_KEYS or any(len(k) > 64 or not isinstance(v, str) or len(v) > 512 for k, v in value.items()):
        raise ValueError("metadata holds at most 16 keys of 64 characters, with string values of 512")
    return value


def _attributes(value: dict[str, Any] | None) -> dict[str, Any] | None:
    return check_attributes(value) if value is not None else None


class VectorStoreCreate(Strict):
    name: str | None = Field(None, max_length=256)
    description: str | None = Field(None, max_length=512)
    metadata: dict[str, str] | None = None
    expires_after: ExpiresAfter | None = None
    file_ids: list[FileId] = Field(default_factory=list, max_length=MAX_FILE_IDS)
    chunking_strategy: ChunkingStrategy | None = None

    _check_metadata = field_validator("metadata")(classmethod(lambda cls, v: _metadata(v)))


class VectorStoreUpdate(Strict):
    name: str | None = Field(None, max_length=256)
    metadata: dict[str, str] | None = None
    expires_after: ExpiresAfter | None = None

    _check_metadata = field_validator("metadata")(classmethod(lambda cls, v: _metadata(v)))


class FileAttach(Strict):
    file_id: FileId
    attributes: dict[str, Any] | None = None
    chunking_strategy: ChunkingStrategy | None = None

    _check_attributes = field_validator("attributes")(classmethod(lambda cls, v: _attributes(v)))


class FileUpdate(Strict):
    attributes: dict[str, Any] | None

    _check_attributes = field_validator("attributes")(classmethod(lambda cls, v: _attributes(v)))


class BatchFile(Strict):
    file_id: FileId
    attributes: dict[str, Any] | None = None
    chunking_strategy: ChunkingStrategy | None = None

    _check_attributes = field_validator("attributes")(classmethod(lambda cls, v: _attributes(v)))


class BatchCreate(Strict):
    """`file_ids` (with one `attributes` and `chunking_strategy` for all) or `files` (each its own)."""

    file_ids: list[FileId] | None = Field(None, min_length=1, max_length=MAX_FILE_IDS)
    files: list[BatchFile] | None = Field(None, min_length=1, max_length=MAX_FILE_IDS)
    attributes: dict[str, Any] | None = None
    chunking_strategy: ChunkingStrategy | None = None

    _check_attributes = field_validator("attributes")(classmethod(lambda cls, v: _attributes(v)))

    @model_validator(mode="after")
    def _one_of(self) -> BatchCreate:
        if (self.file_ids is None) == (self.files is None):
            raise ValueError("give exactly one of 'file_ids' and 'files'")
        return self

    def entries(self) -> list[BatchFile]:
        if self.files is not None:
            return self.files
        return [BatchFile(file_id=f, attributes=self.attributes, chunking_strategy=self.chunking_strategy) for f in self.file_ids or []]


class SearchRequest(Strict):
    query: Annotated[str, Field(min_length=1, max_length=4096)] | list[Annotated[str, Field(min_length=1, max_length=4096)]]
    filters: ComparisonFilter | CompoundFilter | None = None
    max_num_results: int = Field(10, ge=1, le=50)
    ranking_options: FileSearchRanking | None = None
    rewrite_query: bool = False  # accepted; queries are searched as written

    @field_validator("query")
    @classmethod
    def _queries(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not 1 <= len(value) <= 8:
            raise ValueError("a list of queries holds 1 to 8")
        return value

    @field_validator("filters")
    @classmethod
    def _bounded(cls, value: ComparisonFilter | CompoundFilter | None) -> ComparisonFilter | CompoundFilter | None:
        return check_filter(value) if value is not None else None

    @property
    def text(self) -> str:
        return self.query if isinstance(self.query, str) else " ".join(self.query)

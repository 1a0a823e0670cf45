"""Wire types of the Vector Stores API (`/v1/vector_stores`, its files, file batches and
search), as the `openai` SDK sends them; the responses are the SDK's own types
(`openai.types.VectorStore`, `openai.types.vector_stores.*`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from openai.types import VectorStoreSearchResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from serve_app.api.filters import ATTRIBUTES_FIELD, ComparisonFilter, CompoundFilter, check_attributes, check_filter
from serve_app.api.tools import FileSearchRanking

AUTO_MAX_TOKENS = 800
AUTO_OVERLAP_TOKENS = 400
MIN_CHUNK_TOKENS = 100
MAX_CHUNK_TOKENS = 4096
MAX_FILE_IDS = 500  # in one create or batch request (OpenAI: 500)
MAX_METADATA_KEYS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_QUERIES = 8
FileId = Annotated[str, Field(min_length=1, max_length=256)]
Query = Annotated[str, Field(min_length=1, max_length=4096)]
# OpenAI's bounds of a vector store's `metadata`, stated in the type (and so in /openapi.json).
Metadata = dict[Annotated[str, Field(max_length=MAX_METADATA_KEY_CHARS)], Annotated[str, Field(max_length=MAX_METADATA_VALUE_CHARS)]]


def _set(name: str) -> dict[str, Any]:
    """JSON Schema: `name` is given and not null."""
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


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

    # The schema says what `_static_needs_sizes` checks.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "anyOf": [
                {"properties": {"type": {"const": "auto"}, "static": {"type": "null"}}},
                {**_set("static"), "properties": {"type": {"const": "static"}, "static": {"not": {"type": "null"}}}},
            ]
        },
    )

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


def _attributes(value: dict[str, Any] | None) -> dict[str, Any] | None:
    return check_attributes(value) if value is not None else None


class VectorStoreCreate(Strict):
    name: str | None = Field(None, max_length=256)
    description: str | None = Field(None, max_length=512)
    metadata: Metadata | None = Field(None, max_length=MAX_METADATA_KEYS)
    expires_after: ExpiresAfter | None = None
    file_ids: list[FileId] = Field(default_factory=list, max_length=MAX_FILE_IDS)
    chunking_strategy: ChunkingStrategy | None = None


class VectorStoreUpdate(Strict):
    name: str | None = Field(None, max_length=256)
    metadata: Metadata | None = Field(None, max_length=MAX_METADATA_KEYS)
    expires_after: ExpiresAfter | None = None


class FileAttach(Strict):
    file_id: FileId
    attributes: dict[str, Any] | None = Field(None, json_schema_extra=ATTRIBUTES_FIELD)
    chunking_strategy: ChunkingStrategy | None = None

    _check_attributes = field_validator("attributes")(classmethod(lambda cls, v: _attributes(v)))


class FileUpdate(Strict):
    attributes: dict[str, Any] | None = Field(json_schema_extra=ATTRIBUTES_FIELD)

    _check_attributes = field_validator("attributes")(classmethod(lambda cls, v: _attributes(v)))


class BatchFile(Strict):
    file_id: FileId
    attributes: dict[str, Any] | None = Field(None, json_schema_extra=ATTRIBUTES_FIELD)
    chunking_strategy: ChunkingStrategy | None = None

    _check_attributes = field_validator("attributes")(classmethod(lambda cls, v: _attributes(v)))


class BatchCreate(Strict):
    """`file_ids` (with one `attributes` and `chunking_strategy` for all) or `files` (each its own)."""

    # The schema says what `_one_of` checks.
    model_config = ConfigDict(
        extra="ignore", json_schema_extra={"anyOf": [_set("file_ids"), _set("files")], "not": {"allOf": [_set("file_ids"), _set("files")]}}
    )

    file_ids: list[FileId] | None = Field(None, min_length=1, max_length=MAX_FILE_IDS)
    files: list[BatchFile] | None = Field(None, min_length=1, max_length=MAX_FILE_IDS, validate_default=True)
    attributes: dict[str, Any] | None = Field(None, json_schema_extra=ATTRIBUTES_FIELD)
    chunking_strategy: ChunkingStrategy | None = None

    _check_attributes = field_validator("attributes")(classmethod(lambda cls, v: _attributes(v)))

    @field_validator("files")
    @classmethod
    def _one_of(cls, files: list[BatchFile] | None, info: ValidationInfo) -> list[BatchFile] | None:
        """Exactly one of `file_ids` and `files` (a 400 naming `files`; an invalid `file_ids` is its own 400)."""
        if "file_ids" in info.data and (info.data["file_ids"] is None) == (files is None):
            raise ValueError("give exactly one of 'file_ids' and 'files'")
        return files

    def entries(self) -> list[BatchFile]:
        if self.files is not None:
            return self.files
        return [BatchFile(file_id=f, attributes=self.attributes, chunking_strategy=self.chunking_strategy) for f in self.file_ids or []]


class SearchRequest(Strict):
    query: Query | Annotated[list[Query], Field(min_length=1, max_length=MAX_QUERIES)]
    filters: ComparisonFilter | CompoundFilter | None = None
    max_num_results: int = Field(10, ge=1, le=50)
    ranking_options: FileSearchRanking | None = None
    rewrite_query: bool = False  # accepted; queries are searched as written

    @field_validator("filters")
    @classmethod
    def _bounded(cls, value: ComparisonFilter | CompoundFilter | None) -> ComparisonFilter | CompoundFilter | None:
        return check_filter(value) if value is not None else None

    @property
    def text(self) -> str:
        return self.query if isinstance(self.query, str) else " ".join(self.query)


class SearchPage(BaseModel):
    """A search's answer (`vector_store.search_results.page`: one page, the best results)."""

    object: Literal["vector_store.search_results.page"] = "vector_store.search_results.page"
    search_query: list[str]
    data: list[VectorStoreSearchResponse]
    has_more: bool = False
    next_page: str | None = None

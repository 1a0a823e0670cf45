"""Request bodies and query parameters of the Conversations API (`/v1/conversations`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from serve_app.api.items import Lenient, StoredInputItem

MAX_ITEMS_PER_REQUEST = 20  # the API's limit for creating items at once
MAX_PAGE_SIZE = 100


class _WithMetadata(Lenient):
    metadata: dict[str, str] | None = None  # its limits: request_limits (api/limits.py)


class ConversationCreate(_WithMetadata):
    items: list[StoredInputItem] | None = Field(default=None, max_length=MAX_ITEMS_PER_REQUEST)


class ConversationUpdate(_WithMetadata):
    metadata: dict[str, str] | None  # required, may be null (clears it)


class ItemsCreate(Lenient):
    items: list[StoredInputItem] = Field(min_length=1, max_length=MAX_ITEMS_PER_REQUEST)


class ItemsQuery(Lenient):
    after: str | None = None
    limit: int = Field(default=20, ge=1, le=MAX_PAGE_SIZE)
    order: Literal["asc", "desc"] = "desc"

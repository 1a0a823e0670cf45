"""Conversations (the Conversations API and the `conversation` request parameter), over any `Store`.

- `conversation:{id}`: the `Conversation` object (id, created_at, metadata) as JSON;
- `conversation:{id}:items`: its items, oldest first, each the JSON of the API's item
  (`ConversationItem`, with its id). Items are only ever appended, several in one atomic
  `append`: the input and output of a turn land together, and two concurrent turns on one
  conversation each append their own items, so none is lost.
- `tool_texts:conversation:{id}`: what the model read of the built-in tool calls among its
  items (`{"id": item id, "text": ...}`, appended just before the items they belong to): a
  turn that continues the conversation shows them to the model; the API never does.

Every read gives its keys a fresh TTL: a conversation in use does not expire.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import openai
from openai.types.conversations import Conversation
from pydantic import TypeAdapter

from serve_app.api.errors import APIError
from serve_app.api.items import StoredInputItem
from serve_app.core.stream import new_id
from serve_app.families.harmony import HistoryItem
from serve_app.state.responses import BUILTIN_ITEM_TYPES, as_response_item, kept_tool_texts, with_ids, with_tool_text
from serve_app.state.store import Store
from serve_app.state.tenancy import TenantStore

_INPUT_ITEM = TypeAdapter(StoredInputItem)


def conversation_not_found(conversation_id: str, param: str = "conversation_id") -> APIError:
    return APIError(f"Conversation with id '{conversation_id}' not found.", status_code=404, param=param, code="not_found")


def conversation_key(conversation_id: str) -> str:
    return f"conversation:{conversation_id}"


def items_key(conversation_id: str) -> str:
    # Not `conversation:{id}:items`: that is the key of a conversation whose id ends in ":items".
    return f"items:conversation:{conversation_id}"


def tool_texts_key(conversation_id: str) -> str:
    return f"tool_texts:conversation:{conversation_id}"


def item_record(item: HistoryItem | openai.BaseModel) -> bytes:
    """An input item (ours) or an output item (the SDK's) as a stored conversation item."""
    if not isinstance(item, openai.BaseModel):  # our input items: an id, the API's shape
        item = as_response_item(with_ids([item], None)[0])
    return item.model_dump_json(exclude_none=True).encode()


@dataclass(frozen=True, slots=True)
class ItemPage:
    data: list[dict[str, Any]]
    has_more: bool


class ConversationStore:
    """One tenant's conversations (its keys under the tenant's prefix)."""

    def __init__(self, store: Store, tenant: str, ttl_s: float) -> None:
        self.tenant = tenant
        self.store = TenantStore(store, tenant)
        self.ttl_s = ttl_s

    async def create(self, metadata: dict[str, str] | None, items: list[HistoryItem]) -> Conversation:
        conversation = Conversation(id=new_id("conv"), object="conversation", created_at=int(time.time()), metadata=metadata or {})
        if items:  # the items first: a conversation is never seen without the items it was created with
            await self.store.append(items_key(conversation.id), [item_record(i) for i in items], ttl_s=self.ttl_s)
        await self.store.put(conversation_key(conversation.id), conversation.model_dump_json().encode(), ttl_s=self.ttl_s)
        return conversation

    async def get(self, conversation_id: str) -> Conversation | None:
        data = await self.store.get(conversation_key(conversation_id))
        if data is None:
            return None
        await self.store.expire(
            [conversation_key(conversation_id), items_key(conversation_id), tool_texts_key(conversation_id)], self.ttl_s
        )
        return Conversation.model_validate_json(data)

    async def update(self, conversation_id: str, metadata: dict[str, str] | None) -> Conversation | None:
        key = conversation_key(conversation_id)
        while True:  # compare-and-set: a concurrent delete is not undone
            data = await self.store.get(key)
            if data is None:
                return None
            conversation = Conversation.model_validate_json(data).model_copy(update={"metadata": metadata or {}})
            if await self.store.compare_and_set(key, data, conversation.model_dump_json().encode(), ttl_s=self.ttl_s):
                return conversation

    async def delete(self, conversation_id: str) -> bool:
        found = await self.store.delete(conversation_key(conversation_id))
        await self.store.delete(items_key(conversation_id))
        await self.store.delete(tool_texts_key(conversation_id))
        return found

    async def append(self, conversation_id: str, items: list[Any], tool_texts: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """Append items (ours or the SDK's) atomically; the stored items as the API shows them.
        What the model read of the built-in tool calls among them (`tool_texts`, kept as a
        stored turn keeps them) is appended first: an item is never there before its text."""
        records = [item_record(item) for item in items]
        kept = kept_tool_texts(items, tool_texts)
        if kept:
            texts = [json.dumps({"id": item_id, "text": text}).encode() for item_id, text in kept.items()]
            await self.store.append(tool_texts_key(conversation_id), texts, ttl_s=self.ttl_s)
        if records:
            await self.store.append(items_key(conversation_id), records, ttl_s=self.ttl_s)
        return [json.loads(r) for r in records]

    async def _records(self, conversation_id: str) -> list[bytes]:
        return await self.store.range(items_key(conversation_id))

    async def items(self, conversation_id: str) -> list[dict[str, Any]]:
        return [json.loads(r) for r in await self._records(conversation_id)]

    async def history(self, conversation_id: str) -> list[HistoryItem]:
        """The conversation's items as the input of a request that continues it (its built-in
        tool calls with what the model read of them)."""
        items = await self.items(conversation_id)
        texts = {}
        if any(item.get("type") in BUILTIN_ITEM_TYPES for item in items):
            texts = {record["id"]: record["text"] for record in map(json.loads, await self.store.range(tool_texts_key(conversation_id)))}
        return [with_tool_text(_INPUT_ITEM.validate_python(item), texts) for item in items]

    async def page(self, conversation_id: str, *, after: str | None, limit: int, order: Literal["asc", "desc"]) -> ItemPage | None:
        """Items after the one with id `after` in `order`; None if `after` is not an item."""
        items = await self.items(conversation_id)
        if order == "desc":
            items.reverse()
        if after is not None:
            position = next((i for i, item in enumerate(items) if item.get("id") == after), None)
            if position is None:
                return None
            items = items[position + 1 :]
        return ItemPage(items[:limit], has_more=len(items) > limit)

    async def item(self, conversation_id: str, item_id: str) -> dict[str, Any] | None:
        return next((item for item in await self.items(conversation_id) if item.get("id") == item_id), None)

    async def delete_item(self, conversation_id: str, item_id: str) -> bool:
        for record in await self._records(conversation_id):
            if json.loads(record).get("id") == item_id:
                removed = await self.store.remove(items_key(conversation_id), record)
                for text in await self.store.range(tool_texts_key(conversation_id)):  # its text goes with it
                    if json.loads(text).get("id") == item_id:
                        await self.store.remove(tool_texts_key(conversation_id), text)
                return removed
        return False

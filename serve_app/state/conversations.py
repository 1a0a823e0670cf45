"""Conversations (the Conversations API and the `conversation` request parameter), over any `Store`.

- `conversation:{id}`: the `Conversation` object (id, created_at, metadata) as JSON;
- `conversation:{id}:items`: its items, oldest first, each the JSON of the API's item
  (`ConversationItem`, with its id). Items are only ever appended, several in one atomic
  `append`: the input and output of a turn land together, and two concurrent turns on one
  conversation each append their own items, so none is lost.
- `tool_texts:conversation:{id}`: what the model read of the built-in tool calls among its
  items (`{"id": item id, "text": ...}`, appended just before the items they belong to): a
  turn that continues the conversation shows them to the model; the API never does.
- `size:conversation:{id}`: `[items, bytes]`, how many items it holds and their bytes with
  their tool texts, kept beside them so that its bound (`ConversationLimits`) is checked
  without reading them. A conversation stored before it was kept (or whose size key the
  embedded store evicted) is measured once, its records' lengths without decoding them.

Every read gives its keys a fresh TTL: a conversation in use does not expire.

Reads decode only what they return: a page of items reads its page (and, for `after`, the
raw records up to that item: a substring match of its id, decoded only to confirm), a turn
with `truncation: "auto"` reads the newest items a slice at a time until they pass the
model's context (runtime/run.py), and every JSON decode of a stored item goes through
`decode` (tests count them).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import openai
import pydantic_core
from openai.types.conversations import Conversation
from pydantic import TypeAdapter

from serve_app.api.errors import APIError
from serve_app.api.items import StoredInputItem
from serve_app.core.stream import new_id
from serve_app.families.harmony import HistoryItem
from serve_app.state.responses import BUILTIN_ITEM_TYPES, as_response_item, kept_tool_texts, with_ids, with_tool_text
from serve_app.state.store import Store, StoreUnavailable
from serve_app.state.tenancy import TenantStore

_INPUT_ITEM = TypeAdapter(StoredInputItem)

DEFAULT_MAX_ITEMS = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
SLICE = 256  # records read per store call when searching or measuring
_CAS_TRIES = 100


@dataclass(frozen=True, slots=True)
class ConversationLimits:
    """What one conversation may hold: its items, and their bytes (as stored, with what the
    model read of its built-in tool calls). Past either, appending is a 400."""

    max_items: int = DEFAULT_MAX_ITEMS
    max_bytes: int = DEFAULT_MAX_BYTES


def decode(record: bytes) -> dict[str, Any]:
    """A stored item's JSON: every read of conversation items decodes through here."""
    item: dict[str, Any] = json.loads(record)
    return item


def decode_all(records: list[bytes]) -> list[dict[str, Any]]:
    return [decode(record) for record in records]


def conversation_full(conversation_id: str, limits: ConversationLimits, items: int, size: int, param: str) -> APIError:
    return APIError(
        f"Conversation '{conversation_id}' would hold {items} items ({size} bytes), more than this server keeps in one "
        f"conversation: {limits.max_items} items and {limits.max_bytes} bytes. Start a new conversation, or compact this "
        "one (POST /v1/responses/compact with its items) and continue in a new conversation from the compacted output.",
        status_code=400,
        param=param,
        code="conversation_too_large",
    )


def conversation_not_found(conversation_id: str, param: str = "conversation_id") -> APIError:
    return APIError(f"Conversation with id '{conversation_id}' not found.", status_code=404, param=param, code="not_found")


def conversation_key(conversation_id: str) -> str:
    return f"conversation:{conversation_id}"


def items_key(conversation_id: str) -> str:
    # Not `conversation:{id}:items`: that is the key of a conversation whose id ends in ":items".
    return f"items:conversation:{conversation_id}"


def tool_texts_key(conversation_id: str) -> str:
    return f"tool_texts:conversation:{conversation_id}"


def size_key(conversation_id: str) -> str:
    return f"size:conversation:{conversation_id}"


def _id_needle(item_id: str) -> bytes:
    """How `"id": item_id` appears in a stored record (serialized as records are)."""
    return b'"id":' + pydantic_core.to_json(item_id)


def _text_needle(item_id: str) -> bytes:
    """How a tool text record (`json.dumps({"id": ..., "text": ...})`) of `item_id` starts."""
    return b'{"id": ' + json.dumps(item_id).encode() + b","


def as_history(items: list[dict[str, Any]], texts: Mapping[str, str]) -> list[HistoryItem]:
    """Decoded stored items as the input of a turn that continues the conversation."""
    return [with_tool_text(_INPUT_ITEM.validate_python(item), texts) for item in items]


def builtin_ids(items: list[dict[str, Any]]) -> set[str]:
    """The ids of the built-in tool calls among `items`: those with a kept tool text."""
    return {item["id"] for item in items if item.get("type") in BUILTIN_ITEM_TYPES and isinstance(item.get("id"), str)}


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

    def __init__(self, store: Store, tenant: str, ttl_s: float, limits: ConversationLimits | None = None) -> None:
        self.tenant = tenant
        self.store = TenantStore(store, tenant)
        self.ttl_s = ttl_s
        self.limits = limits or ConversationLimits()

    async def create(self, metadata: dict[str, str] | None, items: list[HistoryItem]) -> Conversation:
        conversation = Conversation(id=new_id("conv"), object="conversation", created_at=int(time.time()), metadata=metadata or {})
        records = [item_record(i) for i in items]
        size = sum(map(len, records))
        if len(records) > self.limits.max_items or size > self.limits.max_bytes:
            raise conversation_full(conversation.id, self.limits, len(records), size, "items")
        await self.store.put(size_key(conversation.id), json.dumps([len(records), size]).encode(), ttl_s=self.ttl_s)
        if records:  # the items first: a conversation is never seen without the items it was created with
            await self.store.append(items_key(conversation.id), records, ttl_s=self.ttl_s)
        await self.store.put(conversation_key(conversation.id), conversation.model_dump_json().encode(), ttl_s=self.ttl_s)
        return conversation

    async def get(self, conversation_id: str) -> Conversation | None:
        data = await self.store.get(conversation_key(conversation_id))
        if data is None:
            return None
        await self.store.expire(
            [conversation_key(conversation_id), items_key(conversation_id), tool_texts_key(conversation_id), size_key(conversation_id)],
            self.ttl_s,
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
        await self.store.delete(size_key(conversation_id))
        return found

    # -- size and its bound --

    async def size(self, conversation_id: str) -> tuple[int, int]:
        """(items, bytes) of the conversation, from its size key (measured if absent)."""
        data = await self.store.get(size_key(conversation_id))
        if data is None:
            return await self._measure(conversation_id)
        items, size = json.loads(data)
        return int(items), int(size)

    async def _measure(self, conversation_id: str) -> tuple[int, int]:
        """The items and bytes of a conversation without a size key: its records' lengths, a
        slice at a time, none decoded."""
        items, size = 0, 0
        for key in (items_key(conversation_id), tool_texts_key(conversation_id)):
            length = await self.store.length(key)
            for start in range(0, length, SLICE):
                records = await self.store.range(key, start, start + SLICE)
                size += sum(map(len, records))
                if key == items_key(conversation_id):
                    items += len(records)
        return items, size

    async def check_room(self, conversation_id: str, items: list[Any], param: str = "conversation") -> None:
        """A 400 if appending `items` (ours or the SDK's) would pass the conversation's bound."""
        held, size = await self.size(conversation_id)
        added = sum(len(item_record(item)) for item in items)
        if held + len(items) > self.limits.max_items or size + added > self.limits.max_bytes:
            raise conversation_full(conversation_id, self.limits, held + len(items), size + added, param)

    async def _resize(self, conversation_id: str, items: int, size: int, *, enforce: bool, param: str) -> None:
        """Add (items, size) to the conversation's size; with `enforce`, refuse (a 400) what
        would pass its bound. Compare-and-set: concurrent appends each count."""
        key = size_key(conversation_id)
        for _ in range(_CAS_TRIES):
            data = await self.store.get(key)
            held, stored = (await self._measure(conversation_id)) if data is None else tuple(json.loads(data))
            new_items, new_size = max(held + items, 0), max(stored + size, 0)
            if enforce and items > 0 and (new_items > self.limits.max_items or new_size > self.limits.max_bytes):
                raise conversation_full(conversation_id, self.limits, new_items, new_size, param)
            if await self.store.compare_and_set(key, data, json.dumps([new_items, new_size]).encode(), ttl_s=self.ttl_s):
                return
        raise StoreUnavailable(f"Conversation '{conversation_id}' is being written by too many requests at once; retry later.")

    # -- writes --

    async def append(
        self,
        conversation_id: str,
        items: list[Any],
        tool_texts: Mapping[str, str] | None = None,
        *,
        enforce: bool = True,
        param: str = "items",
    ) -> list[dict[str, Any]]:
        """Append items (ours or the SDK's) atomically; the stored items as the API shows them.
        What the model read of the built-in tool calls among them (`tool_texts`, kept as a
        stored turn keeps them) is appended first: an item is never there before its text.
        With `enforce`, items that would pass the conversation's bound are a 400 and nothing
        is appended; without (a turn's input and output, once the turn was let in), they are
        appended and counted: the conversation's next append is refused."""
        records = [item_record(item) for item in items]
        kept = kept_tool_texts(items, tool_texts)
        texts = [json.dumps({"id": item_id, "text": text}).encode() for item_id, text in kept.items()]
        size = sum(map(len, records)) + sum(map(len, texts))
        await self._resize(conversation_id, len(records), size, enforce=enforce, param=param)
        try:
            if texts:
                await self.store.append(tool_texts_key(conversation_id), texts, ttl_s=self.ttl_s)
            if records:
                await self.store.append(items_key(conversation_id), records, ttl_s=self.ttl_s)
        except StoreUnavailable:
            with contextlib.suppress(StoreUnavailable):  # counted but not there: given back if the store lets us
                await self._resize(conversation_id, -len(records), -size, enforce=False, param=param)
            raise
        return [json.loads(r) for r in records]

    # -- reads --

    async def length(self, conversation_id: str) -> int:
        return await self.store.length(items_key(conversation_id))

    async def records(self, conversation_id: str, start: int = 0, stop: int | None = None) -> list[bytes]:
        """Stored items `start` up to `stop` (None: the end), undecoded."""
        return await self.store.range(items_key(conversation_id), start, stop)

    async def items(self, conversation_id: str) -> list[dict[str, Any]]:
        return decode_all(await self.records(conversation_id))

    async def tool_texts(self, conversation_id: str, ids: set[str]) -> dict[str, str]:
        """What the model read of the built-in tool calls `ids`: the texts are in the items'
        order, so they are searched newest first, a slice at a time, until all are found;
        only those that match are decoded."""
        found: dict[str, str] = {}
        if not ids:
            return found
        key = tool_texts_key(conversation_id)
        needles = {item_id: _text_needle(item_id) for item_id in ids}
        stop = await self.store.length(key)
        while stop > 0 and len(found) < len(ids):
            start = max(0, stop - SLICE)
            for record in reversed(await self.store.range(key, start, stop)):
                for item_id, needle in needles.items():
                    if item_id not in found and record.startswith(needle):
                        text = json.loads(record)
                        if text.get("id") == item_id:
                            found[item_id] = text["text"]
            stop = start
        return found

    async def history(self, conversation_id: str) -> list[HistoryItem]:
        """The conversation's items as the input of a request that continues it (its built-in
        tool calls with what the model read of them): all of them, on the caller's loop
        (runtime/run.py reads them in slices or off the loop)."""
        items = await self.items(conversation_id)
        return as_history(items, await self.tool_texts(conversation_id, builtin_ids(items)))

    async def _find(self, conversation_id: str, item_id: str, newest_first: bool) -> tuple[int, bytes, dict[str, Any]] | None:
        """The position, record and item of the item `item_id`: the records are searched a
        slice at a time from one end for its id, undecoded; only a record holding it is."""
        needle = _id_needle(item_id)
        length = await self.length(conversation_id)
        starts = range((length - 1) // SLICE * SLICE, -1, -SLICE) if newest_first else range(0, length, SLICE)
        for start in starts:
            records = await self.records(conversation_id, start, start + SLICE)
            indexes = range(len(records) - 1, -1, -1) if newest_first else range(len(records))
            for index in indexes:
                if needle in records[index] and (item := decode(records[index])).get("id") == item_id:
                    return start + index, records[index], item
        return None

    async def page(self, conversation_id: str, *, after: str | None, limit: int, order: Literal["asc", "desc"]) -> ItemPage | None:
        """Items after the one with id `after` in `order`; None if `after` is not an item.
        Decodes the page's items (and, with `after`, the record that holds its id)."""
        if order == "asc":
            start = 0
            if after is not None:
                found = await self._find(conversation_id, after, newest_first=False)
                if found is None:
                    return None
                start = found[0] + 1
            records = await self.records(conversation_id, start, start + limit + 1)
        else:
            if after is not None:
                found = await self._find(conversation_id, after, newest_first=True)
                if found is None:
                    return None
                stop = found[0]
            else:
                stop = await self.length(conversation_id)
            records = (await self.records(conversation_id, max(0, stop - limit - 1), stop))[::-1] if stop > 0 else []
        return ItemPage([decode(r) for r in records[:limit]], has_more=len(records) > limit)

    async def item(self, conversation_id: str, item_id: str) -> dict[str, Any] | None:
        found = await self._find(conversation_id, item_id, newest_first=True)
        return None if found is None else found[2]

    async def delete_item(self, conversation_id: str, item_id: str) -> bool:
        found = await self._find(conversation_id, item_id, newest_first=True)
        if found is None:
            return False
        _, record, _ = found
        removed = await self.store.remove(items_key(conversation_id), record)
        size = len(record)
        for text in await self.store.range(tool_texts_key(conversation_id)):  # its text goes with it
            ours = text.startswith(_text_needle(item_id)) and json.loads(text).get("id") == item_id
            if ours and await self.store.remove(tool_texts_key(conversation_id), text):
                size += len(text)
        if removed:
            await self._resize(conversation_id, -1, -size, enforce=False, param="item_id")
        return removed

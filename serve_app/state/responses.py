"""Stored responses: what `previous_response_id`, `GET /v1/responses/{id}`, `DELETE` and
`input_items` read, over any `Store`.

Each turn is stored once, under `response:{id}`, as one JSON value: the `Response`, the
turn's own input items (ids assigned), the id of the previous response, and what the model
read of each of its built-in tools' calls (`tool_texts`: a `web_search_call` or
`code_interpreter_call` item does not carry it; a later turn's prompt shows it, the API
never does). A conversation's history is rebuilt by walking that chain, so a chain of n
turns costs n records, not n² items. One key per turn, written in one `put`: a reader sees
a turn whole or not at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import cachetools
from openai.types.responses import (
    Response,
    ResponseCompactionItem,
    ResponseCustomToolCall,
    ResponseCustomToolCallItem,
    ResponseCustomToolCallOutputItem,
    ResponseFunctionToolCall,
    ResponseFunctionToolCallOutputItem,
    ResponseInputMessageItem,
    ResponseItem,
    ResponseOutputMessage,
    ResponseReasoningItem,
)
from openai.types.responses.response_function_tool_call_item import ResponseFunctionToolCallItem
from pydantic import TypeAdapter

from serve_app.api.errors import invalid_request, item_not_found
from serve_app.api.items import (
    HOSTED_ITEM_TYPES,
    CodeInterpreterCallItem,
    CompactionItem,
    ContentPart,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FilePart,
    FileSearchCallItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    HistoryItem,
    ImagePart,
    ItemReference,
    McpCallItem,
    MessageItem,
    ReasoningItem,
    ReasoningText,
    StoredInputItem,
    TextPart,
    WebSearchCallItem,
)
from serve_app.core.stream import item_id, new_id, response_of_item
from serve_app.core.utf8 import cap_text
from serve_app.state.store import Store
from serve_app.state.tenancy import TenantStore

DEFAULT_TTL_S = 30 * 24 * 3600.0  # OpenAI keeps stored responses for 30 days
DEFAULT_CACHE_BYTES = 32 * 1024 * 1024  # an ingress replica's `TurnCache`
# What is kept of the text the model read of one built-in tool call (the python tool's own
# default output cap, `max_output_bytes`; a browser page view is far smaller): more is cut.
MAX_KEPT_TOOL_TEXT_BYTES = 64 * 1024
FINISHED = ("completed", "incomplete", "failed", "cancelled")  # a response's final statuses

# What all of a request's item references may resolve to, in characters of their JSON: a
# stored item is up to `max_text_chars` and a request may name thousands (a request that
# sent them inline would be over its body limit first).
MAX_REFERENCED_CHARS = 4 * 1024 * 1024
BUILTIN_ITEM_TYPES = ("web_search_call", "code_interpreter_call", "file_search_call")  # the items whose tool text is kept

_INPUT_ITEM = TypeAdapter(StoredInputItem)
_RESPONSE_ITEM: TypeAdapter[ResponseItem] = TypeAdapter(ResponseItem)
_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "compaction": "cmp",
    "reasoning": "rs",
    "mcp_list_tools": "mcpl",
    "mcp_call": "mcp",
    "mcp_approval_request": "mcpr",
    "mcp_approval_response": "mcpa",
    "web_search_call": "ws",
    "code_interpreter_call": "ci",
    "file_search_call": "fs",
}


def response_key(response_id: str) -> str:
    return f"response:{response_id}"


@dataclass(frozen=True, slots=True)
class StoredTurn:
    response: Response
    input: list[HistoryItem]  # this turn's own input items, each with an id
    previous_response_id: str | None
    # What the model read of the response's built-in tool calls, by item id (never shown by the API).
    tool_texts: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, response: Response, input_items: list[HistoryItem], tool_texts: Mapping[str, str] | None = None) -> StoredTurn:
        """The turn of `response`, made from `input_items` (each given an id if it has none)
        and `tool_texts` (`ResponseStream.tool_texts`, each kept to `MAX_KEPT_TOOL_TEXT_BYTES`)."""
        return cls(
            response, with_ids(input_items, response.id), response.previous_response_id, kept_tool_texts(response.output, tool_texts)
        )

    def encode(self) -> bytes:
        record: dict[str, Any] = {
            "previous_response_id": self.previous_response_id,
            "input": [item.model_dump(mode="json", exclude_none=True) for item in self.input],
            "response": self.response.model_dump(mode="json", by_alias=True),
        }
        if self.tool_texts:
            record["tool_texts"] = dict(self.tool_texts)
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> StoredTurn:
        record = json.loads(data)
        return cls(
            response=Response.model_validate(record["response"]),
            input=[_INPUT_ITEM.validate_python(item) for item in record["input"]],
            previous_response_id=record["previous_response_id"],
            tool_texts=record.get("tool_texts", {}),
        )


def kept_tool_texts(items: Iterable[Any], tool_texts: Mapping[str, str] | None) -> dict[str, str]:
    """What is kept of `tool_texts`: those of the built-in tool items among `items` (a
    response's output), each cut to `MAX_KEPT_TOOL_TEXT_BYTES`."""
    if not tool_texts:
        return {}
    ids = {item.id for item in items if item.type in BUILTIN_ITEM_TYPES}
    return {item_id: cap_text(text, MAX_KEPT_TOOL_TEXT_BYTES) for item_id, text in tool_texts.items() if item_id in ids}


def with_ids(items: list[HistoryItem], response_id: str | None) -> list[HistoryItem]:
    """Items as stored: each one sent without an id gets one, of `response_id` for a turn's
    input (the API lists them by id; an `item_reference` finds them by it), else a new one."""

    def new(prefix: str, number: int) -> str:
        return item_id(prefix, response_id, number) if response_id is not None else new_id(prefix)

    return [item if item.id else item.model_copy(update={"id": new(_ID_PREFIX[item.type], number)}) for number, item in enumerate(items)]


def output_as_input(response: Response, tool_texts: Mapping[str, str] | None = None) -> list[HistoryItem]:
    """The response's output items in the form a client would send them back; with
    `tool_texts` (the tool loop within the response: `ResponseStream.tool_texts`; a later
    turn: the stored turn's), the built-in tools' items carry what the model read of them."""
    items: list[HistoryItem] = []
    for item in response.output:
        if isinstance(item, ResponseOutputMessage):
            text = "".join(getattr(part, "text", "") for part in item.content)
            items.append(MessageItem(role="assistant", content=text, id=item.id, phase=item.phase))
        elif isinstance(item, ResponseReasoningItem):
            content = [ReasoningText(text=part.text) for part in item.content or []]
            items.append(ReasoningItem(type="reasoning", id=item.id, content=content))
        elif isinstance(item, ResponseFunctionToolCall):
            items.append(
                FunctionCallItem(
                    type="function_call",
                    id=item.id,
                    call_id=item.call_id,
                    name=item.name,
                    namespace=item.namespace,
                    arguments=item.arguments,
                )
            )
        elif isinstance(item, ResponseCompactionItem):
            items.append(CompactionItem(type="compaction", id=item.id, encrypted_content=item.encrypted_content))
        elif isinstance(item, ResponseCustomToolCall):
            items.append(
                CustomToolCallItem(
                    type="custom_tool_call", id=item.id, call_id=item.call_id, name=item.name, namespace=item.namespace, input=item.input
                )
            )
        elif item.type in HOSTED_ITEM_TYPES:  # server-side tools' items: the same shape in and out
            items.append(with_tool_text(_INPUT_ITEM.validate_python(item.model_dump(mode="json", exclude_none=True)), tool_texts))
    return items


def with_tool_text(item: HistoryItem, tool_texts: Mapping[str, str] | None) -> HistoryItem:
    """A built-in tool's item with what the model read of it, if `tool_texts` has it."""
    if (
        isinstance(item, WebSearchCallItem | CodeInterpreterCallItem | FileSearchCallItem)
        and tool_texts
        and item.id
        and item.id in tool_texts
    ):
        item._model_text = tool_texts[item.id]
    return item


def _input_part(part: ContentPart) -> dict[str, Any]:
    """A content part of an input item as the API lists it: a file or an image as it was sent."""
    if isinstance(part, FilePart):
        return part.model_dump(exclude_none=True)
    if isinstance(part, ImagePart):
        return part.model_dump()
    return {"type": "input_text", "text": part.text if isinstance(part, TextPart) else part.refusal}


def as_response_item(item: HistoryItem) -> ResponseItem:
    """A stored input item as the API lists it (`ResponseItemList.data`)."""
    if isinstance(item, MessageItem):
        parts = item.content if isinstance(item.content, list) else [TextPart(type="input_text", text=item.content)]
        if item.role == "assistant":
            content = [
                {"type": "output_text", "text": p.text, "annotations": []} if isinstance(p, TextPart) else p.model_dump() for p in parts
            ]
            return ResponseOutputMessage(
                id=item.id, type="message", role="assistant", status="completed", content=content, phase=item.phase
            )
        content = [_input_part(p) for p in parts]
        return ResponseInputMessageItem(id=item.id, type="message", role=item.role, status="completed", content=content)
    if isinstance(item, FunctionCallItem):
        return ResponseFunctionToolCallItem(
            id=item.id,
            type="function_call",
            call_id=item.call_id,
            name=item.name,
            namespace=item.namespace,
            arguments=item.arguments,
            status="completed",
        )
    if isinstance(item, FunctionCallOutputItem):
        output: Any = item.output if isinstance(item.output, str) else [_input_part(p) for p in item.output]
        return ResponseFunctionToolCallOutputItem(
            id=item.id, type="function_call_output", call_id=item.call_id, output=output, status="completed"
        )
    if isinstance(item, CompactionItem):
        return ResponseCompactionItem(id=item.id or "", type="compaction", encrypted_content=item.encrypted_content)
    if isinstance(item, CustomToolCallItem):
        return ResponseCustomToolCallItem(
            id=item.id or "",
            type="custom_tool_call",
            call_id=item.call_id,
            name=item.name,
            namespace=item.namespace,
            input=item.input,
            status="completed",
        )
    if isinstance(item, CustomToolCallOutputItem):
        output = item.output if isinstance(item.output, str) else [_input_part(p) for p in item.output]
        return ResponseCustomToolCallOutputItem(
            id=item.id or "", type="custom_tool_call_output", call_id=item.call_id, output=output, status="completed"
        )
    if not isinstance(item, ReasoningItem):
        return _hosted_response_item(item)
    return ResponseReasoningItem(
        id=item.id,
        type="reasoning",
        summary=[s.model_dump() for s in item.summary],
        content=[c.model_dump() for c in item.content] if item.content is not None else None,
        encrypted_content=item.encrypted_content,
    )


def _hosted_response_item(item: HistoryItem) -> ResponseItem:
    """An item of a server-side tool sent as input, as the SDK types it (an older client's
    plain-text `mcp_call` error as the tool's error; a search without an action as one)."""
    record = item.model_dump(mode="json", exclude_none=True)
    if isinstance(item, McpCallItem) and isinstance(item.error, str):
        record["error"] = {"type": "mcp_tool_execution_error", "content": item.error}
    if isinstance(item, WebSearchCallItem) and item.action is None:
        record["action"] = {"type": "search", "query": ""}
    record.setdefault("status", "completed")
    if item.type == "file_search_call":
        record.setdefault("queries", [])
    if item.type == "code_interpreter_call":
        record.setdefault("container_id", "")
    if item.type in ("mcp_list_tools", "mcp_approval_request", "mcp_approval_response"):
        record.pop("status")
    for tool in record.get("tools", []) if item.type == "mcp_list_tools" else []:
        tool.setdefault("input_schema", {})  # the SDK's is required; a listed tool without one takes anything
    return _RESPONSE_ITEM.validate_python(record)


class TurnCache:
    """Finished turns a replica wrote or read, decoded, by response id: an LRU bounded by the
    bytes of their stored records (decoded, they take a few times that).

    A turn's record no longer changes once its response has finished (a background one is
    written again as it runs, so only finished ones are kept here); what can still happen to
    it is a deletion or its expiry, which `ResponseStore.chain` sees in its one batched
    `expire` call. So a conversation's next turn reads only the turns this replica has not
    seen, instead of its whole chain: one store read per turn, not one per earlier turn."""

    def __init__(self, max_bytes: int) -> None:
        # By (tenant, response id): a tenant reads only its own turns here, as in the store.
        self._turns: cachetools.LRUCache[tuple[str, str], tuple[StoredTurn, int]] = cachetools.LRUCache(
            max_bytes, getsizeof=lambda entry: entry[1]
        )

    def get(self, tenant: str, response_id: str) -> StoredTurn | None:
        entry = self._turns.get((tenant, response_id))
        return None if entry is None else entry[0]

    def put(self, tenant: str, turn: StoredTurn, size: int) -> None:
        if turn.response.status in FINISHED and size <= self._turns.maxsize:
            self._turns[(tenant, turn.response.id)] = (turn, size)

    def pop(self, tenant: str, response_id: str) -> None:
        self._turns.pop((tenant, response_id), None)

    def __len__(self) -> int:
        return len(self._turns)


class ResponseStore:
    """One tenant's stored responses over a `Store` (its keys under the tenant's prefix):
    one record per turn, chained. `cache`: the replica's finished turns, for reading chains
    (None: every read is a store read)."""

    def __init__(self, store: Store, tenant: str, ttl_s: float = DEFAULT_TTL_S, cache: TurnCache | None = None) -> None:
        self.base = store
        self.tenant = tenant
        self.store = TenantStore(store, tenant)
        self.ttl_s = ttl_s
        self.cache = cache

    async def save(self, response: Response, input_items: list[HistoryItem], tool_texts: Mapping[str, str] | None = None) -> StoredTurn:
        """Store (or replace) a turn: the response, this turn's own input items and what the
        model read of its built-in tool calls (`StoredTurn.tool_texts`)."""
        turn = StoredTurn.of(response, input_items, tool_texts)
        data = turn.encode()
        await self.store.put(response_key(response.id), data, ttl_s=self.ttl_s)
        if self.cache is not None:
            self.cache.put(self.tenant, turn, len(data))
        return turn

    async def get(self, response_id: str) -> StoredTurn | None:
        """The stored turn, read from the store (what a GET shows: never a cached copy; a
        finished one read is cached for the chains that reach it)."""
        data = await self.store.get(response_key(response_id))
        if data is None:
            return None
        turn = StoredTurn.decode(data)
        if self.cache is not None:
            self.cache.put(self.tenant, turn, len(data))
        return turn

    async def delete(self, response_id: str) -> bool:
        if self.cache is not None:
            self.cache.pop(self.tenant, response_id)
        return await self.store.delete(response_key(response_id))

    async def _read(self, response_id: str) -> StoredTurn | None:
        """A turn of a chain: from the cache, else from the store (and then cached)."""
        cached = self.cache.get(self.tenant, response_id) if self.cache is not None else None
        return cached if cached is not None else await self.get(response_id)

    async def chain(self, response_id: str) -> list[StoredTurn] | None:
        """The turns from the first of the conversation to `response_id`, oldest first; None
        if any of them is gone (deleted or expired): a history with a hole is no history.
        Reading a chain gives its records a fresh TTL, so a live conversation keeps its past."""
        turns: list[StoredTurn] = []
        seen: set[str] = set()
        next_id: str | None = response_id
        while next_id is not None:  # a store read per turn the cache does not hold
            turn = await self._read(next_id)
            if turn is None or next_id in seen:
                return None
            seen.add(next_id)
            turns.append(turn)
            next_id = turn.previous_response_id
        turns.reverse()
        if not await self._still_stored([turn.response.id for turn in turns]):
            return None
        return turns

    async def _still_stored(self, response_ids: list[str]) -> bool:
        """Whether every one of these responses is still in the store (their TTL refreshed:
        reading a conversation keeps its past); if one went (deleted, expired) since a replica
        cached it, none of them stays in this replica's cache."""
        if await self.store.expire([response_key(response_id) for response_id in response_ids], self.ttl_s) == len(response_ids):
            return True
        if self.cache is not None:
            for response_id in response_ids:
                self.cache.pop(self.tenant, response_id)
        return False

    async def history(self, previous_response_id: str) -> list[HistoryItem]:
        """Every item of the conversation up to and including `previous_response_id`'s output:
        the history a follow-up request continues. A 400 if it cannot be rebuilt whole."""
        turns = await self.chain(previous_response_id)
        if turns is None:
            raise invalid_request(
                f"Previous response with id '{previous_response_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        if turns[-1].response.status in ("queued", "in_progress"):
            raise invalid_request(
                f"Previous response with id '{previous_response_id}' has not finished yet.",
                param="previous_response_id",
            )
        items: list[HistoryItem] = []
        for turn in turns:
            items += turn.input
            items += output_as_input(turn.response, turn.tool_texts)
        return items

    async def resolve(self, items: list[HistoryItem | ItemReference], *, stored: bool) -> list[HistoryItem]:
        """`items` with each `item_reference` replaced by the item it names: an output or input
        item of one of this tenant's stored responses, as a later turn's input shows it. Each
        response named is read once (its replica's cache, checked against the store as a chain
        is: a deleted one is gone here too). A 404 naming the item otherwise (another tenant's,
        deleted, expired, never stored: `stored` says whether this request stores its own, for
        OpenAI's hint); a 400 for an item referenced twice, or for references that together
        hold more than `MAX_REFERENCED_CHARS` (what a request may not hold inline either)."""
        references = [(index, item) for index, item in enumerate(items) if isinstance(item, ItemReference)]
        if not references:
            return cast(list[HistoryItem], items)
        seen: set[str] = set()
        for index, reference in references:
            if reference.id in seen:
                raise invalid_request(f"Item with id '{reference.id}' is referenced more than once.", param=f"input[{index}]")
            seen.add(reference.id)
        named = {response_id for _, reference in references if (response_id := response_of_item(reference.id)) is not None}
        found = await self._referenced(named)
        resolved: list[HistoryItem] = []
        chars = 0
        for index, item in enumerate(items):
            if not isinstance(item, ItemReference):
                resolved.append(item)
                continue
            target = found.get(item.id)
            if target is None:
                raise item_not_found(item.id, index=index, stored=stored)
            chars += len(target.model_dump_json())
            if chars > MAX_REFERENCED_CHARS:
                raise invalid_request(
                    f"The items referenced in input hold more than {MAX_REFERENCED_CHARS} characters; send fewer.",
                    param=f"input[{index}]",
                    code="string_above_max_length",
                )
            resolved.append(target)
        return resolved

    async def _referenced(self, response_ids: set[str]) -> dict[str, HistoryItem]:
        """The items of these stored responses by id (those still stored: a turn a replica
        cached but the store no longer has is read again, and so found gone)."""
        turns = {response_id: await self._read(response_id) for response_id in response_ids}
        present = [response_id for response_id, turn in turns.items() if turn is not None]
        if present and not await self._still_stored(present):
            turns = {response_id: await self.get(response_id) for response_id in turns}
        items: dict[str, HistoryItem] = {}
        for turn in turns.values():
            if turn is not None:
                items.update((item.id, item) for item in turn.input + output_as_input(turn.response, turn.tool_texts) if item.id)
        return items

    async def input_items(self, response_id: str) -> list[ResponseItem] | None:
        """What the model saw for `response_id`, oldest first (earlier turns' inputs and
        outputs, then its own input); None if the response or part of its chain is gone."""
        turns = await self.chain(response_id)
        if turns is None:
            return None
        items: list[ResponseItem] = []
        for turn in turns[:-1]:
            items += [as_response_item(item) for item in turn.input]
            items += cast(list[ResponseItem], turn.response.output)  # output items are response items too
        items += [as_response_item(item) for item in turns[-1].input]
        return items

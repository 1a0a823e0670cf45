"""Server-sent events framed exactly as the OpenAI API frames them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent

_PREFIX: dict[str, bytes] = {}  # event type -> b"event: <type>\ndata: "

# Where the API's wire differs from the SDK's types (which are looser): the response's
# timestamps are integers (the SDK's `float` writes `1795867385.0`), and a reasoning item
# without `encrypted_content` leaves it out (optional, never null). Only the events that
# carry a response or an item pay for the fix; deltas go straight to JSON.
_WITH_RESPONSE = frozenset(
    f"response.{kind}" for kind in ("created", "queued", "in_progress", "completed", "incomplete", "failed", "cancelled")
)
_WITH_ITEM = frozenset(("response.output_item.added", "response.output_item.done"))


def _wire_item(item: dict[str, Any]) -> dict[str, Any]:
    if item.get("type") == "reasoning" and item.get("encrypted_content", "") is None:
        del item["encrypted_content"]
    return item


def _wire_response(response: dict[str, Any]) -> dict[str, Any]:
    for name in ("created_at", "completed_at"):
        if isinstance(response.get(name), float):
            response[name] = int(response[name])
    for item in response.get("output") or ():
        _wire_item(item)
    return response


def _dumps(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def response_json(response: Response) -> bytes:
    """A response object as the API sends it (GET, a non-streamed answer)."""
    return _dumps(_wire_response(response.model_dump(mode="json", by_alias=True)))


def event_json(event: ResponseStreamEvent) -> bytes:
    """An event as the API sends it: every field of the SDK model (optional ones as null, but
    for the wire's own rules above)."""
    # by_alias: the SDK names fields `schema_` / `async_` whose wire names are `schema` / `async`.
    if event.type in _WITH_RESPONSE:
        data = event.model_dump(mode="json", by_alias=True)
        data["response"] = _wire_response(data["response"])
        return _dumps(data)
    if event.type in _WITH_ITEM and event.item.type == "reasoning":  # type: ignore[union-attr]
        data = event.model_dump(mode="json", by_alias=True)
        data["item"] = _wire_item(data["item"])
        return _dumps(data)
    return event.__pydantic_serializer__.to_json(event, by_alias=True)


# Two dialects, one stream: OpenAI's event names (the default: the `openai` SDK, the Agents
# SDK and Codex read them) and Open Responses' (openresponses.org), which names OpenAI's
# `response.reasoning_text.delta` / `.done` `response.reasoning.delta` / `.done`. A request
# that carries the spec's version header gets the spec's names, in every event of its stream
# (SSE or WebSocket, a background response followed too); nothing else differs.
OPEN_RESPONSES_HEADER = "openresponses-version"
_OPENAI_EVENT_LINE, _SPEC_EVENT_LINE = b"event: response.reasoning_text.", b"event: response.reasoning."


def in_open_responses_dialect(data: bytes) -> bytes:
    """Framed events (or one event's JSON) in Open Responses' names. Only the event's own
    names change, never text: a JSON string escapes its quotes and newlines, so
    `"type":"response.reasoning_text.` is only ever an event's type, and an `event:` line
    starts a chunk or follows the blank line that ends the frame before it."""
    renamed = data.replace(b'"type":"response.reasoning_text.', b'"type":"response.reasoning.')
    renamed = renamed.replace(b"\n\n" + _OPENAI_EVENT_LINE, b"\n\n" + _SPEC_EVENT_LINE)
    if renamed.startswith(_OPENAI_EVENT_LINE):
        renamed = _SPEC_EVENT_LINE + renamed[len(_OPENAI_EVENT_LINE) :]
    return renamed


def frame(event: ResponseStreamEvent) -> bytes:
    """One event, framed: what a background response's event log stores per event."""
    prefix = _PREFIX.get(event.type)
    if prefix is None:
        prefix = _PREFIX[event.type] = b"event: " + event.type.encode() + b"\ndata: "
    return prefix + event_json(event) + b"\n\n"


def encode_events(events: Sequence[ResponseStreamEvent]) -> bytes:
    """All events of one token batch as one chunk (one write, one Ray hop), each framed
    `event: <type>\\ndata: <json>\\n\\n` with every field of the SDK model included (as the
    OpenAI API does, optional fields are sent as null)."""
    if len(events) == 1:  # most batches: one delta event
        return frame(events[0])
    return b"".join(map(frame, events))

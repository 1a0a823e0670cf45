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
    return _line_separators_escaped(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())


# U+2028, U+2029 and U+0085 are valid raw in JSON strings, but some line readers (httpx's
# iter_lines, so httpx-sse) split lines on them: a model writing "\u2028event: ..." would
# forge an event line for such a client. Escaped, they can only be text.
_LINE_SEPARATORS = tuple((character.encode(), f"\\u{ord(character):04x}".encode()) for character in ("\u2028", "\u2029", "\u0085"))


def _line_separators_escaped(data: bytes) -> bytes:
    for raw, escaped in _LINE_SEPARATORS:
        if raw in data:
            data = data.replace(raw, escaped)
    return data


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
    return _line_separators_escaped(event.__pydantic_serializer__.to_json(event, by_alias=True))


# Two dialects, one stream: OpenAI's event names (the default: the `openai` SDK, the Agents
# SDK and Codex read them) and Open Responses' (openresponses.org), which names OpenAI's
# `response.reasoning_text.delta` / `.done` `response.reasoning.delta` / `.done`. A request
# that carries the spec's version header gets the spec's names, in every event of its stream
# (SSE or WebSocket, a background response followed too); nothing else differs.
OPEN_RESPONSES_HEADER = "openresponses-version"
_OPENAI_EVENT_LINE, _SPEC_EVENT_LINE = b"event: response.reasoning_text.", b"event: response.reasoning."


def in_open_responses_dialect(chunk: bytes) -> bytes:
    """SSE frames in Open Responses' names: only the reasoning text events' own event line and
    type change, never text or a client's values (a metadata value may read like a type)."""
    if _OPENAI_EVENT_LINE not in chunk:
        return chunk
    frames = chunk.split(b"\n\n")  # a frame never holds a blank line: JSON escapes newlines
    return b"\n\n".join(_renamed_frame(frame) if frame.startswith(_OPENAI_EVENT_LINE) else frame for frame in frames)


def _renamed_frame(frame: bytes) -> bytes:
    head, separator, data = frame.partition(b"\ndata: ")
    return _SPEC_EVENT_LINE + head[len(_OPENAI_EVENT_LINE) :] + separator + renamed_type(data)


def renamed_type(event_json: bytes) -> bytes:
    """A reasoning text event's JSON in Open Responses' name: its only unescaped
    `"type":"` is its own (its other strings are text, which JSON escapes)."""
    return event_json.replace(_OPENAI_TYPE, _SPEC_TYPE, 1)


_OPENAI_TYPE, _SPEC_TYPE = b'"type":"response.reasoning_text.', b'"type":"response.reasoning.'


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

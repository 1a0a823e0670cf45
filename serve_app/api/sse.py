"""Server-sent events framed exactly as the OpenAI API frames them."""

from __future__ import annotations

from collections.abc import Sequence

from openai.types.responses import ResponseStreamEvent

_PREFIX: dict[str, bytes] = {}  # event type -> b"event: <type>\ndata: "


def event_json(event: ResponseStreamEvent) -> bytes:
    """An event as the API sends it: every field of the SDK model (optional ones as null)."""
    # by_alias: the SDK names fields `schema_` / `async_` whose wire names are `schema` / `async`.
    return event.__pydantic_serializer__.to_json(event, by_alias=True)


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

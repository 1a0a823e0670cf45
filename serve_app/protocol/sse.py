"""Server-sent events framed exactly as the OpenAI API frames them."""

from __future__ import annotations

from typing import Iterable

from openai.types.responses import ResponseStreamEvent

_PREFIX: dict[str, bytes] = {}  # event type -> b"event: <type>\ndata: "


def encode_events(events: Iterable[ResponseStreamEvent]) -> bytes:
    """All events of one token batch as one chunk (one write, one Ray hop), each framed
    `event: <type>\\ndata: <json>\\n\\n` with every field of the SDK model included (as the
    OpenAI API does, optional fields are sent as null)."""
    parts: list[bytes] = []
    for event in events:
        prefix = _PREFIX.get(event.type)
        if prefix is None:
            prefix = _PREFIX[event.type] = b"event: " + event.type.encode() + b"\ndata: "
        parts += (prefix, event.__pydantic_serializer__.to_json(event), b"\n\n")
    return b"".join(parts)

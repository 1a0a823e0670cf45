"""Server-sent events framed exactly as the OpenAI API frames them."""

from __future__ import annotations

from typing import Iterable

from openai.types.responses import ResponseStreamEvent


def encode_event(event: ResponseStreamEvent) -> bytes:
    """`event: <type>\\ndata: <json>\\n\\n`, every field of the SDK model included (as the
    OpenAI API does, optional fields are sent as null)."""
    data = event.__pydantic_serializer__.to_json(event)
    return b"event: " + event.type.encode() + b"\ndata: " + data + b"\n\n"


def encode_events(events: Iterable[ResponseStreamEvent]) -> bytes:
    """All events of one token batch as one chunk: one write, one Ray hop."""
    return b"".join(map(encode_event, events))

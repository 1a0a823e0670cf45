"""The Responses API over a WebSocket (the SDK's `client.responses.connect()`): client events
in, server messages out. Pure: no ASGI, no state (the connection lives in
serve_app/server/routes/websocket.py).

A client sends `response.create`: the body of `POST /v1/responses` (streaming is implicit;
`background` is refused), plus `stream_id`, a lane (creates on one lane run one after the
other, lanes run side by side), and `generate: false`, a warm-up that renders the prompt and
answers an empty completed response to chain from. `response.steer` is not served: it is
answered `response.steer.failed` (`steering_not_supported`) with its input, for the client to
send in its next `response.create`. The server answers with the events `POST /v1/responses`
streams, one text message each, carrying the lane's `stream_id`; a request refused before its
response starts is an `error` event with the HTTP status it would have had.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from openai.types.responses import ResponseSteerFailedEvent, ResponseStreamEvent
from pydantic import ValidationError

from serve_app.api.errors import APIError, invalid_request
from serve_app.api.limits import DEFAULT_LIMITS, RequestLimits, check_id, decode_json
from serve_app.api.request import ResponsesRequest, parse_request
from serve_app.api.sse import event_json, renamed_type

# Fields of `response.create` that are about the socket, not the response.
_ENVELOPE = ("type", "stream_id", "generate", "stream")


@dataclass(frozen=True, slots=True)
class CreateEvent:
    """A `response.create`: its request, or why it cannot be served (answered on its lane, in
    order, so that an error never lands among the events of the response before it)."""

    lane: str | None
    request: ResponsesRequest | None
    error: APIError | None = None
    generate: bool = True


@dataclass(frozen=True, slots=True)
class SteerEvent:
    lane: str | None
    input: Any
    previous_response_id: Any


def parse_client_event(message: str | bytes, limits: RequestLimits = DEFAULT_LIMITS) -> CreateEvent | SteerEvent:
    """One client message -> its event; an `APIError` when the message itself is unusable (not
    a JSON object, no known `type`, a `stream_id` that is not a string). Strict JSON, and
    requests within `limits`, as over HTTP."""
    data = decode_json(message, "We could not parse the message as JSON: {}. Each message is a client event, a JSON object.")
    if not isinstance(data, dict):
        raise invalid_request("Each message is a client event, a JSON object.", code="invalid_type")
    kind = data.get("type")
    lane = data.get("stream_id")
    if lane is not None and not isinstance(lane, str):
        raise invalid_request("'stream_id' must be a string.", param="stream_id", code="invalid_type")
    check_id(lane, "stream_id", limits)
    if kind == "response.steer":
        return SteerEvent(lane, data.get("input"), data.get("previous_response_id"))
    if kind != "response.create":
        raise invalid_request(
            f"Unknown client event type {kind!r}: send 'response.create' (or 'response.steer').", param="type", code="unknown_event_type"
        )
    generate = data.get("generate", True)
    try:
        if not isinstance(generate, bool):
            raise invalid_request("'generate' must be a boolean.", param="generate", code="invalid_type")
        if data.get("background"):
            raise invalid_request(
                "Background responses are not supported over a WebSocket: use POST /v1/responses with 'background': true.",
                param="background",
                code="unsupported_parameter",
            )
        request = parse_request({key: value for key, value in data.items() if key not in _ENVELOPE}, limits)
    except APIError as error:
        return CreateEvent(lane, None, error)
    return CreateEvent(lane, request.model_copy(update={"stream": True}), generate=generate)


def event_message(event: ResponseStreamEvent, lane: str | None, *, open_responses: bool = False) -> str:
    """A response event as its own message: the SSE data of `POST /v1/responses`, with the
    lane's `stream_id` first when the create named one (in Open Responses' names if asked)."""
    data = event_json(event)
    if open_responses and event.type.startswith("response.reasoning_text."):
        data = renamed_type(data)
    if lane is not None:
        data = b'{"stream_id":' + json.dumps(lane).encode() + b"," + data[1:]
    return data.decode()


def error_message(error: APIError, lane: str | None) -> str:
    """A request refused before its response started: what the HTTP API answers, with its
    status, as an `error` event."""
    message: dict[str, Any] = {"type": "error", "status": error.status_code, **error.body()}
    if lane is not None:
        message["stream_id"] = lane
    return json.dumps(message, separators=(",", ":"))


def steer_failed_message(steer: SteerEvent) -> str:
    """`response.steer` is not served: its input comes back, uncommitted."""
    try:
        event = ResponseSteerFailedEvent(
            type="response.steer.failed",
            sequence_number=0,
            error={
                "type": "invalid_request_error",
                "code": "steering_not_supported",
                "message": "This server does not steer responses: send the input in your next 'response.create'.",
            },
            steer={"input": steer.input, "previous_response_id": steer.previous_response_id},
        )
    except ValidationError:
        return error_message(invalid_request("'response.steer' needs 'input' and 'previous_response_id'.", param="input"), steer.lane)
    return event.model_dump_json(exclude_none=True)

"""Conformance to the Open Responses specification (2026-04-24), checked against its own
schemas: the spec's OpenAPI document is vendored in tests/data/openresponses/openapi.json and
every object the server writes is validated with JSON Schema (Draft 2020-12) against the
schema the spec gives it: a non-streamed response against `ResponseResource`; each streamed
event, over SSE and over WebSocket (a client sending `OpenResponses-Version`), against the
event schema its `type` names in the spec's `text/event-stream` `oneOf`. The requests sent are
checked against the spec's request schemas first, so a failure is the server's, not the test's.
A known gap is an `xfail(strict=True)` naming it: it turns red the day the gap is closed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from websockets.sync.client import connect

from tests.support.contract import parse_sse

SPEC = json.loads((Path(__file__).parent.parent / "data" / "openresponses" / "openapi.json").read_text(encoding="utf-8"))
SPEC_URI = "urn:openresponses:openapi"
REGISTRY = Registry().with_resource(SPEC_URI, Resource.from_contents(SPEC, default_specification=DRAFT202012))
HEADER = {"OpenResponses-Version": "latest"}
MODELS = ["gpt-oss-replay", "qwen3-replay"]
TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
JSON_FORMAT = {
    "type": "json_schema",
    "name": "answer",
    "schema": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False},
    "strict": True,
}


def schema_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": f"{SPEC_URI}#/components/schemas/{name}"}, registry=REGISTRY)


# The streamed events: each schema of the spec's `oneOf`, by the one `type` its enum allows.
_STREAM = SPEC["paths"]["/responses"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
EVENT_SCHEMAS = {
    event_type: schema_name(branch["$ref"])
    for branch in _STREAM["oneOf"]
    for event_type in SPEC["components"]["schemas"][schema_name(branch["$ref"])]["properties"]["type"]["enum"]
}


def deepest(error: ValidationError) -> ValidationError:
    """Into a `oneOf`/`anyOf`, the branch the instance's `type` chose (the spec's discriminator)."""
    while error.context:
        wrong = {
            e.relative_schema_path[0]
            for e in error.context
            if list(e.relative_path) == ["type"] or (e.validator == "type" and not e.relative_path)
        }
        chosen = [e for e in error.context if e.relative_schema_path[0] not in wrong]
        if not chosen:
            break
        error = chosen[0]
    return error


def problems(name: str, instance: dict) -> list[str]:
    """Each way `instance` breaks schema `name`: where, and what the spec wants there."""
    return [f"{name} at {(e := deepest(error)).json_path}: {e.message[:160]}" for error in validator(name).iter_errors(instance)]


def event_problems(event: dict) -> list[str]:
    if event.get("type") not in EVENT_SCHEMAS:
        return [f"event type {event.get('type')!r} is not one of the spec's streaming events"]
    return problems(EVENT_SCHEMAS[event["type"]], event)


def assert_valid(found: list[str]) -> None:
    assert not found, "\n".join(sorted(set(found)))


# The requests of each case, one turn at a time: `send` takes a request body and returns the
# response object it made (the non-streamed one, or the one the stream's last event carries).
def run_case(case: str, model: str, send: Callable[[dict], dict]) -> None:
    body = {"model": model, "input": "hi"}
    if case == "text":
        send(body)
    elif case == "instructions":
        send({**body, "instructions": "You are a terse assistant."})
    elif case == "reasoning":
        send({**body, "reasoning": {"effort": "low", "summary": "auto"}})
    elif case == "incomplete":
        send({**body, "input": "write a long story", "max_output_tokens": 16})
    elif case == "allowed_tools":
        send(
            {
                **body,
                "tools": [WEATHER],
                "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_weather"}]},
            }
        )
    elif case == "json_schema":
        send({**body, "text": {"format": JSON_FORMAT}})
    elif case == "previous_response_id":
        first = send(body)
        send({**body, "input": "and again", "previous_response_id": first["id"]})
    elif case in ("function_call", "function_call_output"):
        first = send({**body, "input": 'call get_weather {"city": "Paris"}', "tools": [WEATHER]})
        (call,) = [item for item in first["output"] if item["type"] == "function_call"]
        if case == "function_call_output":
            output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
            send({**body, "input": [output], "tools": [WEATHER], "previous_response_id": first["id"]})
    else:
        raise AssertionError(case)


# The spec's `JsonSchemaResponseFormat` (the `text.format` a response reports) has `"schema":
# {"type": "null"}`, while its request twin takes the JSON Schema object: we echo the schema
# sent, as OpenAI does. The spec's own inconsistency, kept visible here.
SCHEMA_IS_NULL = pytest.mark.xfail(
    strict=True,
    reason="ResponseResource.text.format (JsonSchemaResponseFormat): the spec wants `schema` null; "
    "we echo the JSON Schema object the request sent in text.format.schema, as OpenAI does",
)
CASES = [
    "text",
    "instructions",
    "reasoning",
    "incomplete",
    "previous_response_id",
    "function_call",
    "function_call_output",
    "allowed_tools",
    pytest.param("json_schema", marks=SCHEMA_IS_NULL),
]


def test_the_vendored_spec_maps_every_streaming_event():
    assert SPEC["info"]["version"] == "2026-04-24"
    assert len(EVENT_SCHEMAS) == len(_STREAM["oneOf"]) == 24
    assert EVENT_SCHEMAS["response.completed"] == "ResponseCompletedStreamingEvent"
    assert not problems("CreateResponseBody", {"model": "m", "input": "hi", "tools": [WEATHER]})
    assert problems("ResponseResource", {"object": "response"})  # the validator can fail


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("model", MODELS)
def test_a_response_is_a_response_resource(inprocess_url, model, case):
    found: list[str] = []

    def send(body: dict) -> dict:
        assert_valid(problems("CreateResponseBody", body))
        answer = http.post(f"{inprocess_url}/responses", json=body)
        assert answer.status_code == 200, answer.text
        found.extend(problems("ResponseResource", answer.json()))
        return answer.json()

    with httpx.Client(timeout=60) as http:
        run_case(case, model, send)
    assert_valid(found)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("model", MODELS)
def test_every_sse_event_is_its_streaming_event(inprocess_url, model, case):
    found: list[str] = []

    def send(body: dict) -> dict:
        body = {**body, "stream": True}
        assert_valid(problems("CreateResponseBody", body))
        answer = http.post(f"{inprocess_url}/responses", json=body, headers=HEADER)
        assert answer.status_code == 200, answer.text
        events = parse_sse(answer.content)
        assert events[-1]["type"] in TERMINAL - {"error"}, events[-1]
        found.extend(problem for event in events for problem in event_problems(event))
        return events[-1]["response"]

    with httpx.Client(timeout=60) as http:
        run_case(case, model, send)
    assert_valid(found)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("model", MODELS)
def test_every_websocket_event_is_its_streaming_event(inprocess_url, model, case):
    found: list[str] = []

    def send(body: dict) -> dict:
        message = {"type": "response.create", **body}
        assert_valid(problems("WebSocketResponseCreateEvent", message))
        socket.send(json.dumps(message))
        events = [json.loads(socket.recv(timeout=30))]
        while events[-1]["type"] not in TERMINAL:
            events.append(json.loads(socket.recv(timeout=30)))
        assert events[-1]["type"] in TERMINAL - {"error"}, events[-1]
        found.extend(problem for event in events for problem in event_problems(event))
        return events[-1]["response"]

    with connect(inprocess_url.replace("http://", "ws://") + "/responses", additional_headers=HEADER) as socket:
        run_case(case, model, send)
    assert_valid(found)


def test_the_check_finds_what_is_missing_deep_inside(inprocess_url):
    """The validator follows the spec's `$ref`s and discriminated unions down to the field."""
    with httpx.Client(timeout=60) as http:
        body = {"model": "gpt-oss-replay", "input": 'call get_weather {"city": "Paris"}', "tools": [WEATHER]}
        answer = http.post(f"{inprocess_url}/responses", json=body).json()
    assert not problems("ResponseResource", answer)
    call = answer["output"].index(next(item for item in answer["output"] if item["type"] == "function_call"))
    del answer["output"][call]["call_id"]
    answer["usage"]["input_tokens_details"] = {}
    assert problems("ResponseResource", answer) == [
        f"ResponseResource at $.output[{call}]: 'call_id' is a required property",
        "ResponseResource at $.usage.input_tokens_details: 'cached_tokens' is a required property",
    ]


@pytest.mark.parametrize(
    "message",
    [
        {"type": "response.create", "model": "no-such-model", "input": "hi"},
        {"type": "response.create", "input": "hi"},
        {"type": "no.such.event"},
    ],
)
def test_a_websocket_failure_is_a_websocket_error_event(inprocess_url, message):
    with connect(inprocess_url.replace("http://", "ws://") + "/responses", additional_headers=HEADER) as socket:
        socket.send(json.dumps(message))
        event = json.loads(socket.recv(timeout=30))
    assert event["type"] == "error"
    assert_valid(problems("WebSocketErrorEvent", event))


PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
MEDIA_PARTS = {
    "input_image": {"type": "input_image", "image_url": PNG},
    "input_file": {"type": "input_file", "filename": "note.txt", "file_data": "data:text/plain;base64,aGVsbG8="},
}


@pytest.mark.parametrize(
    ("part", "model"),
    [
        pytest.param("input_image", "qwen3-vl-replay"),  # a vision model: text-only models answer images with a 400
        pytest.param("input_file", "gpt-oss-replay"),  # read into the prompt as text (runtime/files.py)
    ],
)
def test_a_user_message_with_media_content(inprocess_url, part, model):
    content = [{"type": "input_text", "text": "what is this?"}, MEDIA_PARTS[part]]
    body = {"model": model, "input": [{"type": "message", "role": "user", "content": content}]}
    assert_valid(problems("CreateResponseBody", body))
    with httpx.Client(timeout=60) as http:
        answer = http.post(f"{inprocess_url}/responses", json=body)
    assert answer.status_code == 200, answer.text
    assert_valid(problems("ResponseResource", answer.json()))


@pytest.mark.parametrize("model", MODELS)
def test_compact_returns_a_compact_resource(inprocess_url, model):
    body = {"model": model, "input": "hi"}
    assert_valid(problems("CompactResponseMethodPublicBody", body))
    with httpx.Client(timeout=60) as http:
        answer = http.post(f"{inprocess_url}/responses/compact", json=body)
    assert answer.status_code == 200, answer.text
    assert_valid(problems("CompactResource", answer.json()))

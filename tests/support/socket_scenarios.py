"""`/v1/responses` over a WebSocket, from the client side: the official SDK's
`client.responses.connect()` and a plain `websockets` client for what the SDK would not send.
Shared by the in-process suite (tests/server/test_websocket.py) and the Ray Serve one
(tests/deployments/test_serve_e2e.py): the same assertions whichever stack serves the app."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
from openai.types.responses import ResponsesServerEvent
from pydantic import TypeAdapter
from websockets.sync.client import ClientConnection, connect

from tests.support.contract import TERMINAL, check_stream
from tests.support.sdk_scenarios import MODEL, WEATHER_TOOL, output_texts, raw_stream

SERVER_EVENT = TypeAdapter(ResponsesServerEvent)
ENDS = TERMINAL | {"error"}


def socket_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://", 1) + "/responses"


@contextmanager
def socket(base_url: str, headers: dict[str, str] | None = None) -> Iterator[ClientConnection]:
    with connect(socket_url(base_url), additional_headers=headers, open_timeout=30, max_size=None) as connection:
        yield connection


def receive(connection: ClientConnection) -> dict[str, Any]:
    """One server message: a text message, valid as one of the SDK's server events."""
    message = connection.recv(timeout=60)
    assert isinstance(message, str), "server events come as text messages"
    SERVER_EVENT.validate_json(message)
    return json.loads(message)


def create(connection: ClientConnection, **body: Any) -> None:
    connection.send(json.dumps({"type": "response.create", **body}))


def until_end(connection: ClientConnection) -> list[dict[str, Any]]:
    """The messages of one response (or one error), in order."""
    events = [receive(connection)]
    while events[-1]["type"] not in ENDS:
        events.append(receive(connection))
    return events


def response_events(events: list[dict[str, Any]], lane: str | None = None) -> list[dict[str, Any]]:
    """Events of a response as `POST /v1/responses` streams them: each carries the lane it was
    created on (only when it named one); without it, the contract holds."""
    for event in events:
        assert event.get("stream_id") == lane, (event.get("stream_id"), lane)
    events = [{k: v for k, v in event.items() if k != "stream_id"} for event in events]
    check_stream(events)
    return events


def shape(events: list[dict[str, Any]]) -> list[str]:
    """Event types up to delta boundaries (engine steps differ between two runs)."""
    types = [event["type"] for event in events]
    return [t for i, t in enumerate(types) if not (t.endswith(".delta") and i and types[i - 1] == t)]


# --- scenarios -------------------------------------------------------------------------------


def same_events_as_http(base_url: str, model: str = MODEL) -> None:
    """A response over the socket is the response `POST /v1/responses` streams: the same
    events (up to delta boundaries) and output, whatever the request."""
    bodies = [
        {"model": model, "input": "Hello over a socket, 世界 👋🏽"},
        {"model": model, "input": 'call get_weather {"city": "Paris"}', "tools": [WEATHER_TOOL]},
        {"model": model, "input": "a long enough message", "max_output_tokens": 5},
    ]
    with socket(base_url) as connection:
        for lane, body in zip([None, "tools", "short"], bodies):
            create(connection, **body, **({"stream_id": lane} if lane else {}))
            over_socket = response_events(until_end(connection), lane)
            over_http = raw_stream(base_url, body)
            assert shape(over_socket) == shape(over_http)
            assert output_texts(check_stream(over_socket)) == output_texts(check_stream(over_http))
            assert over_socket[-1]["response"]["usage"]["output_tokens"] == over_http[-1]["response"]["usage"]["output_tokens"]


def sdk_chain_without_store(base_url: str, model: str = MODEL) -> None:
    """The SDK's `responses.connect()`: a tool call and its output in two turns, `store: false`,
    the second sending only the new item with `previous_response_id`. The connection holds the
    history; another connection, and HTTP, do not have it."""

    async def chain() -> str:
        sdk = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        async with sdk.responses.connect() as connection:
            await connection.response.create(model=model, input='call get_weather {"city": "Paris"}', tools=[WEATHER_TOOL], store=False)
            first = await _terminal(connection)
            assert first.type == "response.completed", first
            (call,) = [item for item in first.response.output if item.type == "function_call"]
            await connection.response.create(
                model=model,
                previous_response_id=first.response.id,
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 °C"}],
                tools=[WEATHER_TOOL],
                store=False,
            )
            second = await _terminal(connection)
            # The replay model names the tool of the call the history holds.
            assert second.type == "response.completed"
            assert second.response.output_text == "Tool get_weather returned: sunny, 21 °C"
            assert second.response.previous_response_id == first.response.id
            return first.response.id

    first_id = asyncio.run(chain())
    with socket(base_url) as connection:
        create(connection, model=model, previous_response_id=first_id, input="and now?", store=False)
        (error,) = until_end(connection)
    assert error["type"] == "error", error
    assert error["status"] == 400, error
    assert error["error"]["code"] == "previous_response_not_found"
    assert error["error"]["param"] == "previous_response_id"
    http = httpx.post(f"{base_url}/responses", json={"model": model, "previous_response_id": first_id, "input": "and now?"}, timeout=60)
    assert http.status_code == 400
    assert http.json()["error"]["code"] == "previous_response_not_found"


def failed_continuation_evicts(base_url: str, model: str = MODEL) -> None:
    """A continuation that fails (an output for a call the response never made) evicts the
    response it continued from the connection, as OpenAI's WebSocket mode does: continuing
    it again is `previous_response_not_found`; a response that was stored still continues."""
    with socket(base_url) as connection:
        for store in (False, True):
            create(connection, model=model, input="remember this", store=store)
            (first,) = [event for event in until_end(connection) if event["type"] in TERMINAL]
            parent = first["response"]["id"]
            orphan = [{"type": "function_call_output", "call_id": "call_never_made", "output": "x"}]
            create(connection, model=model, previous_response_id=parent, input=orphan, store=store)
            (failed,) = until_end(connection)
            assert failed["type"] == "error", failed
            assert failed["status"] == 400
            create(connection, model=model, previous_response_id=parent, input="again", store=store)
            again = until_end(connection)
            if store:  # the store still has it
                assert again[-1]["type"] == "response.completed", again[-1]
            else:
                assert again[-1]["type"] == "error", again[-1]
                assert again[-1]["error"]["code"] == "previous_response_not_found"


async def _terminal(connection):
    async for event in connection:
        if event.type in ENDS:
            return event
    return None


def stored_responses_are_shared(base_url: str, model: str = MODEL) -> None:
    """`store: true` over the socket stores as HTTP does: HTTP reads and continues it, and a
    new connection continues a response made over HTTP."""
    with socket(base_url) as connection:
        create(connection, model=model, input="remember me")
        made = response_events(until_end(connection))[-1]["response"]
    got = httpx.get(f"{base_url}/responses/{made['id']}", timeout=60)
    assert got.status_code == 200
    assert got.json()["output"] == made["output"]
    follow = httpx.post(f"{base_url}/responses", json={"model": model, "previous_response_id": made["id"], "input": "next"}, timeout=60)
    assert follow.status_code == 200
    assert follow.json()["previous_response_id"] == made["id"]
    with socket(base_url) as connection:
        create(connection, model=model, previous_response_id=follow.json()["id"], input="over the socket again")
        last = response_events(until_end(connection))[-1]["response"]
    # Three turns of history in the prompt: more input than the first turn alone.
    assert last["status"] == "completed"
    assert last["usage"]["input_tokens"] > made["usage"]["input_tokens"] + follow.json()["usage"]["output_tokens"]


def lanes_run_side_by_side(base_url: str, slow_model: str) -> None:
    """Two creates on one lane run one after the other; another lane runs beside them; every
    event carries its lane."""
    text = "slow enough to overlap " * 4
    with socket(base_url) as connection:
        create(connection, model=slow_model, input=text, stream_id="a", store=False)
        create(connection, model=slow_model, input=text + "again", stream_id="a", store=False)
        create(connection, model=slow_model, input=text, stream_id="b", store=False)
        messages = []
        while sum(m["type"] in TERMINAL for m in messages) < 3:
            messages.append(receive(connection))
    order = [(m["stream_id"], m["type"]) for m in messages if m["type"] == "response.created" or m["type"] in TERMINAL]
    a_events = [m for m in messages if m["stream_id"] == "a"]
    first_end = next(i for i, m in enumerate(a_events) if m["type"] in TERMINAL)
    # Lane a: the second response starts after the first ended, and each is whole.
    response_events(a_events[: first_end + 1], "a")
    response_events(a_events[first_end + 1 :], "a")
    response_events([m for m in messages if m["stream_id"] == "b"], "b")
    # Lane b started before lane a's first response ended.
    assert order.index(("b", "response.created")) < order.index(("a", "response.completed")), order


def warm_up_then_generate(base_url: str, model: str = MODEL) -> None:
    """`generate: false` renders the request and answers an empty completed response; the next
    turn chains from it, its input included."""
    instructions = "You answer in one short sentence."
    with socket(base_url) as connection:
        create(connection, model=model, instructions=instructions, input="context to warm up with", generate=False, store=False)
        warm = response_events(until_end(connection))
        assert [e["type"] for e in warm] == ["response.created", "response.in_progress", "response.completed"]
        warmed = warm[-1]["response"]
        assert warmed["output"] == []
        assert warmed["usage"]["output_tokens"] == 0
        assert warmed["usage"]["input_tokens"] > 0
        create(connection, model=model, instructions=instructions, previous_response_id=warmed["id"], input="now answer", store=False)
        answered = response_events(until_end(connection))[-1]["response"]
    assert answered["status"] == "completed"
    assert answered["output"]
    assert answered["usage"]["input_tokens"] > warmed["usage"]["input_tokens"]


def bad_messages_get_errors_and_the_connection_goes_on(base_url: str, model: str = MODEL) -> None:
    """Each bad message is answered by an `error` (the HTTP status it would have had) or a
    `response.steer.failed`; the connection stays usable."""
    cases = [
        ("not json", 400, "invalid_json", None),
        (json.dumps(["a", "list"]), 400, "invalid_type", None),
        (json.dumps({"type": "session.update"}), 400, "unknown_event_type", "type"),
        (json.dumps({"type": "response.create", "stream_id": 7, "model": model, "input": "x"}), 400, "invalid_type", "stream_id"),
        (
            json.dumps({"type": "response.create", "model": model, "input": "x", "background": True}),
            400,
            "unsupported_parameter",
            "background",
        ),
        (
            json.dumps({"type": "response.create", "model": "no-such-model", "input": "x", "stream_id": "l"}),
            404,
            "model_not_found",
            "model",
        ),
        (json.dumps({"type": "response.create", "model": model, "input": []}), 400, None, "input"),
        (json.dumps({"type": "response.create", "model": model, "input": "x", "temperature": 9}), 400, None, "temperature"),
    ]
    with socket(base_url) as connection:
        for message, status, code, param in cases:
            connection.send(message)
            (error,) = until_end(connection)
            assert error["type"] == "error", (message, error)
            assert error["status"] == status, (message, error)
            assert error["error"]["param"] == param, (message, error)
            assert code is None or error["error"]["code"] == code, (message, error)
            lane = json.loads(message).get("stream_id") if message.startswith("{") else None
            assert error.get("stream_id") == (lane if isinstance(lane, str) else None), (message, error)  # on its lane, if it named one
        connection.send(json.dumps({"type": "response.steer", "previous_response_id": "resp_x", "input": "also this"}))
        steer = receive(connection)
        assert steer["type"] == "response.steer.failed"
        assert steer["error"]["code"] == "steering_not_supported"
        assert steer["steer"] == {"input": "also this", "previous_response_id": "resp_x"}  # back, for the next create
        create(connection, model=model, input="still here")
        assert response_events(until_end(connection))[-1]["response"]["status"] == "completed"


def agents_sdk_over_a_socket(base_url: str, model: str = MODEL) -> None:
    """The Agents SDK, unmodified, with its WebSocket transport (`use_responses_websocket`): a
    Runner's tool loop (the SDK runs the tool and sends its output back), then a run chained
    to the first by `previous_response_id`."""
    from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_provider import OpenAIProvider

    set_tracing_disabled(True)
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city"""
        cities.append(city)
        return f"sunny in {city}"

    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        provider = OpenAIProvider(openai_client=client, use_responses=True, use_responses_websocket=True)
        agent = Agent(name="weather", instructions="Use the tool.", model=model, tools=[get_weather])
        config = RunConfig(model_provider=provider)
        try:
            first = await Runner.run(agent, 'call get_weather {"city": "Paris"}', run_config=config)
            assert first.final_output == "Tool get_weather returned: sunny in Paris"
            second = await Runner.run(
                agent, 'call get_weather {"city": "Rome"}', run_config=config, previous_response_id=first.last_response_id
            )
            assert second.final_output == "Tool get_weather returned: sunny in Rome"
        finally:
            await provider.aclose()
        assert cities == ["Paris", "Rome"]

    asyncio.run(main())


ALL = [
    same_events_as_http,
    failed_continuation_evicts,
    sdk_chain_without_store,
    stored_responses_are_shared,
    warm_up_then_generate,
    bad_messages_get_errors_and_the_connection_goes_on,
    agents_sdk_over_a_socket,
]

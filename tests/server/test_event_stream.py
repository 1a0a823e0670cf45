"""SSE keep-alive comments: a quiet stream gets `: keep-alive` between events, never inside
one or after the end, and every client still reads the same events."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from serve_app.config import AppConfig
from serve_app.engines.replay import ReplayBackend, ReplayConfig
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.server.routes.event_stream import KEEPALIVE, EventStreamResponse
from tests.support.contract import check_stream, parse_sse
from tests.support.sdk_scenarios import client
from tests.support.servers import uvicorn_server

FIRST, SECOND = b"event: a\ndata: {}\n\n", b"event: b\ndata: {}\n\n"
SCOPE = {"type": "http", "asgi": {"spec_version": "2.4"}, "method": "GET", "path": "/"}
# uvicorn (Serve's direct ingress too) speaks ASGI 2.3: Starlette then also listens for the
# client's disconnect, in a task group with the stream.
SCOPE_2_3 = {**SCOPE, "asgi": {"spec_version": "2.3"}}


async def until(condition, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def frames(gap_s: float, closed: list[str] | None = None):
    try:
        yield FIRST
        await asyncio.sleep(gap_s)
        yield SECOND
    finally:
        if closed is not None:
            closed.append("closed")


async def written(response: EventStreamResponse) -> list[bytes]:
    """The body chunks the response sends, checking that the end comes last, once."""
    messages = []

    async def send(message):
        messages.append(message)

    async def receive():
        raise AssertionError("an ASGI 2.4 stream does not listen")

    await response(SCOPE, receive, send)
    assert messages[0]["type"] == "http.response.start"
    assert messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert all(m["more_body"] for m in messages[1:-1])
    return [m["body"] for m in messages[1:-1]]


def test_a_quiet_stream_gets_keepalives_between_its_events():
    chunks = asyncio.run(written(EventStreamResponse(frames(0.4), keepalive_s=0.1)))
    assert chunks[0] == FIRST
    assert chunks[-1] == SECOND
    assert chunks[1:-1]
    assert set(chunks[1:-1]) == {KEEPALIVE}  # at least one, nothing else


@pytest.mark.parametrize("keepalive_s", [None, 0, 30.0])
def test_no_keepalive_when_off_or_not_quiet_long_enough(keepalive_s):
    assert asyncio.run(written(EventStreamResponse(frames(0.3), keepalive_s=keepalive_s))) == [FIRST, SECOND]


def test_headers():
    response = EventStreamResponse(frames(0), keepalive_s=1, headers={"x-extra": "1"})
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-extra"] == "1"


def test_a_cancelled_stream_stops_its_keepalives_and_closes_its_events():
    async def scenario():
        sent, closed = [], []

        async def send(message):
            sent.append(message)

        task = asyncio.create_task(EventStreamResponse(frames(3600, closed), keepalive_s=0.02)(SCOPE, None, send))
        await until(lambda: sum(m.get("body") == KEEPALIVE for m in sent) >= 2)
        task.cancel()  # what Serve does when the client goes away
        with pytest.raises(asyncio.CancelledError):
            await task
        count = len(sent)
        await asyncio.sleep(0.2)
        assert len(sent) == count  # no keep-alive after the end
        assert closed == ["closed"]  # the events' generator was closed: generation stops

    asyncio.run(scenario())


def test_a_client_disconnect_stops_keepalives_and_closes_events():
    """The production path (ASGI 2.3): the client goes away while the stream is quiet."""

    async def scenario():
        sent, closed, gone = [], [], asyncio.Event()

        async def send(message):
            sent.append(message)

        async def receive():
            await gone.wait()
            return {"type": "http.disconnect"}

        response = EventStreamResponse(frames(3600, closed), keepalive_s=0.02)
        task = asyncio.create_task(response(SCOPE_2_3, receive, send))
        await until(lambda: sum(m.get("body") == KEEPALIVE for m in sent) >= 2)
        gone.set()
        await asyncio.wait_for(task, 30)  # the response ends by itself
        count = len(sent)
        await asyncio.sleep(0.2)
        assert len(sent) == count
        assert sent[-1].get("more_body") is not False
        await until(lambda: closed == ["closed"])  # the events' generator was closed: generation stops

    asyncio.run(scenario())


def test_keepalive_setting():
    model = {"name": "m", "backend": {"type": "replay"}}
    assert AppConfig.model_validate({"models": [model]}).sse_keepalive_s == 15.0
    assert AppConfig.model_validate({"models": [model], "sse_keepalive_s": 0}).sse_keepalive_s == 0
    with pytest.raises(ValueError, match="sse_keepalive_s"):
        AppConfig.model_validate({"models": [model], "sse_keepalive_s": -1})


@pytest.fixture(scope="module")
def slow_url():
    # One token per 200 ms step: quiet for longer than the keep-alive between every token.
    engine = ReplayBackend(ReplayConfig(min_step_tokens=1, max_step_tokens=1, step_delay_s=0.2))
    with uvicorn_server(create_app([ServedModel("slow", engine)], ServerSettings(sse_keepalive_s=0.05))) as url:
        yield url


@pytest.mark.slow
def test_clients_read_a_stream_with_keepalives(slow_url):
    body = {"model": "slow", "input": "hello there", "stream": True}
    raw = httpx.post(f"{slow_url}/responses", json=body, timeout=60).content
    assert raw.count(KEEPALIVE) >= 2
    at = [i for i in range(len(raw)) if raw.startswith(KEEPALIVE, i)]
    assert all(raw[i - 2 : i] == b"\n\n" for i in at)  # only ever after a whole event
    events = parse_sse(raw)
    check_stream(events)
    assert events[-1]["response"]["output"][-1]["content"][0]["text"] == "hello there"

    # The openai SDK skips them too.
    streamed = list(client(slow_url).responses.create(model="slow", input="hello there", stream=True))
    assert [e.type for e in streamed] == [e["type"] for e in events]
    assert streamed[-1].response.output_text == "hello there"


@pytest.mark.slow
def test_a_followed_background_response_gets_keepalives(slow_url):
    body = {"model": "slow", "input": "hello there", "stream": True, "background": True}
    raw = httpx.post(f"{slow_url}/responses", json=body, timeout=60).content
    assert raw.count(KEEPALIVE) >= 2
    events = parse_sse(raw)
    check_stream(events)
    assert events[-1]["type"] == "response.completed"

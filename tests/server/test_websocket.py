"""`/v1/responses` over a WebSocket, in process (uvicorn, no Ray); the same scenarios run
through Serve's HAProxy and two ingress replicas in tests/deployments/test_serve_e2e.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.exceptions import InvalidStatus

from serve_app.config import AuthConfig
from serve_app.engines.replay import ReplayBackend, ReplayConfig
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.state import MemoryStore, ResponseStore
from serve_app.state.connection import ConnectionResponses
from tests.state.test_state_responses import CountingStore
from tests.support import socket_scenarios
from tests.support.sdk_scenarios import REPLAY_MODELS
from tests.support.servers import uvicorn_server, wait_until

SLOW = ReplayConfig(min_step_tokens=1, max_step_tokens=1, step_delay_s=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("model", REPLAY_MODELS)
@pytest.mark.parametrize("scenario", socket_scenarios.ALL, ids=lambda f: f.__name__)
def test_scenario(inprocess_url, scenario, model):
    scenario(inprocess_url, model)


@pytest.fixture(scope="module")
def slow_engine():
    return ReplayBackend(SLOW)


@pytest.fixture(scope="module")
def slow_url(slow_engine):
    app = create_app([ServedModel("slow", slow_engine)], ServerSettings(max_request_bytes=64 * 1024))
    with uvicorn_server(app) as url:
        yield url


@pytest.mark.slow
def test_lanes_run_side_by_side(slow_url):
    socket_scenarios.lanes_run_side_by_side(slow_url, "slow")


def test_a_client_that_leaves_mid_response_aborts_its_engine_requests(slow_url, slow_engine):
    with socket_scenarios.socket(slow_url) as connection:
        for lane in ("a", "b"):
            socket_scenarios.create(connection, model="slow", input="a long answer " * 30, stream_id=lane, store=False)
        deltas = 0
        while deltas < 6:
            deltas += socket_scenarios.receive(connection)["type"].endswith(".delta")
        assert slow_engine.num_running() == 2
    assert wait_until(lambda: slow_engine.num_running() == 0, timeout_s=10), slow_engine.num_running()


def test_a_message_over_the_size_limit_is_refused_and_the_connection_goes_on(slow_url):
    with socket_scenarios.socket(slow_url) as connection:
        socket_scenarios.create(connection, model="slow", input="x" * (64 * 1024))
        (error,) = socket_scenarios.until_end(connection)
        assert (error["status"], error["error"]["code"]) == (413, "request_too_large")
        socket_scenarios.create(connection, model="slow", input="small")
        assert socket_scenarios.until_end(connection)[-1]["type"] == "response.completed"


def test_the_size_limit_counts_bytes_not_characters(slow_url):
    """64 KiB is the limit: 30,000 three-byte characters are 90 KB on the wire, over it, though
    fewer than 64 Ki characters (an attacker's 4x)."""
    with socket_scenarios.socket(slow_url) as connection:
        # Sent as UTF-8 (json.dumps would escape each as six ASCII characters).
        connection.send(json.dumps({"type": "response.create", "model": "slow", "input": "€" * 30_000}, ensure_ascii=False))
        (error,) = socket_scenarios.until_end(connection)
        assert (error["status"], error["error"]["code"]) == (413, "request_too_large")


def test_the_api_key_is_checked_at_the_handshake():
    key = "sekret-0123456789abcdef"
    auth = AuthConfig(keys=[{"tenant": "team-a", "key_env": "KEY"}])
    app = create_app([ServedModel("gpt-oss-replay", ReplayBackend())], ServerSettings(auth=auth), environ={"KEY": key})
    with uvicorn_server(app) as url:
        for headers in (None, {"Authorization": "Bearer wrong"}):
            with pytest.raises(InvalidStatus) as refused, socket_scenarios.socket(url, headers):
                pass
            assert refused.value.response.status_code == 401
            assert json.loads(refused.value.response.body)["error"]["code"] == "invalid_api_key"
        with socket_scenarios.socket(url, {"Authorization": f"Bearer {key}"}) as connection:
            socket_scenarios.create(connection, model="gpt-oss-replay", input="let me in")
            assert socket_scenarios.until_end(connection)[-1]["type"] == "response.completed"


def test_the_agents_sdk_runs_its_tool_loop_over_the_socket():
    """Its WebSocket transport is what carried the run: connections opened and closed, no
    request over HTTP."""
    from tests.deployments.test_metrics import Recorder

    recorder = Recorder()
    app = create_app([ServedModel("gpt-oss-replay", ReplayBackend())], metrics=recorder)
    http_requests: list[str] = []

    async def counting(scope, receive, send):
        if scope["type"] == "http":
            http_requests.append(scope["path"])
        await app(scope, receive, send)

    with uvicorn_server(counting) as url:
        socket_scenarios.agents_sdk_over_a_socket(url)
    assert max(recorder.websockets) >= 1
    assert recorder.websockets[-1] == 0
    assert http_requests == []
    assert len(recorder.outcomes) == 4
    assert {o.status for o in recorder.outcomes} == {"completed"}  # two runs of two turns


# --- ConnectionResponses: what a connection keeps -----------------------------------------------


def _response(response_id: str, previous: str | None, text: str = "ok"):
    from openai.types.responses import Response

    return Response.model_validate(
        {
            "id": response_id,
            "object": "response",
            "created_at": 0,
            "model": "m",
            "status": "completed",
            "previous_response_id": previous,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "output": [
                {
                    "type": "message",
                    "id": f"msg_{response_id}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
        }
    )


def _user(text: str):
    from serve_app.api.items import MessageItem

    return [MessageItem(role="user", content=text)]


def test_a_connection_reads_its_own_chain_from_memory_and_the_rest_from_the_store():
    async def scenario():
        store = CountingStore()
        shared = ResponseStore(store, "t")
        await shared.save(_response("r0", None, "from http"), _user("first, over HTTP"))
        mine = ConnectionResponses(shared)
        mine.remember(None, _response("r1", "r0"), _user("second"))
        mine.remember(None, _response("r2", "r1"), _user("third"))
        store.gets = 0
        history = await mine.history("r2")
        assert [getattr(item, "content", None) for item in history if item.role == "user"] == ["first, over HTTP", "second", "third"]
        assert store.gets == 1  # r0 only: r2 and r1 came from the connection
        assert await ConnectionResponses(shared).chain("r2") is None  # another connection: not there

    asyncio.run(scenario())


def test_a_connection_keeps_what_its_lanes_can_still_continue():
    async def scenario():
        mine = ConnectionResponses(ResponseStore(MemoryStore(), "t"), max_lanes=2)
        mine.remember("a", _response("a1", None), _user("a1"))
        mine.remember("a", _response("a2", "a1"), _user("a2"))
        mine.remember("b", _response("b1", "a1"), _user("b1"))  # a fork of lane a's first turn
        assert len(mine) == 3
        mine.remember("a", _response("a3", "a1"), _user("a3"))  # lane a forks too: a2 is reached by no lane
        assert len(mine) == 3
        assert await mine.chain("a2") is None
        assert await mine.history("a3")
        mine.remember("c", _response("c1", None), _user("c1"))  # a third lane: the least recent (b) goes
        assert len(mine) == 3
        assert await mine.chain("b1") is None
        assert {turn.response.id for turn in await mine.chain("a3")} == {"a1", "a3"}

    asyncio.run(scenario())


def test_a_connection_keeps_at_most_its_byte_budget():
    """Past `max_bytes` the least recently used lanes go whole; the latest lane stays even
    alone over the budget (its next turn must be able to continue it)."""

    async def scenario():
        big = "x" * 10_000
        mine = ConnectionResponses(ResponseStore(MemoryStore(), "t"), max_bytes=35_000)
        mine.remember("a", _response("a1", None, big), _user("a1"))
        mine.remember("b", _response("b1", None, big), _user("b1"))
        mine.remember("a", _response("a2", "a1", big), _user("a2"))
        assert len(mine) == 3
        assert 30_000 < mine.bytes <= 35_000
        mine.remember("c", _response("c1", None, big), _user("c1"))  # over: b, the least recent lane, goes
        assert await mine.chain("b1") is None
        assert [t.response.id for t in await mine.chain("a2")] == ["a1", "a2"]
        assert mine.bytes <= 35_000
        mine.remember("c", _response("c2", "c1", big * 4), _user("c2"))  # lane c alone is over the budget
        assert await mine.chain("a2") is None
        assert [t.response.id for t in await mine.chain("c2")] == ["c1", "c2"]
        assert mine.bytes > 35_000
        assert mine.bytes == sum(len(turn.encode()) for turn in await mine.chain("c2"))

    asyncio.run(scenario())

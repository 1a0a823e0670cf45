"""Followers of a background response run on another replica wait on the store's
notification, not on a clock (serve_app/runtime/background.py `follow`, serve_app/state
`wait_length`): twenty followers cost store calls per batch of events, none while the run is
quiet, on the in-process store, the embedded store (its replica's own notification) and a real
redis-server (pub/sub). Counted, never timed. (That they hold places among their tenant's
concurrent requests: tests/server/test_quotas.py; through Serve with two ingress replicas:
tests/deployments/test_background_e2e.py.)"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from serve_app.api.request import ResponsesRequest
from serve_app.core.stream import ResponseStream, new_id
from serve_app.core.tokens import GenerationRequest
from serve_app.engines.replay import ReplayBackend
from serve_app.families.harmony import HarmonyModel
from serve_app.runtime.background import BackgroundRuns
from serve_app.runtime.run import engine_events
from serve_app.state import MemoryStore, ResponseStore, Store
from serve_app.state.redis import RedisStore
from serve_app.state.runs import RunStore
from tests.support.contract import parse_sse

pytestmark = pytest.mark.anyio

FOLLOWERS = 20
QUIET_S = 0.5  # a polling follower (every 0.1 s) would make ~10 calls in it; a notified one none
NEVER_S = 3600.0  # the followers' fallback wait: longer than the test, so only notifications wake them


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(params=["memory", "embedded", "redis"])
async def backend(request) -> AsyncGenerator[Store, None]:
    if request.param == "memory":
        store: Store = MemoryStore()
    elif request.param == "embedded":
        from tests.state.conftest import _embedded_store

        store = _embedded_store()
    else:
        server = request.getfixturevalue("redis_server")
        store = RedisStore(server.url, password=server.password, key_prefix=f"test-{uuid.uuid4().hex}:")
    yield store
    await store.close()


class Counted:
    """A `Store` counting the calls that reach it, by method."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await method(*args, **kwargs)

        return call


async def paused(events: AsyncGenerator[list[Any], None], gate: asyncio.Event) -> AsyncGenerator[list[Any], None]:
    """The run's events, held after the first batch until `gate` opens (a run waiting on its engine)."""
    first = True
    async with asyncio.timeout(60):
        async for batch in events:
            yield batch
            if first:
                first = False
                await gate.wait()


async def start(runs: BackgroundRuns, text: str, gate: asyncio.Event) -> str:
    request = ResponsesRequest(model="m", input=text, background=True)
    family = HarmonyModel()
    prompt = family.render_prompt(request, request.input_items())
    generation = GenerationRequest(
        request_id=new_id("resp"), prompt_token_ids=prompt, stop_token_ids=family.stop_token_ids, max_tokens=10_000
    )
    stream = ResponseStream(request, response_id=generation.request_id, parser_factory=lambda sink: family.parser(sink, prompt))

    async def finish(response) -> None:
        await runs.responses.save(response, request.input_items())

    events = paused(engine_events(stream, ReplayBackend(), generation), gate)
    return (await runs.start(stream, events, request.input_items(), finish)).id


async def test_followers_on_another_replica_cost_store_calls_per_batch_not_per_second(backend: Store):
    owner_store, reader_store = Counted(backend), Counted(backend)
    owner = BackgroundRuns(ResponseStore(owner_store, "t"), RunStore(owner_store, "t"), replica_id="owner")
    reader = BackgroundRuns(ResponseStore(backend, "t"), RunStore(reader_store, "t"), replica_id="reader", follow_wait_s=NEVER_S)
    gate = asyncio.Event()
    response_id = await start(owner, "a follower's notification " * 8, gate)
    while await backend.length(f"t:t:events:{response_id}") == 0:  # its first events are in the log
        await asyncio.sleep(0.01)

    received: list[list[bytes]] = [[] for _ in range(FOLLOWERS)]

    async def follow(index: int) -> None:
        async for chunk in reader.follow(response_id, -1):
            received[index].append(chunk)

    followers = [asyncio.create_task(follow(index)) for index in range(FOLLOWERS)]
    while not all(received) or not reader._waits:  # each has the first events, and waits for more
        await asyncio.sleep(0.01)
    before = sum(reader_store.calls.values())
    await asyncio.sleep(QUIET_S)  # the run is quiet: nobody reads
    assert sum(reader_store.calls.values()) == before, reader_store.calls

    gate.set()
    await asyncio.wait_for(asyncio.gather(*followers), 60)
    whole = parse_sse(b"".join(await reader.runs.events(response_id, 0)))
    assert whole[-1]["type"] == "response.completed"
    for chunks in received:
        assert parse_sse(b"".join(chunks)) == whole
    # Per batch the owner appended: one shared wait and a read per follower (and a last look
    # each at the start); never a call per follower per tick of a clock.
    appends = owner_store.calls["append"]
    calls = reader_store.calls
    assert calls["wait_length"] <= appends + 2, calls
    assert calls["range"] <= FOLLOWERS * (appends + 2), calls
    assert sum(calls.values()) <= calls["wait_length"] + calls["range"] + 2 * FOLLOWERS, calls

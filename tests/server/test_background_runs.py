"""The run of a background response (serve_app/runtime/background.py) against a real in-process
store: lease expiry declares an orphaned run failed (and fences its owner), shutdown ends
what it cannot wait for, cancel of an orphan does not wait for it forever."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.api.request import ResponsesRequest
from serve_app.core.stream import ResponseStream, new_id
from serve_app.core.tokens import GenerationRequest
from serve_app.engines.replay import ReplayBackend, ReplayConfig
from serve_app.runtime.background import BackgroundRuns
from serve_app.runtime.run import engine_events
from serve_app.state import MemoryStore, ResponseStore
from serve_app.state.runs import RunStore, run_key
from serve_app.state.store import StoreUnavailable
from tests.support.contract import parse_sse

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def replica(store, clock, name: str) -> BackgroundRuns:
    return BackgroundRuns(
        ResponseStore(store, "t"), RunStore(store, "t", ttl_s=600, lease_s=10, clock=clock), replica_id=name, renew_s=0.01, poll_s=0.01
    )


async def start(runs: BackgroundRuns, backend: ReplayBackend, text: str) -> str:
    from serve_app.families.harmony import HarmonyModel

    request = ResponsesRequest(model="m", input=text, background=True)
    family = HarmonyModel()
    prompt = family.render_prompt(request, request.input_items())
    generation = GenerationRequest(
        request_id=new_id("resp"), prompt_token_ids=prompt, stop_token_ids=family.stop_token_ids, max_tokens=10_000
    )
    stream = ResponseStream(request, response_id=generation.request_id, parser_factory=lambda sink: family.parser(sink, prompt))

    async def finish(response) -> None:
        await runs.responses.save(response, request.input_items())

    snapshot = await runs.start(stream, engine_events(stream, backend, generation), request.input_items(), finish)
    return snapshot.id


async def collect(runs: BackgroundRuns, response_id: str, after: int = -1) -> list[dict]:
    return parse_sse(b"".join([chunk async for chunk in runs.follow(response_id, after)]))


async def test_an_orphaned_run_is_failed_by_a_reader_and_its_owner_is_fenced():
    store, clock = MemoryStore(), Clock()
    owner, reader = replica(store, clock, "a"), replica(store, clock, "b")
    backend = ReplayBackend(ReplayConfig(step_delay_s=0.01))
    response_id = await start(owner, backend, "x" * 400)
    while await owner.runs.length(response_id) < 5:
        await asyncio.sleep(0.01)
    # The owner stops renewing (as if its process froze); its lease runs out.
    owner.renew_s = 3600
    await asyncio.sleep(0.05)  # the renewal under way ends
    clock.now += 11
    response = (await reader.responses.get(response_id)).response
    refreshed = await reader.refresh(response)
    assert refreshed.status == "failed"
    assert "stopped before it finished" in refreshed.error.message
    # The owner's next append lands where the failure is: refused, it stops generating.
    while owner.running:
        await asyncio.sleep(0.01)
    assert backend.num_running() == 0
    events = await collect(reader, response_id)
    assert events[-1]["type"] == "response.failed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert (await reader.responses.get(response_id)).response.status == "failed"
    record = await reader.runs.get(response_id)
    assert record.closed
    assert record.status == "failed"
    assert record.length == len(events)


async def test_shutdown_waits_then_fails_what_is_left():
    store, clock = MemoryStore(), Clock()
    runs = replica(store, clock, "a")
    quick = await start(runs, ReplayBackend(), "quick one")
    slow_backend = ReplayBackend(ReplayConfig(step_delay_s=0.05))
    slow = await start(runs, slow_backend, "y" * 2000)
    await runs.drain(timeout_s=0.2)
    assert runs.running == 0
    assert slow_backend.num_running() == 0
    assert (await runs.responses.get(quick)).response.status == "completed"
    stopped = (await runs.responses.get(slow)).response
    assert stopped.status == "failed"
    assert "shut down" in stopped.error.message
    events = await collect(replica(store, clock, "b"), slow)
    assert events[-1]["type"] == "response.failed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_cancelling_an_orphan_ends_it_failed():
    store, clock = MemoryStore(), Clock()
    owner, other = replica(store, clock, "a"), replica(store, clock, "b")
    backend = ReplayBackend(ReplayConfig(step_delay_s=0.01))
    response_id = await start(owner, backend, "z" * 400)
    owner.renew_s = 3600  # frozen owner: never sees the cancel flag
    await asyncio.sleep(0.05)
    clock.now += 11
    cancelled = await other.cancel(response_id)
    assert cancelled.status == "failed"
    assert (await other.cancel(response_id)).status == "failed"  # idempotent
    while owner.running:
        await asyncio.sleep(0.01)


async def test_follow_from_another_replica_sees_every_event_once():
    store, clock = MemoryStore(), Clock()
    owner, reader = replica(store, clock, "a"), replica(store, clock, "b")
    response_id = await start(owner, ReplayBackend(ReplayConfig(step_delay_s=0.005)), "follow me " * 20)
    remote, local = await asyncio.gather(collect(reader, response_id), collect(owner, response_id))
    assert remote == local
    assert remote[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in remote] == list(range(len(remote)))
    assert await collect(reader, response_id, after=len(remote) - 2) == remote[-1:]


async def test_a_sweep_fails_orphans_nobody_reads():
    store, clock = MemoryStore(), Clock()
    owner, sweeper = replica(store, clock, "a"), replica(store, clock, "b")
    done = await start(owner, ReplayBackend(), "finished")
    while owner.running:
        await asyncio.sleep(0.01)
    orphan = await start(owner, ReplayBackend(ReplayConfig(step_delay_s=0.05)), "w" * 2000)
    assert await sweeper.runs.open_runs() == [orphan]  # a closed run leaves the list
    await sweeper.sweep()
    assert (await sweeper.responses.get(orphan)).response.status == "in_progress"  # its lease holds
    owner.renew_s = 3600
    await asyncio.sleep(0.05)
    clock.now += 11
    await sweeper.sweep()
    assert (await sweeper.responses.get(orphan)).response.status == "failed"
    assert (await sweeper.responses.get(done)).response.status == "completed"
    assert await sweeper.runs.open_runs() == []
    while owner.running:
        await asyncio.sleep(0.01)


async def test_a_cancel_that_lands_while_the_end_is_stored_does_not_cut_it():
    """The cancel comes after the stream finished, while its end is being stored (as
    run_turn stores a finished response before handing over its terminal event): the run
    ends as it finished — completed, stored, its terminal event in the log — not half
    stored (an `in_progress` record, a log without an end) by an interrupted save. And the
    cancel still stops it once its end is in: a source that stalls after it is closed."""
    store, clock = MemoryStore(), Clock()
    runs = replica(store, clock, "a")
    request = ResponsesRequest(model="m", input="cancel me late", background=True)
    from serve_app.families.harmony import HarmonyModel

    family = HarmonyModel()
    prompt = family.render_prompt(request, request.input_items())
    generation = GenerationRequest(
        request_id=new_id("resp"), prompt_token_ids=prompt, stop_token_ids=family.stop_token_ids, max_tokens=10_000
    )
    stream = ResponseStream(request, response_id=generation.request_id, parser_factory=lambda sink: family.parser(sink, prompt))
    storing, stored = asyncio.Event(), asyncio.Event()

    async def events_storing_the_end():
        async for events in engine_events(stream, ReplayBackend(), generation):
            if stream.continuable:  # as run_turn: store, then hand over the terminal event
                storing.set()
                await stored.wait()
                await runs.responses.save(stream.response, request.input_items())
            yield events
        await asyncio.Event().wait()  # the engine stream stalls after the end

    async def finish(response) -> None:  # as the route's: run_turn stored a continuable one
        if not stream.continuable:
            await runs.responses.save(response, request.input_items())

    snapshot = await runs.start(stream, events_storing_the_end(), request.input_items(), finish)
    await storing.wait()
    cancelling = asyncio.create_task(runs.cancel(snapshot.id))
    while runs._local[snapshot.id].stop_reason != "cancel":  # the owner's watcher saw it, the end still being stored
        await asyncio.sleep(0.01)
    stored.set()
    cancelled = await asyncio.wait_for(cancelling, 10)
    assert cancelled.status == "completed"
    assert (await runs.responses.get(snapshot.id)).response.status == "completed"
    events = await collect(runs, snapshot.id)
    assert events[-1]["type"] == "response.completed"
    record = await runs.runs.get(snapshot.id)
    assert record.closed
    assert record.status == "completed"
    assert record.length == len(events)
    assert not runs.running


async def start_with(runs: BackgroundRuns, backend: ReplayBackend, text: str, finish) -> tuple[str, ResponseStream]:
    """`start`, with a `finish` of the test's, and the stream (its id even when start fails)."""
    from serve_app.families.harmony import HarmonyModel

    request = ResponsesRequest(model="m", input=text, background=True)
    family = HarmonyModel()
    prompt = family.render_prompt(request, request.input_items())
    generation = GenerationRequest(
        request_id=new_id("resp"), prompt_token_ids=prompt, stop_token_ids=family.stop_token_ids, max_tokens=10_000
    )
    stream = ResponseStream(request, response_id=generation.request_id, parser_factory=lambda sink: family.parser(sink, prompt))
    try:
        snapshot = await runs.start(stream, engine_events(stream, backend, generation), request.input_items(), finish)
    except Exception:
        return stream.response.id, stream
    return snapshot.id, stream


@pytest.mark.parametrize("lost", ["the final save", "the close"])
async def test_a_run_that_ended_is_never_failed_after_its_end(lost):
    """The owner streamed the whole response (its log ends with `response.completed`) and
    then could not store its end or close its run (the store failed; then its replica went):
    once its lease runs out, a sweep closes the run as it ended. It used to append
    `response.failed` after `response.completed` and store the response as failed."""
    store, clock = MemoryStore(), Clock()
    owner, sweeper = replica(store, clock, "a"), replica(store, clock, "b")

    async def finish(response) -> None:
        if lost == "the final save":
            raise StoreUnavailable()
        await owner.responses.save(response, [])

    async def close(*args, **kwargs):
        raise StoreUnavailable()

    if lost == "the close":
        owner.runs.close = close  # type: ignore[method-assign]
    response_id, stream = await start_with(owner, ReplayBackend(), "all of it", finish)
    while owner.running:
        await asyncio.sleep(0.01)
    assert (await sweeper.runs.get(response_id)).closed is False
    clock.now += 11
    await sweeper.sweep()
    stored = (await sweeper.responses.get(response_id)).response
    assert stored.status == "completed"
    assert stored.output_text == "all of it" == stream.response.output_text
    events = await collect(sweeper, response_id)
    assert [e["type"] for e in events].count("response.completed") == 1
    assert events[-1]["type"] == "response.completed"
    assert not [e for e in events if e["type"] == "response.failed"]
    record = await sweeper.runs.get(response_id)
    assert record.closed
    assert record.status == "completed"
    assert record.length == len(events)
    assert await sweeper.runs.open_runs() == []
    assert (await sweeper.refresh(stored)).status == "completed"


class RefusingStore(MemoryStore):
    """A store that is unavailable for the keys `refused` picks (and only for writes)."""

    def __init__(self, refused) -> None:
        super().__init__()
        self.refused = refused

    async def put(self, key, value, *, ttl_s):
        if self.refused(key):
            raise StoreUnavailable()
        return await super().put(key, value, ttl_s=ttl_s)

    async def compare_and_set(self, key, expected, value, *, ttl_s):
        if self.refused(key):
            raise StoreUnavailable()
        return await super().compare_and_set(key, expected, value, ttl_s=ttl_s)


async def test_a_run_that_cannot_be_recorded_leaves_no_response_in_progress():
    """The run's record could not be made: the start fails (a 503), and no response is left
    `in_progress` (its snapshot was stored first, and stayed so for the response's TTL)."""
    clock = Clock()
    store = RefusingStore(lambda key: ":run:" in key)
    runs = replica(store, clock, "a")
    backend = ReplayBackend()
    response_id, _ = await start_with(runs, backend, "never", lambda response: asyncio.sleep(0))
    assert not runs.running
    assert backend.num_running() == 0
    turn = await runs.responses.get(response_id)
    assert turn is None or (await runs.refresh(turn.response)).status == "failed"


async def test_a_snapshot_that_cannot_be_stored_leaves_no_run_open():
    """The record was made, the snapshot could not be stored: the start fails, and the run is
    not left open (deleted; else its lease runs out and a sweep closes it)."""
    clock = Clock()
    store = RefusingStore(lambda key: ":response:" in key)
    runs = replica(store, clock, "a")
    response_id, _ = await start_with(runs, ReplayBackend(), "never", lambda response: asyncio.sleep(0))
    assert not runs.running
    assert await runs.responses.get(response_id) is None
    clock.now += 11
    await runs.sweep()
    assert await runs.runs.open_runs() == []


async def test_an_active_response_whose_run_record_is_gone_is_failed():
    store, clock = MemoryStore(), Clock()
    owner, reader = replica(store, clock, "a"), replica(store, clock, "b")
    response_id = await start(owner, ReplayBackend(ReplayConfig(step_delay_s=0.05)), "v" * 2000)
    owner.renew_s = 3600
    await asyncio.sleep(0.05)
    await owner.runs.store.delete(run_key(response_id))  # lost (its TTL, or a store that lost it)
    refreshed = await reader.refresh((await reader.responses.get(response_id)).response)
    assert refreshed.status == "failed"
    while owner.running:
        await asyncio.sleep(0.01)


class ReadsFail(MemoryStore):
    failing = False

    async def range(self, key, start=0, stop=None):
        if self.failing:
            raise StoreUnavailable()
        return await super().range(key, start, stop)


async def test_a_follower_whose_store_fails_gets_an_error_event_to_resume_from():
    """Following a run from another replica, the store fails: the stream ends with an `error`
    event numbered as the next event would be (never cut without an end); resuming after
    the last event received gives the rest, once the store is back."""
    store, clock = ReadsFail(), Clock()
    owner, reader = replica(store, clock, "a"), replica(store, clock, "b")
    response_id = await start(owner, ReplayBackend(ReplayConfig(step_delay_s=0.005)), "resume me " * 10)
    received: list[dict] = []
    async for chunk in reader.follow(response_id, -1):
        received += parse_sse(chunk)
        if len(received) >= 3:
            store.failing = True
    assert received[-1]["type"] == "error"
    assert received[-1]["code"] == "store_unavailable"
    seen = received[:-1]
    assert received[-1]["sequence_number"] == len(seen) == seen[-1]["sequence_number"] + 1
    store.failing = False
    while owner.running:
        await asyncio.sleep(0.01)
    rest = await collect(reader, response_id, after=seen[-1]["sequence_number"])
    assert [e["sequence_number"] for e in seen + rest] == list(range(len(seen) + len(rest)))
    assert rest[-1]["type"] == "response.completed"

"""Background responses: the run of one response away from the HTTP request that started it,
and what any replica does with anyone's run: follow its events, cancel it, declare it failed
when the replica running it is gone.

The replica that runs a response (the owner) appends every event's SSE frame to the run's
log in the store (`state.runs`), renews its lease while it runs and watches the run's cancel
flag; at the end it stores the final response and closes the run. Any replica follows a run
by reading its log from a sequence number on, and a reader that finds a run whose lease has
expired closes it as `failed` (appending `response.failed`), so no run stays `in_progress`
forever. Imports `protocol` and `state`; no HTTP, no Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import os
import socket
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field

from openai.types.responses import Response, ResponseErrorEvent, ResponseFailedEvent, ResponseStreamEvent
from openai.types.responses.response_error import ResponseError

from serve_app.api.errors import invalid_request, response_not_found
from serve_app.api.sse import frame
from serve_app.core.stream import ResponseStream
from serve_app.families.harmony import HistoryItem
from serve_app.state.responses import FINISHED, ResponseStore
from serve_app.state.runs import RunRecord, RunStore
from serve_app.state.store import StoreUnavailable

logger = logging.getLogger(__name__)

Finish = Callable[[Response], Awaitable[None]]
_ACTIVE = ("queued", "in_progress")
TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")
_TERMINAL_FRAMES = tuple(f"event: {kind}\n".encode() for kind in TERMINAL_EVENTS)
FOLLOW_WAIT_S = 5.0  # a follower reads the store at least this often when no notification comes


def default_replica_id() -> str:
    """Random: it is sent to clients (`x-responses-serve-replica`), so it names no host or
    process; the log line at start-up maps it to them."""
    return uuid.uuid4().hex[:16]


@dataclass(eq=False)
class _LocalRun:
    """A run this replica owns: its frames so far (local followers read them here)."""

    response_id: str
    stream: ResponseStream
    frames: list[bytes] = field(default_factory=list)
    flushed: int = 0  # frames in the store's log
    stop_reason: str | None = None  # "cancel" | "lost" | "shutdown"
    ended: bool = False  # its terminal event is in `frames`
    done: bool = False  # everything flushed, final response stored, run closed (or given up)
    task: asyncio.Task[None] | None = None  # the whole run
    generation: asyncio.Task[None] | None = None  # reading the engine; cancelled to stop it
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # replaced on every change
    wake_watcher: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, events: list[ResponseStreamEvent]) -> None:
        if events:
            self.frames += [frame(event) for event in events]
            self.notify()

    def notify(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()


class BackgroundRuns:
    """This replica's background runs, and the operations on any replica's."""

    def __init__(
        self,
        responses: ResponseStore,
        runs: RunStore,
        *,
        replica_id: str | None = None,
        renew_s: float = 0.5,
        poll_s: float = 0.1,
        follow_wait_s: float = FOLLOW_WAIT_S,
        on_running: Callable[[int], None] = lambda running: None,
    ) -> None:
        """`on_running` is told how many runs this replica has whenever that changes (metrics).
        `poll_s`: how often a cancel looks whether the run has stopped, and a store that
        failed an append is retried; `follow_wait_s`: the longest a follower waits for a
        notification before it reads the store anyway."""
        self.responses = responses
        self.runs = runs
        self.replica_id = replica_id or default_replica_id()
        logger.info("background runs: replica id %s is %s pid %d", self.replica_id, socket.gethostname(), os.getpid())
        self.renew_s = renew_s
        self.poll_s = poll_s
        self.follow_wait_s = follow_wait_s
        self._waits: dict[tuple[str, int], asyncio.Task[int]] = {}  # followers' store waits, shared
        self._local: dict[str, _LocalRun] = {}
        self._on_running = on_running

    @property
    def running(self) -> int:
        return len(self._local)

    # -- the owner's side --------------------------------------------------------------------

    async def start(
        self,
        stream: ResponseStream,
        events: AsyncGenerator[list[ResponseStreamEvent], None],
        input_items: list[HistoryItem],
        finish: Finish,
    ) -> Response:
        """Store the response as `in_progress`, start its run here, return that snapshot.
        The run's record is made first: a stored response in progress always has one, whose
        lease fails it if its run never starts (a snapshot stored before a record that could
        not be made stayed `in_progress` for the response's TTL)."""
        response = stream.response
        snapshot = response.model_copy(deep=True)
        await self.runs.create(response.id, self.replica_id)
        try:
            await self.responses.save(snapshot, input_items)
        except BaseException:
            with contextlib.suppress(StoreUnavailable):  # else its lease runs out, and a sweep closes it
                await self.runs.delete(response.id)
            raise
        local = _LocalRun(response.id, stream)
        self._local[response.id] = local
        self._on_running(len(self._local))
        # A context of its own: not the HTTP request's, whose cancellation (the client going
        # away) Serve would pass on to the engine call made in it.
        local.task = asyncio.create_task(
            self._run(local, stream, events, finish), name=f"background {response.id}", context=contextvars.Context()
        )
        return snapshot

    async def _run(
        self, local: _LocalRun, stream: ResponseStream, events: AsyncGenerator[list[ResponseStreamEvent], None], finish: Finish
    ) -> None:
        response_id = local.response_id
        generation = local.generation = asyncio.create_task(self._generate(local, stream, events))
        # Its end wakes the flusher even when it added no events (cancelled before any output).
        generation.add_done_callback(lambda _: local.notify())
        watcher = asyncio.create_task(self._watch(local, generation))
        flusher = asyncio.create_task(self._flush_until(local, generation))
        try:
            await generation
            await flusher
            if local.stop_reason != "lost":
                await finish(stream.response)
                await self.runs.close(response_id, len(local.frames), stream.response.status or "failed")
            logger.info("background response %s: %s", response_id, stream.response.status)
        except Exception:  # the store failed at the end: the lease runs out, a reader fails it
            logger.exception("background response %s: could not store its end", response_id)
        finally:
            watcher.cancel()
            flusher.cancel()
            local.done = True
            local.notify()
            self._local.pop(response_id, None)
            self._on_running(len(self._local))

    @staticmethod
    async def _generate(local: _LocalRun, stream: ResponseStream, events: AsyncGenerator[list[ResponseStreamEvent], None]) -> None:
        try:
            async with contextlib.aclosing(events):  # closing it aborts the engine request
                async for batch in events:
                    local.add(batch)
                    local.ended = stream.finished
                    if local.ended and local.stop_reason is not None:  # asked to stop while its end was stored
                        return
        except asyncio.CancelledError:  # the watcher stopped us
            if local.stop_reason == "cancel":
                local.add(stream.cancel())
            elif local.stop_reason == "shutdown":
                local.add(stream.fail("The server shut down before this background response finished."))
            elif local.stop_reason != "lost":  # not ours: still end it properly
                local.add(stream.fail("The background response was interrupted."))

    async def _flush_until(self, local: _LocalRun, generation: asyncio.Task[None]) -> None:
        """Append new frames to the store's log until generation is over and all are in.
        A store down for longer than the lease: the run is given up (a reader fails it)."""
        loop = asyncio.get_running_loop()
        failing_since: float | None = None
        while True:
            changed = local.changed
            if local.flushed < len(local.frames):
                frames = local.frames[local.flushed :]
                try:
                    appended = await self.runs.append(local.response_id, frames, at=local.flushed)
                except StoreUnavailable:
                    failing_since = failing_since or loop.time()
                    if loop.time() - failing_since > self.runs.lease_s:
                        logger.error("background response %s: store unavailable too long; given up", local.response_id)
                        self._stop(local, "lost", generation)
                        local.stop_reason = "lost"
                        return
                    logger.warning("background response %s: store unavailable, retrying the append", local.response_id)
                    await asyncio.sleep(self.poll_s)
                    continue
                failing_since = None
                if not appended:  # someone declared this run failed: it is not ours any more
                    self._stop(local, "lost", generation)
                    return
                local.flushed += len(frames)
                continue
            if generation.done():
                return
            await changed.wait()

    async def _watch(self, local: _LocalRun, generation: asyncio.Task[None]) -> None:
        """Renew the lease; stop the generation when the run is cancelled or lost."""
        while not generation.done():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(local.wake_watcher.wait(), self.renew_s)
            local.wake_watcher.clear()
            try:
                record = await self.runs.renew(local.response_id, self.replica_id)
            except StoreUnavailable:
                logger.warning("background response %s: store unavailable, lease not renewed", local.response_id)
                continue
            if record is None or record.closed or record.owner != self.replica_id:
                self._stop(local, "lost", generation)
            elif record.cancel:
                self._stop(local, "cancel", generation)

    @staticmethod
    def _stop(local: _LocalRun, reason: str, generation: asyncio.Task[None]) -> None:
        if local.stop_reason is None and not generation.done():
            logger.info("background response %s: stopping (%s)", local.response_id, reason)
            local.stop_reason = reason
            # A stream that finished and is storing its end is not interrupted (its record could
            # stay `in_progress`, its log lack its end): `_generate` stops once the end is in.
            if not (local.stream.finished and not local.ended):
                generation.cancel()

    async def drain(self, timeout_s: float) -> None:
        """Shutting down: wait up to `timeout_s` for this replica's runs, then end the rest
        as failed (stored, so that nobody waits for them)."""
        runs = list(self._local.values())
        if not runs:
            return
        logger.info("waiting up to %.0f s for %d background responses", timeout_s, len(runs))
        tasks = [run.task for run in runs if run.task is not None]
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for run in runs:
            if run.task in pending and run.generation is not None:
                self._stop(run, "shutdown", run.generation)
        if pending:
            await asyncio.wait(pending, timeout=5)

    # -- any replica ---------------------------------------------------------------------------

    async def refresh(self, response: Response) -> Response:
        """The response as it now is: a background response whose replica is gone is failed now."""
        if not response.background or response.status not in _ACTIVE:
            return response
        record = await self.runs.get(response.id)
        if record is None or record.expired(self.runs.clock()):  # no record: its run is gone too
            await self._expire(response.id)
        turn = await self.responses.get(response.id)
        return turn.response if turn is not None else response

    async def sweep(self) -> None:
        """Fail every open run whose lease ran out, whether or not anyone reads it (so a
        follow-up with `previous_response_id` does not wait for a dead run either)."""
        now = self.runs.clock()
        for response_id in await self.runs.open_runs():
            record = await self.runs.get(response_id)
            if record is None or record.closed:
                await self.runs.forget(response_id)
            elif record.expired(now):
                await self._expire(response_id)

    async def _expire(self, response_id: str) -> None:
        """Declare a run whose lease ran out failed: a `response.failed` event at the end of
        its log (only if nobody wrote there meanwhile: then the owner lives), the failed
        response stored, the run closed. A run that had ended (its log ends with its
        terminal event, or its response is stored finished), whose owner went before it
        closed it, is closed as it ended instead: never failed after its end."""
        turn = await self.responses.get(response_id)
        at = await self.runs.length(response_id)
        if turn is None:  # deleted, or never stored (its save failed): nothing to fail
            await self.runs.close(response_id, at, "failed")
            return
        stored = turn.response
        ended = stored if stored.status in FINISHED else await self._logged_end(response_id, at)
        if ended is not None:
            if ended is not stored:  # its end is in the log, not yet in the store
                await self.responses.save(ended, turn.input, turn.tool_texts)
            logger.warning("background response %s: its replica went after it ended (%s); closed", response_id, ended.status)
            await self.runs.close(response_id, at, ended.status or "failed")
            return
        failed = turn.response.model_copy(
            update={
                "status": "failed",
                "error": ResponseError(
                    code="server_error",
                    message="The server running this background response stopped before it finished.",
                ),
            }
        )
        event = ResponseFailedEvent(type="response.failed", response=failed, sequence_number=at)
        if not await self.runs.append(response_id, [frame(event)], at=at):
            return
        logger.warning("background response %s: its replica is gone (lease expired); failed", response_id)
        await self.responses.save(failed, turn.input, turn.tool_texts)
        await self.runs.close(response_id, at + 1, "failed")

    async def _logged_end(self, response_id: str, length: int) -> Response | None:
        """The response of the terminal event that ends the run's log, if it ends with one."""
        if length == 0:
            return None
        last = await self.runs.events(response_id, length - 1)
        if not last:
            return None
        kind, _, data = last[-1].partition(b"\ndata: ")
        if kind.removeprefix(b"event: ").decode() not in TERMINAL_EVENTS:
            return None
        return Response.model_validate(json.loads(data)["response"])

    async def background_response(self, response_id: str) -> Response:
        turn = await self.responses.get(response_id)
        if turn is None:
            raise response_not_found(response_id)
        return turn.response

    async def cancel(self, response_id: str, wait_s: float | None = None) -> Response:
        """Ask the owner to stop and wait until it has (or its lease ran out); idempotent:
        a finished background response is returned as it is."""
        response = await self.background_response(response_id)
        if not response.background:
            raise invalid_request("Cannot cancel a synchronous response.", param="response_id", code=None)
        record = await self.runs.request_cancel(response_id)
        local = self._local.get(response_id)
        if local is not None:
            local.wake_watcher.set()
        deadline = asyncio.get_running_loop().time() + (wait_s if wait_s is not None else self.runs.lease_s + 4 * self.renew_s)
        while record is not None and not record.closed and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(self.poll_s)
            record = await self.runs.get(response_id)
            if record is not None and record.expired(self.runs.clock()):
                await self._expire(response_id)
        return await self.background_response(response_id)

    async def delete(self, response_id: str) -> bool:
        """Delete a stored response. A running background one is cancelled first (its engine
        request aborted, its end stored by its replica), so that nothing generates for a
        response that is gone and its end cannot write it back; its event log goes too."""
        turn = await self.responses.get(response_id)
        if turn is None:
            return False
        if turn.response.background:
            if turn.response.status in _ACTIVE:
                await self.cancel(response_id)
            await self.runs.delete(response_id)
        return await self.responses.delete(response_id)

    async def follow(self, response_id: str, starting_after: int) -> AsyncGenerator[bytes, None]:
        """The SSE frames of a run's events after `starting_after`, live until the run ends.
        A run of another replica is read from the store's log as it grows: the follower waits
        on the store's notification (`RunStore.wait_events`; one wait per position for every
        follower of the run on this replica), at most `follow_wait_s`, then reads what it
        must (a lost notification costs that long, never a hang; a dead owner's run is
        failed on such a read). So a follower costs store calls per batch of events, not per
        unit of time. A store that fails on the way ends the stream with an `error` event
        (numbered as the next event would be: resume with `starting_after` of the last one
        received)."""
        position = starting_after + 1
        while True:
            local = self._local.get(response_id)
            if local is not None:  # ours: read the frames in memory, woken on every change
                changed = local.changed
                frames = local.frames[position:]
                if frames:
                    position += len(frames)
                    yield b"".join(frames)
                elif local.done:
                    return
                else:
                    await changed.wait()
                continue
            record: RunRecord | None = None
            try:
                frames = await self.runs.events(response_id, position)
                if not frames:
                    record = await self.runs.get(response_id)
                    if record is not None and not record.closed and record.expired(self.runs.clock()):
                        await self._expire(response_id)
                        continue
            except StoreUnavailable as exc:
                yield self._follow_failed(response_id, position, exc)
                return
            if frames:
                position += len(frames)
                yield b"".join(frames)
                if frames[-1].startswith(_TERMINAL_FRAMES):  # nothing follows a terminal event
                    return
            elif record is None:
                return
            elif record.closed:
                if record.length is None or position >= record.length:
                    return
                continue
            try:
                await self._wait_events(response_id, position)
            except StoreUnavailable as exc:
                yield self._follow_failed(response_id, position, exc)
                return

    @staticmethod
    def _follow_failed(response_id: str, position: int, exc: StoreUnavailable) -> bytes:
        logger.warning("background response %s: following it stopped: %s", response_id, exc.message)
        return frame(ResponseErrorEvent(type="error", code=exc.code, message=exc.message, param=None, sequence_number=position))

    async def _wait_events(self, response_id: str, beyond: int) -> None:
        """Until the run's log holds more than `beyond` events (or `follow_wait_s` passed): one
        store wait shared by this replica's followers at that position."""
        key = (response_id, beyond)
        wait = self._waits.get(key)
        if wait is None:
            wait = asyncio.create_task(self.runs.wait_events(response_id, beyond, self.follow_wait_s))
            self._waits[key] = wait
            wait.add_done_callback(functools.partial(self._wait_done, key))
        await asyncio.shield(wait)  # a follower that leaves does not end the others' wait

    def _wait_done(self, key: tuple[str, int], wait: asyncio.Task[int]) -> None:
        if self._waits.get(key) is wait:
            del self._waits[key]
        if not wait.cancelled():
            wait.exception()  # retrieved (its followers, if any are left, get it too)

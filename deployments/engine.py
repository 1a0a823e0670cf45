"""EngineServer: one backend per replica, streaming `TokenBatch`es to the ingress.

The ingress calls `handle.options(stream=True).generate.remote(request)`; every object this
generator yields is one Ray object (~0.5 ms of CPU here), so deltas are coalesced: the first
batch goes out at once, later ones are merged for a short window or up to a token count.
When the caller goes away, Serve cancels this generator; the `CancelledError` aborts the
backend request so no engine work outlives its client. A caller that *dies* (its ingress
replica killed or lost with its node) cancels nothing: Ray keeps running an actor's streaming
generator whose owner is gone (backpressure, which would notice, is not available for
async actors). So the replica watches the callers of its running requests (`CallerWatch`)
and cancels the requests of a dead one the same way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

import ray
from ray import serve
from ray.serve._private.constants import SERVE_NAMESPACE
from ray.serve.exceptions import RayServeException
from ray.serve.metrics import Counter

from deployments import use_serve_logging
from deployments.memory import memory_report
from deployments.metrics import export_engine_load
from serve_app.config import CoalesceConfig, ModelConfig
from serve_app.core.tokens import GenerationRequest, TokenBatch
from serve_app.engines import make_backend
from serve_app.engines.cpu_cores import leave_batch_policy

logger = logging.getLogger(__name__)

_failed_metrics: set[str] = set()  # metrics whose error was logged already


def record_metric(update: Callable[[float], object], value: float | None) -> None:
    """Apply one metric update (`counter.inc`, `histogram.observe`, `gauge.set`) so that it
    can never fail the request it reports on: a None is skipped, an error (a negative count,
    the metrics agent...) is logged once per metric and the tokens keep flowing."""
    if value is None:
        return
    try:
        update(value)
    except Exception:
        metric = getattr(update, "__self__", update)
        name = getattr(metric, "info", {}).get("name", repr(metric))
        if name not in _failed_metrics:
            _failed_metrics.add(name)
            logger.exception("metric %s: update with %r failed (logged once; requests go on)", name, value)


def count(counter: Counter, value: int | None) -> None:
    """Add to a counter. Ray's `Counter.inc` refuses 0, which is normal here (an ngram step
    whose drafts were all rejected, a last batch with no tokens): nothing to add."""
    if value != 0:
        record_metric(counter.inc, value)


async def coalesce(batches: AsyncGenerator[TokenBatch, None], window_s: float, max_tokens: int) -> AsyncGenerator[TokenBatch, None]:
    """Merge a stream of batches: the first at once, then one per window (or `max_tokens`).

    The final batch (with `finish_reason`) is never held back.
    """
    iterator = batches
    loop = asyncio.get_running_loop()
    pending: TokenBatch | None = None
    deadline = 0.0
    next_batch: asyncio.Future[TokenBatch] | None = None
    try:
        first = await anext(iterator, None)
        if first is None:
            return
        yield first
        if first.finish_reason is not None:
            return
        while True:
            if next_batch is None:
                next_batch = asyncio.ensure_future(anext(iterator))
            timeout = None if pending is None else max(0.0, deadline - loop.time())
            done, _ = await asyncio.wait({next_batch}, timeout=timeout)
            if not done:  # the window is over: send what we have, keep waiting for the engine
                assert pending is not None  # only a pending batch sets a timeout
                yield pending
                pending = None
                continue
            finished, next_batch = next_batch, None
            try:
                batch = finished.result()
            except StopAsyncIteration:
                break
            if pending is None:
                pending, deadline = batch, loop.time() + window_s
            else:
                pending.merge(batch)
            if pending.finish_reason is not None or len(pending.token_ids) >= max_tokens:
                yield pending
                pending = None
                if batch.finish_reason is not None:
                    return
        if pending is not None:
            yield pending
    finally:
        await _release(iterator, next_batch)


async def _release(source: AsyncGenerator[TokenBatch, None], pending: asyncio.Future[TokenBatch] | None) -> None:
    """Stop a pending read of a source we own, then close it (aborting the engine request)."""
    if pending is not None and not pending.done():
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await pending
    await source.aclose()


# How long the engine replica waits for a request's first batch before it acknowledges the
# request instead (`acknowledged`). vLLM's admission control refuses a request in
# `add_request` before it waits on anything (from its second request on: the first asks
# the engine core for its tasks), so in the first step of the first read, which runs before
# this timer however late the loop is: a refusal comes before any acknowledgement.
ACKNOWLEDGE_AFTER_S = 0.01


async def acknowledged(batches: AsyncGenerator[TokenBatch, None], after_s: float) -> AsyncGenerator[TokenBatch, None]:
    """`batches`, led by an acknowledgement when the first takes longer than `after_s`.

    The ingress starts a response (its HTTP headers, `response.created`) at the engine's
    first batch, so that an engine at capacity is a 503 rather than a failed stream. Without
    an acknowledgement that start waits for the first token, and its writes delay it (~1 ms
    here, bench/HISTORY.md); with one, they are done while the prompt is prefilled.
    """
    first = asyncio.ensure_future(anext(batches))
    try:
        done, _ = await asyncio.wait({first}, timeout=after_s)
        if not done:
            yield TokenBatch.acknowledgement()
        try:
            batch = await first
        except StopAsyncIteration:
            return
        yield batch
        async for batch in batches:
            yield batch
    finally:
        await _release(batches, first)


# How often the callers of running requests are checked (one GCS lookup per distinct caller).
CALLER_CHECK_PERIOD_S = 2.0


def _actor_alive(name: str) -> bool:
    """Whether the named Serve replica actor is alive.

    Serve names its replica actors in its own namespace, which is not the namespace of the
    job a replica runs in (the driver's): look it up there explicitly.
    """
    try:
        ray.get_actor(name, namespace=SERVE_NAMESPACE)
    except ValueError:  # unknown name: dead actors give up their names
        return False
    return True


class CallerWatch:
    """Cancels the requests whose caller (the ingress replica reading the stream) died.

    Each running request registers the asyncio task that drives its generator; cancelling
    that task is what Serve does when a live caller cancels, so the abort path is the same.
    """

    def __init__(self, period_s: float = CALLER_CHECK_PERIOD_S) -> None:
        self._period_s = period_s
        self._running: dict[str, tuple[str, asyncio.Task[Any]]] = {}  # request id -> caller, task
        self._watcher: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def watching(self, request: GenerationRequest) -> Iterator[None]:
        task = asyncio.current_task()
        if request.caller is None or task is None:
            yield
            return
        if self._watcher is None or self._watcher.done():  # started on the loop requests run on
            self._watcher = asyncio.create_task(self._watch())
        self._running[request.request_id] = (request.caller, task)
        try:
            yield
        finally:
            self._running.pop(request.request_id, None)

    def callers(self) -> dict[str, int]:
        """Running requests per caller."""
        return dict(collections.Counter(caller for caller, _ in self._running.values()))

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._period_s)
            callers = {caller for caller, _ in self._running.values()}
            for caller in callers:
                try:
                    alive = await asyncio.to_thread(_actor_alive, caller)
                except Exception:
                    logger.warning("could not check caller %s", caller, exc_info=True)
                    continue
                if alive:
                    continue
                orphans = [(rid, task) for rid, (c, task) in self._running.items() if c == caller]
                logger.warning("caller %s is gone: aborting its %d running requests", caller, len(orphans))
                for _, task in orphans:
                    task.cancel()


class EngineServer:
    """Ray Serve deployment class (options come from `ModelConfig.engine`)."""

    async def __init__(self, model_config: dict[str, Any]) -> None:  # type: ignore[misc]  # Serve awaits async constructors
        # async: vLLM's AsyncLLM binds to the event loop it is created on, the replica's.
        use_serve_logging()  # the backends' own logs (`serve_app.*`) in this replica's log
        leave_batch_policy()  # on the request path, and so are the engine processes it starts
        self.config = ModelConfig.model_validate(model_config)
        self.backend = make_backend(self.config.backend)
        self.coalescing: CoalesceConfig = self.config.coalesce
        # Plain counters for tests and benchmarks; Ray metrics for dashboards.
        self.counts = {
            "requests": 0,
            "aborted": 0,
            "engine_batches": 0,
            "ray_objects": 0,
            "tokens": 0,
            "draft_tokens": 0,
            "accepted_tokens": 0,
        }
        # Serve tags these with the deployment (one per model) and replica. Exported once per
        # request, when it ends: four `Counter.inc` per batch were ~13 % of this replica's CPU.
        self._metrics = {
            "ray_objects": Counter("responses_serve_engine_objects", "TokenBatch objects yielded to Ray"),
            "tokens": Counter("responses_serve_engine_tokens", "completion tokens streamed"),
            "draft_tokens": Counter("responses_serve_spec_draft_tokens", "speculative tokens drafted"),
            "accepted_tokens": Counter("responses_serve_spec_accepted_tokens", "speculative tokens accepted"),
        }
        self._callers = CallerWatch()
        engine_load = getattr(self.backend, "engine_load", None)
        if engine_load is not None:  # vLLM: its KV cache, queue and preemptions as Ray metrics
            export_engine_load(self.config.name, engine_load)
        # Named on each response's first batch, so the tool loop's next round comes back here.
        try:
            self.replica_id: str | None = serve.get_replica_context().replica_id.unique_id
        except RayServeException:  # Serve's local testing mode has no replica context
            self.replica_id = None
        logger.info("EngineServer for %s started with %s backend", self.config.name, self.config.backend.type)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenBatch, None]:
        self.counts["requests"] += 1
        source = self._counted(self.backend.generate(request))
        if self.coalescing.enabled:
            source = coalesce(source, self.coalescing.window_ms / 1000, self.coalescing.max_tokens)
        source = acknowledged(source, ACKNOWLEDGE_AFTER_S)  # outermost: coalescing starts at the first token
        totals = dict.fromkeys(self._metrics, 0)  # this request's, for the Ray counters
        try:
            with self._callers.watching(request):
                async with contextlib.aclosing(source) as batches:
                    named = False  # the acknowledgement and the first token's batch name this replica
                    async for batch in batches:
                        if not named:
                            batch.replica, named = self.replica_id, not batch.is_acknowledgement
                        self._account(batch, totals)
                        yield batch
        except (asyncio.CancelledError, GeneratorExit):
            self.counts["aborted"] += 1
            logger.info("request %s cancelled by the caller: aborting", request.request_id)
            await asyncio.shield(self.backend.abort(request.request_id))
            raise
        finally:  # completed, aborted or failed: what was streamed is counted
            for name, metric in self._metrics.items():
                count(metric, totals[name])

    def _account(self, batch: TokenBatch, totals: dict[str, int]) -> None:
        """Bookkeeping of one outgoing batch; nothing here can fail the request."""
        tokens = len(batch.token_ids)
        drafted, accepted = batch.num_draft_tokens or 0, batch.num_accepted_tokens or 0
        for counts in (self.counts, totals):
            counts["ray_objects"] += 1
            counts["tokens"] += tokens
            counts["draft_tokens"] += drafted
            counts["accepted_tokens"] += accepted

    async def _counted(self, batches: AsyncGenerator[TokenBatch, None]) -> AsyncGenerator[TokenBatch, None]:
        async with contextlib.aclosing(batches):
            async for batch in batches:
                self.counts["engine_batches"] += 1
                yield batch

    async def stats(self) -> dict[str, Any]:
        """Counters of this replica (tests, benchmarks, debugging)."""
        stats = {
            **self.counts,
            "running": self.backend.num_running(),
            "callers": self._callers.callers(),  # running requests per ingress replica
            # (Serve's local testing mode runs without Ray: asking would start a cluster.)
            "actor_name": ray.get_runtime_context().get_actor_name() if ray.is_initialized() else None,
            "pid": os.getpid(),
        }
        backend: Any = self.backend
        if hasattr(backend, "spec_decode_stats"):  # vLLM: engine-wide drafted/accepted totals
            stats["spec_decode"] = backend.spec_decode_stats()
            stats["engine_unfinished"] = backend.num_unfinished_engine_requests()
            stats["engine_load"] = backend.engine_load()
        return stats

    async def memory(self, top: int = 8, trace_frames: int = 0, trim: bool = False) -> dict[str, Any]:
        """This replica's memory (deployments/memory.py; a measuring tool: not cheap)."""
        return memory_report(top, trace_frames, trim)

    async def check_health(self) -> None:
        """Serve calls this periodically: a dead engine fails it and the replica is replaced."""
        await self.backend.check_health()

    def __del__(self) -> None:
        shutdown = getattr(getattr(self, "backend", None), "shutdown", None)
        if shutdown is not None:  # stop vLLM's engine-core process with the replica
            shutdown()

"""ResponsesIngress: the FastAPI app of `serve_app.server.app`, talking to engines through handles.

Prompt rendering and token parsing happen here, on CPU replicas; engine replicas only
turn prompt tokens into token batches.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol, cast

import ray
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve._private.common import DeploymentStatus, ReplicaState  # ray.serve.schema uses them without exporting them
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from deployments import use_serve_logging
from deployments.embeddings import EmbeddingServer, HandleEmbedder
from deployments.memory import memory_report
from deployments.metrics import RayServeMetrics
from deployments.tools import HandleToolTransport
from serve_app.config import AppConfig, StoreConfig
from serve_app.core.tokens import EngineRejected, GenerationRequest, TokenBatch
from serve_app.engines.cpu_cores import leave_batch_policy
from serve_app.runtime.loop_lag import LoopLagProbe
from serve_app.runtime.models import served_model
from serve_app.runtime.reasoning_keys import reasoning_keys
from serve_app.runtime.turn import Unavailable
from serve_app.server.app import create_app
from serve_app.server.settings import ServerSettings
from serve_app.state import MemoryStore, Store
from serve_app.tools.builtin.transport import TransportFactory

if TYPE_CHECKING:
    from fastapi import FastAPI

    from deployments.engine import EngineServer
    from deployments.store import StoreServer
    from deployments.tools import BrowserToolServer, PythonToolServer

logger = logging.getLogger(__name__)

# Deployment states in which the engine failed (any other without a running replica: one is starting).
_FAILED = {DeploymentStatus.DEPLOY_FAILED.value, DeploymentStatus.UNHEALTHY.value}

# Failures that mean "this replica is gone", worth one retry elsewhere if nothing was sent yet.
_REPLICA_GONE = (ActorDiedError, ActorUnavailableError, RayActorError)


class _BatchStream(Protocol):
    """What `HandleTokenSource` uses of Serve's `DeploymentResponseGenerator` (whose `cancel` is untyped)."""

    def __aiter__(self) -> AsyncIterator[TokenBatch]: ...

    def cancel(self) -> None: ...


class HandleTokenSource:
    """`TokenSource` over an `EngineServer` deployment handle (Ray object streaming)."""

    def __init__(self, handle: DeploymentHandle[EngineServer], caller: str | None = None) -> None:
        self._handle = handle.options(stream=True)
        self._caller = caller

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenBatch, None]:
        # Ray does not cancel an actor's streaming generator when its caller dies: the
        # engine watches the caller named here and aborts what it was generating for it.
        request.caller = self._caller
        for attempt in (1, 2):
            response = cast(_BatchStream, self._handle.generate.remote(request))  # stream=True: a DeploymentResponseGenerator
            received = ended = False
            try:
                async for batch in response:
                    received = received or not batch.is_acknowledgement  # tokens came: no retry now
                    yield batch
                ended = True
                return
            except BackPressureError as exc:  # the engines' queue in this replica's handle is full: no retry helps
                raise EngineRejected(f"{exc.args[0]} requests already wait for them here", client_error=False) from None
            except (*_REPLICA_GONE, EngineRejected) as exc:
                # A refusal is retried only when the engine was busy (vLLM's admission
                # control: "try again … on a different instance"), never the request's fault.
                if received or attempt == 2 or (isinstance(exc, EngineRejected) and exc.client_error):
                    raise
                logger.warning(
                    "request %s: engine replica unavailable or busy before the first token (%s); retrying once", request.request_id, exc
                )
                request.affinity_key = None  # the retry goes by load, not back to the busy replica
            finally:
                # A client that went away (or an error) must stop the engine's generator too;
                # a stream read to its end needs no cancel (that would be a Ray call per request).
                if not ended:
                    response.cancel()


class EngineAvailability:
    """Which models have an engine replica to serve them, from Serve's own status.

    A request for a model whose engine deployment has no running replica (its replicas
    cannot start — a bad model path, OOM at load — or are all lost) would wait in the
    handle's queue until one appears, possibly forever. The ingress answers it with a 503
    at once instead (the deployment's status for the client, Serve's message in the log;
    `serve status` shows it too). A background poll keeps the view
    fresh; an "unavailable" verdict is re-checked before it is used, so a model that just
    came up is not refused on a stale view.

    The poll runs every `period_s` while a model is unavailable (to see it come up) and only
    every `settled_period_s` while all are available: `serve.status()` is not cheap (the
    controller builds the details of every replica, the replica validates them into
    pydantic models), and at 2 s it was most of an idle ingress replica's CPU and ~90 % of
    its Python time under load (py-spy, bench.vs_vllm), CPU taken from the engine on a
    small machine. A model that loses all its replicas while the view says "available" is
    seen at the next settled poll; until then its requests wait in the handle's queue, which
    is also where they wait for the replacement replica Serve starts.
    """

    def __init__(
        self,
        deployments: dict[str, str],
        period_s: float = 2.0,
        recheck_after_s: float = 0.5,
        settled_period_s: float = 30.0,
    ) -> None:
        self._deployments = deployments  # model name -> engine deployment name
        self._period_s, self._recheck_after_s = period_s, recheck_after_s
        self._settled_period_s = settled_period_s
        self._reasons: dict[str, str] = {}  # model name -> its deployment's status, when unavailable
        self._checked_at = 0.0
        self._lock = asyncio.Lock()
        self._poller: asyncio.Task[None] | None = None

    async def unavailable(self, model: str) -> Unavailable | None:
        if self._poller is None:  # started on the loop that serves requests
            self._poller = asyncio.create_task(self._poll())
        stale = time.monotonic() - self._checked_at > self._recheck_after_s
        if stale and (not self._checked_at or model in self._reasons):  # no view yet, or a refusal
            await self._refresh()
        reason = self._reasons.get(model)
        if reason is None:
            return None
        # Failed starts or health checks: Serve may or may not get a replica up; otherwise one is starting.
        return Unavailable("unavailable" if reason in _FAILED else "loading", reason)

    async def _poll(self) -> None:
        while True:
            await self._refresh()
            await asyncio.sleep(self.next_poll_in())

    def next_poll_in(self) -> float:
        """Seconds to the next poll: soon while a model is unavailable, rarely once all are up."""
        return self._period_s if self._reasons else self._settled_period_s

    async def _refresh(self) -> None:
        async with self._lock:
            if time.monotonic() - self._checked_at < 0.05:  # refreshed while we waited
                return
            try:
                status = await asyncio.to_thread(serve.status)
                app = status.applications[serve.get_replica_context().app_name]
            except Exception:
                logger.warning("could not read Serve's status", exc_info=True)
                return
            reasons: dict[str, str] = {}
            for model, name in self._deployments.items():
                deployment = app.deployments.get(name)
                if deployment is None or deployment.replica_states.get(ReplicaState.RUNNING, 0) == 0:
                    reasons[model] = deployment.status.value if deployment else "NOT_DEPLOYED"
                    if model not in self._reasons:  # the why (Serve's message) for the logs only
                        logger.warning("model %s is unavailable (%s): %s", model, reasons[model], deployment and deployment.message)
            self._reasons, self._checked_at = reasons, time.monotonic()


def _transport_factory(handle: DeploymentHandle[PythonToolServer | BrowserToolServer]) -> TransportFactory:
    transport = HandleToolTransport(handle)  # stateless: one for every response
    return lambda: transport


def open_store(config: StoreConfig, embedded: DeploymentHandle[StoreServer] | None) -> Store:
    """The configured store backend, as seen from an ingress replica."""
    if config.type == "memory":
        return MemoryStore(max_entries=config.max_entries, max_bytes=config.max_bytes)
    if config.type == "redis":
        from serve_app.state.redis import RedisStore

        url = config.redis_url()
        assert url, "checked when the app was built"
        password = os.environ.get(config.password_env) or None
        return RedisStore(url, password=password, key_prefix=config.key_prefix, timeout_s=config.timeout_s)
    from deployments.store import HandleStore

    assert embedded is not None, "build_app binds the store deployment"
    return HandleStore(embedded)


def serve_http_host() -> str:
    """The address Serve's HTTP ingress listens on (`http_options.host`; its HAProxy too), or
    "an unknown address" when the controller cannot tell (through Serve's private client: no
    public API gives it; ray[serve] is pinned below 3)."""
    try:
        from ray.serve.context import _get_global_client

        client = _get_global_client()
        assert client is not None
        return str(ray.get(client._controller.get_http_config.remote(), timeout=10).host)
    except Exception:
        logger.warning("could not read Serve's HTTP options", exc_info=True)
        return "an unknown address"


SERVE_GRACEFUL_SHUTDOWN_S = 20.0  # Serve's default graceful_shutdown_timeout_s


def background_drain_s(config: AppConfig) -> float:
    """How long a stopping ingress replica waits for its background runs: the replica's
    graceful shutdown budget, less a margin for the rest of its shutdown (Serve kills it
    when the budget is spent; what is left by then is failed by lease expiry)."""
    budget = config.ingress.graceful_shutdown_timeout_s
    return max(1.0, (SERVE_GRACEFUL_SHUTDOWN_S if budget is None else budget) - 5.0)


@serve.ingress()
class ResponsesIngress:
    """Ray Serve deployment class; the app is built on the replica from the typed config."""

    def __init__(
        self,
        app_config: dict[str, Any],
        engines: dict[str, DeploymentHandle[EngineServer]],
        store: DeploymentHandle[StoreServer] | None = None,
        reasoning_key: str | None = None,
        tools: dict[str, DeploymentHandle[PythonToolServer | BrowserToolServer]] | None = None,
        embedding: DeploymentHandle[EmbeddingServer] | None = None,
    ) -> None:
        """`store`: the embedded store deployment, if configured. `reasoning_key`: the
        application's own key for encrypted reasoning, made by `build_app` so that all
        replicas share it; used only without configured keys. `tools`: the embedded
        built-in tools' deployments, by name (python, browser). `embedding`: the vector stores'
        served embedding model, if configured."""
        use_serve_logging()
        leave_batch_policy()  # on the request path
        self.config = AppConfig.model_validate(app_config)
        self.engines = engines
        self.store = store
        self.reasoning_key = reasoning_key
        self.tools = tools or {}
        self.embedding = embedding
        self._loop_lag: LoopLagProbe | None = None

    def __serve_build_asgi_app__(self) -> FastAPI:
        caller = ray.get_runtime_context().get_actor_name()
        availability = EngineAvailability({model.name: model.deployment_name for model in self.config.models})
        models = [
            served_model(model, HandleTokenSource(self.engines[model.name], caller), unavailable=availability.unavailable)
            for model in self.config.models
        ]
        settings = ServerSettings.from_config(
            self.config,
            listen_host=serve_http_host() if self.config.auth is None else None,
            # Serve's own id of this replica (its log file is named after it), not host:pid.
            replica_id=serve.get_replica_context().replica_id.unique_id,
            background_drain_s=background_drain_s(self.config),
            reasoning_keys=reasoning_keys(fallback=self.reasoning_key),
        )
        return create_app(
            models,
            settings,
            store=open_store(self.config.store, self.store),
            metrics=RayServeMetrics(),
            builtin_tools={name: _transport_factory(handle) for name, handle in self.tools.items()},
            embedder=self._embedder(),
        )

    def _embedder(self) -> HandleEmbedder | None:
        stores = self.config.vector_stores
        if self.embedding is None or stores is None:
            return None
        return HandleEmbedder(self.embedding, stores.embedding.model or "", stores.embedding.dimensions)

    async def loop_lag(self) -> dict[str, Any]:
        """The event loop's longest pause since the last call (the first call starts the probe,
        serve_app/runtime/loop_lag.py; for benchmarks)."""
        if self._loop_lag is None:
            self._loop_lag = LoopLagProbe()
        self._loop_lag.start()
        return asdict(self._loop_lag.take())

    async def memory(self, top: int = 8, trace_frames: int = 0, trim: bool = False) -> dict[str, Any]:
        """This replica's memory (deployments/memory.py; a measuring tool: not cheap)."""
        return memory_report(top, trace_frames, trim)

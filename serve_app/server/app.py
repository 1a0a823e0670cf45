"""The HTTP surface: a FastAPI app factory over token sources.

`create_app(models)` takes, per model name, something that turns a `GenerationRequest` into
`TokenBatch`es: a backend object in-process (tests, benchmarks, debugging) or a Ray Serve
deployment handle inside the `ResponsesIngress` deployment. Everything between the request
bytes and the SSE bytes is the same code in both cases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from openai.types import Model
from openai_harmony import Message, Role
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.api.errors import APIError, model_not_found, server_error
from serve_app.api.items import MessageItem
from serve_app.api.limits import DEFAULT_LIMITS, RequestLimits
from serve_app.api.request import ResponsesRequest
from serve_app.api.sse import encode_events
from serve_app.config import DEFAULT_SSE_KEEPALIVE_S, AuthConfig, ReplicaLimits, ToolsConfig
from serve_app.core.encrypted_reasoning import ReasoningCipher
from serve_app.core.stream import ResponseStream
from serve_app.core.tokens import TokenBatch, TokenSource
from serve_app.families.harmony import HarmonyParser, render_completion, render_prompt
from serve_app.runtime.admission import ByteBudget
from serve_app.runtime.background import BackgroundRuns, default_replica_id
from serve_app.runtime.metrics import GuardedMetrics, Metrics, NoMetrics, report_once, report_refusal
from serve_app.runtime.reasoning_keys import reasoning_keys as configured_reasoning_keys
from serve_app.runtime.turn import ModelFamily, ServedModel, Unavailable
from serve_app.server.auth import ANONYMOUS, AuthMiddleware, Keyring, warn_if_open
from serve_app.server.rate_headers import RateLimitHeaders
from serve_app.server.routes import background as background_routes
from serve_app.server.routes import conversations as conversations_routes
from serve_app.server.routes import input_tokens as input_tokens_routes
from serve_app.server.routes import responses as responses_routes
from serve_app.server.routes import websocket as websocket_routes
from serve_app.server.tenants import TenantState, prefix_cache_salt
from serve_app.state import BoundedStore, MemoryStore, ResponseStore, Store
from serve_app.state.connection import KeptBytes
from serve_app.state.conversations import ConversationStore
from serve_app.state.quotas import LeaseKeeper, QuotaLimits, TenantQuota
from serve_app.state.responses import DEFAULT_CACHE_BYTES, DEFAULT_TTL_S, TurnCache
from serve_app.state.runs import EVENTS_TTL_S, RunStore
from serve_app.tools.builtin.factory import builtin_factories
from serve_app.tools.builtin.transport import TransportFactory
from serve_app.tools.egress import Resolver
from serve_app.tools.mcp_client import ConnectPolicy, McpLimits
from serve_app.tools.remote_mcp import RemoteMcpFactory
from serve_app.tools.server_tools import ServerToolRuntime, ToolFactory

__all__ = ["ModelFamily", "ServedModel", "TokenSource", "Unavailable", "create_app"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
DEFAULT_STORE_TIMEOUT_S = 2.0
SWEEP_EVERY_S = 10.0
DEFAULT_BACKGROUND_DRAIN_S = 15.0  # within Serve's default graceful_shutdown_timeout_s (20 s)


def create_app(
    models: Sequence[ServedModel],
    *,
    store: Store | None = None,
    store_timeout_s: float = DEFAULT_STORE_TIMEOUT_S,
    store_ttl_s: float = DEFAULT_TTL_S,
    store_cache_bytes: int = DEFAULT_CACHE_BYTES,
    auth: AuthConfig | None = None,
    environ: Mapping[str, str] | None = None,
    listen_host: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    request_limits: RequestLimits = DEFAULT_LIMITS,
    replica_limits: ReplicaLimits | None = None,
    replica_id: str | None = None,
    background_drain_s: float = DEFAULT_BACKGROUND_DRAIN_S,
    reasoning_keys: Sequence[str] | None = None,
    metrics: Metrics | None = None,
    max_stream_duration_s: float | None = None,
    sse_keepalive_s: float | None = DEFAULT_SSE_KEEPALIVE_S,
    tools: ToolsConfig | None = None,
    server_tools: ServerToolRuntime | None = None,
    builtin_tools: Mapping[str, TransportFactory] | None = None,
) -> FastAPI:
    """`store`: where responses are kept (default: this process's memory, for one replica);
    `store_cache_bytes`: this replica's cache of finished turns (`TurnCache`; 0: none).
    `reasoning_keys`: Fernet keys sealing reasoning items' `encrypted_content` (the first
    encrypts); None: `RESPONSES_SERVE_REASONING_KEYS`, else a key of this process.
    `max_stream_duration_s`: a response generating longer is ended with `response.failed`.
    `sse_keepalive_s`: a stream quiet this long gets an SSE comment (None or 0: never).
    `request_limits`: what one request may hold (api/limits.py); `replica_limits`: what this
    replica takes on at once (config.ReplicaLimits).
    `auth`: API keys and tenants (None: open, one anonymous tenant; a warning if `listen_host`
    is given and is not a loopback address); keys named by `key_env` are read from `environ`
    (default: this process's environment) now, and a missing one fails here.
    `tools`: server-side tools (`builtin_tools`: how the embedded built-in tools are reached,
    by name; deployments/ passes their deployments' handles)."""
    _warm_up()
    keyring = Keyring.from_config(auth, os.environ if environ is None else environ) if auth is not None else None
    if auth is None and listen_host is not None:
        warn_if_open(listen_host)
    served = {model.name: model for model in models}
    app = FastAPI(title="responses-serve", docs_url=None, redoc_url=None, lifespan=_drain_background_runs)
    # What the routers read (serve_app/server/routes/): every store call is time-bounded.
    app.state.served = served
    app.state.store = BoundedStore(store if store is not None else MemoryStore(), store_timeout_s)
    app.state.max_request_bytes = max_request_bytes
    app.state.request_limits = request_limits
    app.state.replica_limits = replica_limits = replica_limits or ReplicaLimits()
    app.state.websocket_turns = KeptBytes(replica_limits.max_websocket_kept_bytes)  # all connections' kept turns
    app.state.request_bytes = ByteBudget(replica_limits.max_request_bytes_in_flight)  # bodies read, parsed; WebSocket requests
    app.state.metrics = metrics = GuardedMetrics(metrics or NoMetrics())
    app.state.leases = LeaseKeeper(app.state.store)  # this replica's quota leases, renewed while held
    keys = list(reasoning_keys or configured_reasoning_keys())
    cipher = ReasoningCipher(keys)
    # Without tenants, one shared prefix cache (no salt): the anonymous caller is everyone.
    salt_key = keys[0] if auth is not None else None
    tenants = _tenant_states(app.state.store, auth, store_ttl_s, store_cache_bytes, replica_id, metrics, app.state.leases, cipher, salt_key)
    app.state.tenants = tenants
    app.state.background_drain_s = background_drain_s
    app.state.max_stream_duration_s = max_stream_duration_s
    app.state.sse_keepalive_s = sse_keepalive_s
    app.state.websockets_open = 0  # connections to /v1/responses (routes/websocket.py)
    app.state.websockets_by_tenant = {}  # of them, each tenant's (bounded with `auth`: replica_limits.max_websockets_per_tenant)
    app.state.tenanted = auth is not None
    app.state.server_tools = server_tools or server_tool_runtime(tools or ToolsConfig(), metrics, app.state.store, builtin_tools)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        report_once(metrics, getattr(request.state, "trace", None), "rejected", exc.code)
        report_refusal(metrics, request.scope, exc)
        return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"{exc.detail}: {request.method} {request.url.path}"
        error = APIError(message, status_code=exc.status_code, code=None)
        return JSONResponse(error.body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error")
        error = server_error("The server had an error while processing your request.")
        report_once(metrics, getattr(request.state, "trace", None), "rejected", error.code)
        return JSONResponse(error.body(), status_code=500)

    # Pure ASGI: streams pass through untouched. The last added runs first: the auth middleware
    # names the tenant (without keys, the anonymous one), whose responses then get its rate headers.
    app.add_middleware(RateLimitHeaders, quotas={name: state.quota for name, state in tenants.items()})
    app.add_middleware(AuthMiddleware, keyring=keyring)

    @app.get("/health")
    async def health() -> dict[str, str]:
        """Liveness: 200 while this process serves HTTP, whatever its models' state."""
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: 200 when every model has a running engine replica, else 503 naming
        the models that are loading or unavailable, and why."""
        states = {name: await model_state(model) for name, model in served.items()}
        all_ready = all(state["status"] == "ready" for state in states.values())
        body = {"status": "ready" if all_ready else "not_ready", "models": states}
        return JSONResponse(body, status_code=200 if all_ready else 503)

    async def model_entry(model: ServedModel) -> dict[str, Any]:
        entry = Model(id=model.name, object="model", created=0, owned_by=model.owned_by).model_dump()
        return {**entry, **await model_state(model)}  # `status` beside the SDK's fields (its Model keeps extras)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [await model_entry(m) for m in served.values()]}

    @app.get("/v1/models/{model:path}")  # `path`: a model name may hold "/" (org/model)
    async def retrieve_model(model: str) -> dict[str, Any]:
        if model not in served:
            raise model_not_found(model)
        return await model_entry(served[model])

    app.include_router(input_tokens_routes.router)  # before /v1/responses/{response_id}
    app.include_router(responses_routes.router)
    app.include_router(websocket_routes.router)
    app.include_router(background_routes.router)
    app.include_router(conversations_routes.router)
    return app


async def model_state(model: ServedModel) -> dict[str, str]:
    """`{"status": "ready"}`, or `loading` / `unavailable` with the reason."""
    why = await model.unavailable(model.name) if model.unavailable is not None else None
    return {"status": "ready"} if why is None else {"status": why.status, "reason": why.reason}


def _tenant_states(
    store: Store,
    auth: AuthConfig | None,
    ttl_s: float,
    cache_bytes: int,
    replica_id: str | None,
    metrics: Metrics,
    leases: LeaseKeeper,
    cipher: ReasoningCipher,
    salt_key: str | None,
) -> dict[str, TenantState]:
    """Every tenant's state, made once per replica: the configured tenants, or the anonymous one
    (`salt_key`: what the tenants' prefix-cache salts are derived from; None: no salts)."""
    cache = TurnCache(cache_bytes) if cache_bytes else None
    replica_id = replica_id or default_replica_id()
    tenants: dict[str, TenantState] = {}

    def running(_: int) -> None:  # the replica's background runs, all tenants'
        metrics.background_runs(sum(state.background.running for state in tenants.values()))

    for name in auth.tenants if auth is not None else [ANONYMOUS]:
        responses = ResponseStore(store, name, ttl_s, cache)
        tiers = frozenset(auth.tenant_tiers(name)) if auth is not None else None
        background = BackgroundRuns(responses, RunStore(store, name, min(ttl_s, EVENTS_TTL_S)), replica_id=replica_id, on_running=running)
        limits = auth.tenant_limits(name) if auth is not None else None
        quota = None
        if limits is not None and any(value is not None for value in limits.model_dump().values()):
            quota = TenantQuota(store, name, QuotaLimits(**limits.model_dump()), leases)
        sealed_for = name if auth is not None else None  # without tenants, blobs are as they always were
        tenants[name] = TenantState(
            name,
            responses,
            ConversationStore(store, name, ttl_s),
            background,
            tiers,
            quota,
            cipher.for_tenant(sealed_for),
            prefix_cache_salt(salt_key, name) if salt_key is not None else None,
        )
    return tenants


def server_tool_runtime(
    config: ToolsConfig,
    metrics: Metrics,
    store: Store | None = None,
    builtin: Mapping[str, TransportFactory] | None = None,
    resolver: Resolver | None = None,
) -> ServerToolRuntime:
    """The server-side tools of `tools:` config: the request's remote MCP servers and the
    built-in tools (`builtin`: the embedded ones' transports, by name: python, browser).
    `store`: the app's (containers are recorded for their tenant; default: this process's
    memory); `resolver`: host names to
    addresses (tests)."""
    mcp = config.mcp
    remote = RemoteMcpFactory(
        ConnectPolicy(mcp.allowed_urls, resolver),
        McpLimits(mcp.connect_timeout_s, mcp.call_timeout_s, mcp.max_output_bytes),
        report=metrics.tool_call_finished,
    )
    factories: list[ToolFactory] = [remote, *builtin_factories(config.builtin, store or MemoryStore(), builtin, resolver)]
    return ServerToolRuntime(factories, max_calls=config.max_calls_per_response, report=metrics.tool_call_finished)


@contextlib.asynccontextmanager
async def _drain_background_runs(app: FastAPI) -> AsyncGenerator[None, None]:
    """While up, sweep for background runs whose replica is gone; on shutdown (Serve runs the
    ASGI lifespan when it stops a replica), wait for this replica's background runs: Serve's
    drain only counts HTTP requests."""
    runs: list[BackgroundRuns] = [state.background for state in app.state.tenants.values()]
    sweeper = asyncio.create_task(_sweep_forever(runs, SWEEP_EVERY_S))
    renewer = asyncio.create_task(app.state.leases.renew_forever())
    yield
    sweeper.cancel()
    renewer.cancel()
    await asyncio.gather(*(background.drain(app.state.background_drain_s) for background in runs))


async def _sweep_forever(runs: list[BackgroundRuns], every_s: float) -> None:
    """Every tenant's runs, swept every `every_s` seconds (`BackgroundRuns.sweep`), replicas out of step."""
    while True:
        await asyncio.sleep(every_s * random.uniform(0.5, 1.5))
        for background in runs:
            try:
                await background.sweep()
            except Exception:  # the store is down: next time
                logger.warning("background runs: sweep failed", exc_info=True)


def _warm_up() -> None:
    """Build the lazy pydantic schemas and the harmony encoding now, not on the first request."""
    request = ResponsesRequest(model="warm-up", input="warm up")
    render_prompt(request, [MessageItem(role="user", content="warm up")])
    completion = render_completion(
        [
            Message.from_role_and_content(Role.ASSISTANT, "thinking").with_channel("analysis"),
            Message.from_role_and_content(Role.ASSISTANT, "{}").with_channel("commentary").with_recipient("functions.f"),
            Message.from_role_and_content(Role.ASSISTANT, "answer").with_channel("final"),
        ]
    )
    stream = ResponseStream(request, parser_factory=HarmonyParser)
    encode_events(stream.start() + stream.feed(TokenBatch(completion, finish_reason="stop")))

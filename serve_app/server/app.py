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
from serve_app.api.filters import Filter
from serve_app.api.items import MessageItem
from serve_app.api.request import ResponsesRequest
from serve_app.api.sse import encode_events
from serve_app.config import FilesConfig, ToolsConfig
from serve_app.core.encrypted_reasoning import ReasoningCipher
from serve_app.core.stream import ResponseStream
from serve_app.core.tokens import TokenBatch, TokenSource
from serve_app.families.harmony import HarmonyParser, render_completion, render_prompt
from serve_app.retrieval.embeddings import Embedder
from serve_app.retrieval.index import Hit, Ranking
from serve_app.retrieval.stores import VectorStoreRecords
from serve_app.runtime.admission import ByteBudget
from serve_app.runtime.background import BackgroundRuns, default_replica_id
from serve_app.runtime.files import FileCache, FileInputs
from serve_app.runtime.metrics import GuardedMetrics, Metrics, NoMetrics, report_once, report_refusal
from serve_app.runtime.reasoning_keys import reasoning_keys as configured_reasoning_keys
from serve_app.runtime.turn import ModelFamily, ServedModel, Unavailable
from serve_app.runtime.vector_stores import TenantVectorStores, VectorStores, vector_store_service
from serve_app.server.auth import ANONYMOUS, AuthMiddleware, Keyring, warn_if_open
from serve_app.server.context import AppContext, app_context
from serve_app.server.openapi import install_openapi
from serve_app.server.rate_headers import RateLimitHeaders
from serve_app.server.routes import background as background_routes
from serve_app.server.routes import chat as chat_routes
from serve_app.server.routes import completions as completions_routes
from serve_app.server.routes import conversations as conversations_routes
from serve_app.server.routes import files as files_routes
from serve_app.server.routes import input_tokens as input_tokens_routes
from serve_app.server.routes import responses as responses_routes
from serve_app.server.routes import vector_stores as vector_stores_routes
from serve_app.server.routes import websocket as websocket_routes
from serve_app.server.settings import ServerSettings
from serve_app.server.tenants import TenantState, prefix_cache_salt
from serve_app.state import BoundedStore, MemoryStore, ResponseStore, Store
from serve_app.state.blobs import BlobStore
from serve_app.state.connection import KeptBytes
from serve_app.state.conversations import ConversationStore
from serve_app.state.files import FileStore, file_not_found
from serve_app.state.quotas import LeaseKeeper, QuotaLimits, TenantQuota
from serve_app.state.responses import TurnCache
from serve_app.state.runs import EVENTS_TTL_S, RunStore
from serve_app.state.tenancy import TenantStore
from serve_app.tools.browser.fetch import Fetcher, FetchLimits
from serve_app.tools.browser.policy import FetchPolicy, HostRules
from serve_app.tools.builtin.factory import builtin_factories
from serve_app.tools.builtin.transport import TransportFactory
from serve_app.tools.documents import DocumentLimits
from serve_app.tools.egress import Resolver
from serve_app.tools.file_search import FileSearchFactory, Searcher
from serve_app.tools.mcp_client import ConnectPolicy, McpLimits
from serve_app.tools.remote_mcp import RemoteMcpFactory
from serve_app.tools.server_tools import ServerToolRuntime, ToolFactory

__all__ = ["AppContext", "ModelFamily", "ServedModel", "ServerSettings", "TokenSource", "Unavailable", "create_app"]

logger = logging.getLogger(__name__)

SWEEP_EVERY_S = 10.0


def create_app(
    models: Sequence[ServedModel],
    settings: ServerSettings | None = None,
    *,
    store: Store | None = None,
    metrics: Metrics | None = None,
    environ: Mapping[str, str] | None = None,
    server_tools: ServerToolRuntime | None = None,
    builtin_tools: Mapping[str, TransportFactory] | None = None,
    blobs: BlobStore | None = None,
    resolver: Resolver | None = None,
    embedder: Embedder | None = None,
) -> FastAPI:
    """The app serving `models` as `settings` say (default: `ServerSettings()`, a test or
    in-process server's), over these collaborators:
    `store`: where responses are kept (default: this process's memory, for one replica);
    `metrics`: where requests are reported (default: nowhere);
    `environ`: where `settings.auth`'s `key_env` keys are read, now (default: this process's
    environment); a missing one fails here;
    `server_tools`: the server-side tools' runtime (default: made from `settings.tools`);
    `builtin_tools`: how the embedded built-in tools are reached, by name (deployments/ passes
    their deployments' handles);
    `blobs`: where uploaded files' contents are kept (default: `settings.files.blob`'s store);
    `resolver`: host names to addresses for `input_file` URLs (default: the machine's; tests).
    `embedder`: the embedding model of vector stores when it is served (deployments/ passes
    its `EmbeddingServer` deployment; default: as `settings.vector_stores` names it).
    What the routes share is one `AppContext` (server/context.py), the app's only state."""
    settings = settings or ServerSettings()
    _warm_up()
    auth = settings.auth
    keyring = Keyring.from_config(auth, os.environ if environ is None else environ) if auth is not None else None
    if auth is None and settings.listen_host is not None:
        warn_if_open(settings.listen_host)
    served = {model.name: model for model in models}
    app = FastAPI(title="responses-serve", docs_url=None, redoc_url=None, lifespan=_drain_background_runs)
    bounded = BoundedStore(store if store is not None else MemoryStore(), settings.store_timeout_s)
    guarded = GuardedMetrics(metrics or NoMetrics())
    leases = LeaseKeeper(bounded)
    keys = list(settings.reasoning_keys or configured_reasoning_keys())
    cipher = ReasoningCipher(keys)
    # Without tenants, one shared prefix cache (no salt): the anonymous caller is everyone.
    salt_key = keys[0] if auth is not None else None
    files = _FileServices(blobs if blobs is not None else settings.files.blob.blob_store(environ), settings.files, resolver)
    vector_stores = (
        vector_store_service(settings.vector_stores, embedder, tenanted=auth is not None) if settings.vector_stores is not None else None
    )
    tenants = _tenant_states(bounded, settings, guarded, leases, cipher, salt_key, files, vector_stores)
    replica_limits = settings.replica_limits
    app.state.context = AppContext(
        settings=settings,
        served=served,
        store=bounded,
        tenants=tenants,
        metrics=guarded,
        leases=leases,
        server_tools=server_tools
        or server_tool_runtime(settings.tools, guarded, bounded, builtin_tools, file_search=_file_search(tenants)),
        vector_stores=vector_stores,
        # With tenants, each holds at most its share of the request bytes (without, the one caller has them all).
        request_bytes=ByteBudget(
            replica_limits.max_request_bytes_in_flight,
            replica_limits.tenant_request_bytes(settings.max_request_bytes) if auth is not None else None,
        ),
        websocket_turns=KeptBytes(replica_limits.max_websocket_kept_bytes),
    )

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        report_once(guarded, getattr(request.state, "trace", None), "rejected", exc.code)
        report_refusal(guarded, request.scope, exc)
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
        report_once(guarded, getattr(request.state, "trace", None), "rejected", error.code)
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
    app.include_router(files_routes.router)
    app.include_router(vector_stores_routes.router)
    app.include_router(chat_routes.router)
    app.include_router(completions_routes.router)
    install_openapi(app, served, settings.request_limits)
    return app


async def model_state(model: ServedModel) -> dict[str, str]:
    """`{"status": "ready"}`, or `loading` / `unavailable` with the reason."""
    why = await model.unavailable(model.name) if model.unavailable is not None else None
    return {"status": "ready"} if why is None else {"status": why.status, "reason": why.reason}


def _tenant_states(
    store: Store,
    settings: ServerSettings,
    metrics: Metrics,
    leases: LeaseKeeper,
    cipher: ReasoningCipher,
    salt_key: str | None,
    files: _FileServices,
    vector_stores: VectorStores | None = None,
) -> dict[str, TenantState]:
    """Every tenant's state, made once per replica: the configured tenants, or the anonymous one
    (`salt_key`: what the tenants' prefix-cache salts are derived from; None: no salts)."""
    auth, ttl_s = settings.auth, settings.store_ttl_s
    cache = TurnCache(settings.store_cache_bytes) if settings.store_cache_bytes else None
    replica_id = settings.replica_id or default_replica_id()
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
        file_store = FileStore(store, name, files.blobs, limits=settings.files.limits(), ttl_s=settings.files.ttl_s)
        file_inputs = FileInputs(file_store, files.fetcher, files.limits, files.cache, tenant=name)
        tenants[name] = TenantState(
            name,
            responses,
            ConversationStore(store, name, ttl_s, settings.conversation_limits),
            background,
            tiers,
            quota,
            cipher.for_tenant(sealed_for),
            prefix_cache_salt(salt_key, name) if salt_key is not None else None,
            vector_stores=_tenant_vector_stores(vector_stores, store, name, quota, settings, file_store, file_inputs),
            files=file_store,
            file_inputs=file_inputs,
        )
    return tenants


def _tenant_vector_stores(
    service: VectorStores | None,
    store: Store,
    tenant: str,
    quota: TenantQuota | None,
    settings: ServerSettings,
    file_store: FileStore,
    file_inputs: FileInputs,
) -> TenantVectorStores | None:
    """The tenant's vector stores: its files read as the Files API reads them (`input_file`'s
    extraction and bounds), embedding counted in its quota."""
    if service is None or settings.vector_stores is None:
        return None
    records = VectorStoreRecords(TenantStore(store, tenant), stale_after_s=settings.vector_stores.ingest_timeout_s * 2)

    async def read(file_id: str) -> tuple[str, str]:
        file = await file_store.get(file_id)
        if file is None:
            raise file_not_found(file_id)
        extracted = await file_inputs.file_text(file_id, param="file_id")
        return file.filename, extracted.text

    async def charge(tokens: int) -> None:
        if quota is not None:
            await quota.charge(tokens_=tokens)

    async def exists(file_id: str) -> bool:
        return await file_store.get(file_id) is not None

    return service.for_tenant(records, read, charge, exists)


def _file_search(tenants: Mapping[str, TenantState]) -> FileSearchFactory:
    """`file_search` searches the calling tenant's vector stores."""

    def searcher(tenant: str) -> Searcher | None:
        state = tenants.get(tenant)
        stores = state.vector_stores if state is not None else None
        if stores is None:
            return None

        async def search(ids: Sequence[str], query: str, max_results: int, ranking: Ranking, filters: Filter | None) -> list[Hit]:
            return await stores.search(
                ids, query, max_results=max_results, ranking=ranking, filters=filters, param="tools.vector_store_ids"
            )

        return search

    return FileSearchFactory(searcher, enabled=any(state.vector_stores is not None for state in tenants.values()))


class _FileServices:
    """What every tenant's files share on this replica: the blob store, the fetcher of
    `file_url`s (the browser's egress policy, the config's own allow-list), the bounds of a
    file a model reads, and the cache of extracted texts and drawn pages."""

    def __init__(self, blobs: BlobStore, config: FilesConfig, resolver: Resolver | None) -> None:
        given = config.input
        self.blobs = blobs
        self.limits = DocumentLimits(given.max_bytes, given.max_pages, given.max_chars, given.max_inflated_bytes, given.timeout_s)
        self.fetcher = (
            Fetcher(
                FetchPolicy(HostRules(given.allow_hosts), resolver), FetchLimits(max_bytes=given.max_bytes, timeout_s=given.fetch_timeout_s)
            )
            if given.fetch_urls
            else None
        )
        self.cache = FileCache()


def server_tool_runtime(
    config: ToolsConfig,
    metrics: Metrics,
    store: Store | None = None,
    builtin: Mapping[str, TransportFactory] | None = None,
    resolver: Resolver | None = None,
    file_search: FileSearchFactory | None = None,
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
    factories.append(file_search or FileSearchFactory(lambda tenant: None, enabled=False))
    return ServerToolRuntime(factories, max_calls=config.max_calls_per_response, report=metrics.tool_call_finished)


@contextlib.asynccontextmanager
async def _drain_background_runs(app: FastAPI) -> AsyncGenerator[None, None]:
    """While up, sweep for background runs whose replica is gone; on shutdown (Serve runs the
    ASGI lifespan when it stops a replica), wait for this replica's background runs: Serve's
    drain only counts HTTP requests."""
    context = app_context(app)
    runs: list[BackgroundRuns] = [state.background for state in context.tenants.values()]
    sweeper = asyncio.create_task(_sweep_forever(runs, SWEEP_EVERY_S))
    renewer = asyncio.create_task(context.leases.renew_forever())
    yield
    sweeper.cancel()
    renewer.cancel()
    drain_s = context.settings.background_drain_s
    await asyncio.gather(*(background.drain(drain_s) for background in runs))
    if context.vector_stores is not None:  # files still queued stay in_progress until they read as failed
        await context.vector_stores.aclose()


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

"""What the routes of one app share: its `AppContext`, made once by `create_app` and kept as
the app's one attribute (`app.state.context`). A route reaches it through `app_context` (the
whole context) or `tenant_state` (the calling tenant's part), never through `app.state`."""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import HTTPConnection

from serve_app.runtime.admission import ByteBudget
from serve_app.runtime.metrics import GuardedMetrics
from serve_app.runtime.turn import ServedModel
from serve_app.runtime.vector_stores import VectorStores
from serve_app.server.auth import tenant_of
from serve_app.server.settings import ServerSettings
from serve_app.server.tenants import TenantState
from serve_app.state import BoundedStore
from serve_app.state.connection import KeptBytes
from serve_app.state.quotas import LeaseKeeper
from serve_app.tools.server_tools import ServerToolRuntime

__all__ = ["AppContext", "app_context", "tenant_state"]


@dataclass(slots=True, kw_only=True)
class AppContext:
    """One app's state, for its routes and its lifespan. The fields are set once by
    `create_app`; only the WebSocket counters change afterwards."""

    settings: ServerSettings
    """What the app was told (limits, timeouts, byte bounds): read, never changed."""

    served: dict[str, ServedModel]
    """The served models, by name (`ResponsesRequest.model`)."""

    store: BoundedStore
    """The store (responses, conversations, background runs, quotas), every call of it
    time-bounded (`settings.store_timeout_s`); the routes reach it through their tenant's
    views (`tenants`)."""

    tenants: dict[str, TenantState]
    """Every tenant's state on this replica, by name: the configured tenants, or the
    anonymous one without `settings.auth` (`tenant_state` picks the caller's)."""

    metrics: GuardedMetrics
    """Where requests, streams and tool calls are reported; a failing backend never fails
    a request."""

    leases: LeaseKeeper
    """This replica's quota leases, renewed while held (by the app's lifespan)."""

    server_tools: ServerToolRuntime
    """The server-side tools a response may call (the tool loop's): remote MCP servers and
    the built-in tools."""

    request_bytes: ByteBudget
    """Request bytes in flight on this replica: HTTP bodies while read and parsed, WebSocket
    messages until their response ends (`settings.replica_limits.max_request_bytes_in_flight`),
    and, with `settings.auth`, each tenant's share of them
    (`settings.replica_limits.max_request_bytes_in_flight_per_tenant`)."""

    websocket_turns: KeptBytes
    """The turns all WebSocket connections keep for their next turn, together
    (`settings.replica_limits.max_websocket_kept_bytes`)."""

    vector_stores: VectorStores | None = None
    """The vector stores' index, embedding model and ingestion workers (None: no Vector
    Stores API); each tenant's view is its `TenantState.vector_stores`."""

    websockets_open: int = 0
    """WebSocket connections to `/v1/responses` open now (routes/websocket.py), at most
    `settings.replica_limits.max_websockets`."""

    websockets_by_tenant: dict[str, int] = field(default_factory=dict)
    """Of them, each tenant's; with `settings.auth`, at most
    `settings.replica_limits.max_websockets_per_tenant` each."""

    @property
    def tenanted(self) -> bool:
        """Whether callers are tenants named by their API keys (`settings.auth`), not one
        anonymous caller."""
        return self.settings.auth is not None


def app_context(of: HTTPConnection | Starlette) -> AppContext:
    """The context of the app serving `of` (an HTTP request or a WebSocket), or of the app `of`."""
    app = of.app if isinstance(of, HTTPConnection) else of
    context = getattr(app.state, "context", None)
    if not isinstance(context, AppContext):
        raise TypeError(f"not an app made by create_app: its state holds no AppContext ({type(context).__name__})")
    return context


def tenant_state(connection: HTTPConnection) -> TenantState:
    """The calling tenant's state (HTTP request or WebSocket): the one the auth middleware
    put into the connection's scope."""
    return app_context(connection).tenants[tenant_of(connection.scope)]

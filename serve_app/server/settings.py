"""What an app made by `create_app` is told: one frozen, typed object of plain settings
(numbers, limits, config sections), as opposed to the runtime collaborators (the store
backend, metrics, tool transports) that `create_app` takes as keywords.

`ServerSettings()` is what tests and the in-process server use; `ServerSettings.from_config`
reads the application's config (`AppConfig`), the one place its fields become the server's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from serve_app.api.limits import DEFAULT_LIMITS, RequestLimits
from serve_app.config import DEFAULT_SSE_KEEPALIVE_S, AppConfig, AuthConfig, FilesConfig, ReplicaLimits, ToolsConfig, VectorStoresConfig
from serve_app.state.conversations import ConversationLimits
from serve_app.state.responses import DEFAULT_CACHE_BYTES, DEFAULT_TTL_S

__all__ = [
    "DEFAULT_BACKGROUND_DRAIN_S",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_STORE_TIMEOUT_S",
    "ServerSettings",
]

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
DEFAULT_STORE_TIMEOUT_S = 2.0
DEFAULT_BACKGROUND_DRAIN_S = 15.0  # within Serve's default graceful_shutdown_timeout_s (20 s)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSettings:
    """The settings of one app (one ingress replica); every field has the default of a test
    or in-process server. Read by the routes as `app_context(request).settings`."""

    store_timeout_s: float = DEFAULT_STORE_TIMEOUT_S
    """Longest a store call may take; past it the call fails as the store being down
    (`BoundedStore`): every store call of the routes is time-bounded."""

    store_ttl_s: float = DEFAULT_TTL_S
    """How long stored responses and conversations live (background runs' events: at most
    `state.runs.EVENTS_TTL_S`)."""

    store_cache_bytes: int = DEFAULT_CACHE_BYTES
    """This replica's cache of finished turns (`TurnCache`), shared by its tenants; 0: none."""

    conversation_limits: ConversationLimits = field(default_factory=ConversationLimits)
    """What one conversation may hold (`store.conversation_max_items`, `..._max_bytes`): an
    append past it is a 400."""

    auth: AuthConfig | None = None
    """API keys and their tenants. None: open, one anonymous tenant (and a warning if
    `listen_host` is given and is not a loopback address). Keys named by `key_env` are read
    from `create_app`'s `environ` when the app is made; a missing one fails there."""

    listen_host: str | None = None
    """The address the server listens on, only to warn when an open server (no `auth`) is
    reachable beyond this machine; None: not known, no warning."""

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    """Larger request bodies, and WebSocket messages, get a 413."""

    request_limits: RequestLimits = field(default_factory=lambda: DEFAULT_LIMITS)
    """What one request may hold (items, tools, schemas, strings, nesting; api/limits.py):
    over a limit, a 400 naming it."""

    replica_limits: ReplicaLimits = field(default_factory=ReplicaLimits)
    """What this replica takes on at once, whoever asks (config.ReplicaLimits): request bytes
    in flight, WebSocket connections and their kept turns, background runs, timeouts."""

    replica_id: str | None = None
    """This replica's name on the background runs it owns (another replica's sweep fails the
    runs of a replica that is gone); None: `runtime.background.default_replica_id()` (host:pid)."""

    background_drain_s: float = DEFAULT_BACKGROUND_DRAIN_S
    """On shutdown, how long the app waits for this replica's background runs to end."""

    reasoning_keys: Sequence[str] | None = field(default=None, repr=False)
    """Fernet keys sealing reasoning items' `encrypted_content`: the first encrypts, all
    decrypt; the first also keys the tenants' prefix-cache salts. None:
    `RESPONSES_SERVE_REASONING_KEYS`, else a key of this process (runtime/reasoning_keys.py).
    Secrets: left out of the repr."""

    max_stream_duration_s: float | None = None
    """A response generating longer is ended with `response.failed`; None: no bound."""

    sse_keepalive_s: float | None = DEFAULT_SSE_KEEPALIVE_S
    """A stream quiet this long gets an SSE comment line, so load balancers keep it open
    (None or 0: never)."""

    tools: ToolsConfig = field(default_factory=ToolsConfig)
    """The server-side tools the tool loop runs: remote MCP servers named by requests and the
    built-in tools (how the embedded ones are reached: `create_app`'s `builtin_tools`).
    Unused when `create_app` is given a ready `server_tools` runtime."""

    vector_stores: VectorStoresConfig | None = None
    """The Vector Stores API and `file_search` (None: off)."""
    files: FilesConfig = field(default_factory=FilesConfig)
    """The Files API and `input_file`: where contents are kept (unused when `create_app` is
    given a ready `blobs` store), a tenant's bounds, how much of a file a model reads."""

    @classmethod
    def from_config(
        cls,
        config: AppConfig,
        *,
        listen_host: str | None = None,
        replica_id: str | None = None,
        background_drain_s: float = DEFAULT_BACKGROUND_DRAIN_S,
        reasoning_keys: Sequence[str] | None = None,
    ) -> ServerSettings:
        """The settings `config` gives; the keywords are what a config does not hold, known
        only where the app runs (the ingress replica: its Serve replica id, Serve's listening
        address, its shutdown budget, the application's reasoning keys)."""
        return cls(
            store_timeout_s=config.store.timeout_s,
            store_ttl_s=config.store.ttl_s,
            store_cache_bytes=config.store.cache_bytes,
            conversation_limits=config.store.conversation_limits(),
            auth=config.auth,
            listen_host=listen_host,
            max_request_bytes=config.max_request_bytes,
            request_limits=config.request_limits,
            replica_limits=config.replica_limits,
            replica_id=replica_id,
            background_drain_s=background_drain_s,
            reasoning_keys=reasoning_keys,
            max_stream_duration_s=config.max_stream_duration_s,
            sse_keepalive_s=config.sse_keepalive_s,
            tools=config.tools,
            vector_stores=config.vector_stores,
            files=config.files,
        )

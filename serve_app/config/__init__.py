"""Typed configuration of the application: the `args` of a Serve config file (imports `state/`
and below), by section as the configuration page has them: `models`, `store`, `auth`, `tools`,
and here the app's own fields; `cluster.py`: where its Serve cluster starts.

    applications:
      - name: responses
        import_path: deployments.builder:build_app
        args: {models: [...], ingress: {...}}

Every field is checked when the application is built, so a typo fails `serve run` (and
CI) with a message naming the field, not a replica at runtime.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from serve_app.api.limits import RequestLimits
from serve_app.config.auth import APIKeyConfig, AuthConfig, TenantLimits
from serve_app.config.base import ConfigError, Strict, config_problems
from serve_app.config.files import BlobConfig, FileInputConfig, FilesConfig
from serve_app.config.models import (
    ChatTemplateConfig,
    CoalesceConfig,
    DeploymentConfig,
    EnginePlacement,
    ModelConfig,
    ReplayBackendConfig,
    RoutingConfig,
    SpeculativeConfig,
    VisionConfig,
    VLLMBackendConfig,
)
from serve_app.config.store import StoreConfig
from serve_app.config.tools import (
    BrowserToolConfig,
    BuiltinToolsConfig,
    ContainerLimits,
    EmbeddedBrowserConfig,
    EmbeddedPythonConfig,
    McpConfig,
    MiB,
    PythonToolConfig,
    SandboxLimits,
    ToolsConfig,
)
from serve_app.config.vector_stores import EmbeddingConfig, VectorStoresConfig

DEFAULT_MAX_STREAM_DURATION_S = 900.0
DEFAULT_SSE_KEEPALIVE_S = 15.0  # below the 60 s idle timeout of common load balancers
SHUTDOWN_MARGIN_S = 30.0


class ReplicaLimits(Strict):
    """What one ingress replica takes on at once, whoever asks: past a bound the request is
    refused at once with `Retry-After`: a 503 for the replica's bounds (retry later or
    elsewhere), a 429 for one connection's (it sends faster than it is served).
    (docs/overload.md lists every bound of the server.)"""

    max_request_bytes_in_flight: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="bytes of request bodies one replica reads and parses at once, and of its WebSocket requests queued or "
        "running (503 past it); at least max_request_bytes",
    )
    max_request_bytes_in_flight_per_tenant: int | None = Field(
        None,
        ge=1024,
        description="of them, what one tenant holds at once (429 past it), so that one tenant's slow bodies and queued "
        "WebSocket requests cannot take the whole budget; default: a quarter of max_request_bytes_in_flight, at least "
        "max_request_bytes; with `auth` only (without it, everyone is one tenant: max_request_bytes_in_flight applies)",
    )
    body_read_timeout_s: float = Field(
        60.0, gt=0, description="a request body not read whole within this (a client sending it slowly) is a 408; its bytes go back"
    )
    client_send_timeout_s: float = Field(
        60.0,
        gt=0,
        description="a client that takes nothing of its stream (SSE or WebSocket) for this long is dropped: its responses aborted",
    )
    max_background_runs: int = Field(64, ge=0, description="background responses running on one replica (503 past it)")
    max_websockets: int = Field(256, ge=0, description="WebSocket connections open on one replica (refused with 503)")
    max_websockets_per_tenant: int = Field(
        64,
        ge=0,
        description="WebSocket connections one tenant holds open on one replica (refused with 429), so that one tenant's idle "
        "connections cannot take every place; with `auth` only (without it, everyone is one tenant: max_websockets applies)",
    )
    max_websocket_kept_bytes: int = Field(
        512 * 1024 * 1024,
        ge=0,
        description="turns all of a replica's WebSocket connections keep for their next turns, as stored records; past it, "
        "the least recently used lanes of the connection that adds one go",
    )
    max_lanes_per_connection: int = Field(
        64, ge=1, description="lanes (stream_id) with responses running or queued on one connection (429)"
    )
    max_kept_bytes_per_connection: int = Field(
        64 * 1024 * 1024, ge=0, description="turns one WebSocket connection keeps (its LRU lanes go)"
    )
    max_queued_per_lane: int = Field(16, ge=0, description="response.create messages waiting behind a lane's running one (429 past it)")
    max_queued_per_connection: int = Field(64, ge=0, description="response.create messages waiting on one connection, all lanes (429)")

    def tenant_request_bytes(self, max_request_bytes: int) -> int:
        """One tenant's share of `max_request_bytes_in_flight`: as configured, else a quarter of
        it; never below one request of `max_request_bytes` (the largest must fit), never above
        the replica's budget."""
        budget = self.max_request_bytes_in_flight
        share = self.max_request_bytes_in_flight_per_tenant
        return min(budget, max(max_request_bytes, budget // 4 if share is None else share))


class AppConfig(Strict):
    """The application: its models, the `ResponsesIngress` deployment in front of them, who may
    call it (`auth`) and the store shared by every ingress replica."""

    # A config error must not print what it was given: a key pasted where it does not belong.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    models: list[ModelConfig] = Field(min_length=1, description="the served models; names unique")
    ingress: DeploymentConfig = Field(
        default_factory=lambda: DeploymentConfig(max_ongoing_requests=1024),
        description="Serve options of the `ResponsesIngress` deployment (CPU: HTTP, rendering, parsing)",
    )
    auth: AuthConfig | None = Field(None, description="API keys and their tenants (none: open, one anonymous tenant)")
    api_key: Any = Field(None, description="not supported: use `auth` (a key's value is never written in the config)", exclude=True)
    max_request_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="larger request bodies (and WebSocket messages) get 413")
    request_limits: RequestLimits = Field(
        default_factory=RequestLimits,
        description="what one request may hold (items, tools, schemas, strings, nesting): over a limit, a 400 naming it",
    )
    replica_limits: ReplicaLimits = Field(
        default_factory=ReplicaLimits,
        description="what one ingress replica takes on at once: past a bound, a 503 (or 429) with Retry-After",
    )
    store: StoreConfig = Field(default_factory=StoreConfig, description="where stored responses, background runs and conversations live")
    max_stream_duration_s: float = Field(
        DEFAULT_MAX_STREAM_DURATION_S,
        gt=0,
        description="longest a response may generate; a replica picked for downscaling waits this long (plus a margin) for its streams",
    )
    sse_keepalive_s: float = Field(
        DEFAULT_SSE_KEEPALIVE_S,
        ge=0,
        description="a stream with nothing to send this long gets an SSE comment line, so load balancers keep it open (0: never)",
    )
    tools: ToolsConfig = Field(
        default_factory=ToolsConfig,
        description="server-side tools the tool loop runs inside a response: remote MCP servers named by requests",
    )
    files: FilesConfig = Field(
        default_factory=FilesConfig,
        description="the Files API (/v1/files) and `input_file`: where contents are kept, a tenant's bounds, what a model reads",
    )
    vector_stores: VectorStoresConfig | None = Field(
        None, description="the Vector Stores API and the file_search tool (none: both off, file_search left out of responses)"
    )

    @field_validator("api_key")
    @classmethod
    def _no_plain_text_key(cls, value: Any) -> None:
        if value is not None:
            raise ValueError(
                "a plain-text api_key is not supported (it would sit in the config file and in Ray's stored deployment "
                "arguments). Write instead:  auth: {keys: [{tenant: <name>, key_env: <ENV_VAR holding the key>}]}  "
                "(or key_sha256: <hex SHA-256 of the key>)"
            )
        return

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        for names in ([m.name for m in models], [m.deployment_name for m in models]):
            if len(set(names)) != len(names):
                raise ValueError(
                    f"model names must be unique (also after replacing characters other than letters, digits, '_', '.', '-'), got {names}"
                )
        return models

    @model_validator(mode="after")
    def _one_request_fits(self) -> AppConfig:
        if self.replica_limits.max_request_bytes_in_flight < self.max_request_bytes:
            raise ValueError("replica_limits.max_request_bytes_in_flight must be at least max_request_bytes: the largest request must fit")
        share = self.replica_limits.max_request_bytes_in_flight_per_tenant
        if share is not None and not self.max_request_bytes <= share <= self.replica_limits.max_request_bytes_in_flight:
            raise ValueError(
                "replica_limits.max_request_bytes_in_flight_per_tenant must be at least max_request_bytes (the largest request "
                "must fit) and at most replica_limits.max_request_bytes_in_flight"
            )
        return self

    @model_validator(mode="after")
    def _store_serves_every_replica(self) -> AppConfig:
        ingress = self.ingress
        several = ingress.autoscaling_config is not None or ingress.num_replicas not in (None, 1)
        if self.store.type == "memory" and several:
            raise ValueError(
                "store type 'memory' keeps responses inside one ingress replica, but ingress runs "
                f"{'autoscaled' if ingress.autoscaling_config is not None else ingress.num_replicas} replicas: a follow-up "
                "landing on another replica would not find them. Set store: {type: embedded} (one cluster) or "
                "store: {type: redis, url: ...}, or ingress.num_replicas: 1"
            )
        return self

    @model_validator(mode="after")
    def _drain_outlasts_streams(self) -> AppConfig:
        """Set Serve's drain of the ingress and engine replicas from the longest stream."""
        budget = self.max_stream_duration_s + SHUTDOWN_MARGIN_S
        for name, deployment in [("ingress", self.ingress), *((f"models[{m.name!r}].engine", m.engine) for m in self.models)]:
            given = deployment.graceful_shutdown_timeout_s
            if given is None:
                deployment.graceful_shutdown_timeout_s = budget
            elif given < self.max_stream_duration_s:
                raise ValueError(
                    f"{name}.graceful_shutdown_timeout_s ({given:g} s) is shorter than max_stream_duration_s "
                    f"({self.max_stream_duration_s:g} s): a replica scaled down would cut its streams. "
                    "Leave it out (it defaults to max_stream_duration_s plus a margin) or raise it"
                )
        return self


__all__ = [
    "DEFAULT_MAX_STREAM_DURATION_S",
    "DEFAULT_SSE_KEEPALIVE_S",
    "SHUTDOWN_MARGIN_S",
    "APIKeyConfig",
    "AppConfig",
    "AuthConfig",
    "BlobConfig",
    "BrowserToolConfig",
    "BuiltinToolsConfig",
    "ChatTemplateConfig",
    "CoalesceConfig",
    "ConfigError",
    "ContainerLimits",
    "DeploymentConfig",
    "EmbeddedBrowserConfig",
    "EmbeddedPythonConfig",
    "EmbeddingConfig",
    "EnginePlacement",
    "FileInputConfig",
    "FilesConfig",
    "McpConfig",
    "MiB",
    "ModelConfig",
    "PythonToolConfig",
    "ReplayBackendConfig",
    "ReplicaLimits",
    "RoutingConfig",
    "SandboxLimits",
    "SpeculativeConfig",
    "StoreConfig",
    "Strict",
    "TenantLimits",
    "ToolsConfig",
    "VLLMBackendConfig",
    "VectorStoresConfig",
    "VisionConfig",
    "config_problems",
]

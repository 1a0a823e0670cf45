"""Where state is kept: the embedded store deployment or Redis/Valkey."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from serve_app.config.base import Strict
from serve_app.config.models import DeploymentConfig
from serve_app.state.conversations import DEFAULT_MAX_BYTES, DEFAULT_MAX_ITEMS, ConversationLimits
from serve_app.state.responses import DEFAULT_CACHE_BYTES


class StoreConfig(Strict):
    """Where stored responses (and everything else that outlives a request) are kept.

    embedded: a store deployment of its own in this Serve app (one replica, in memory,
      bounded, lost when it restarts); every ingress replica on any node reaches it.
    redis: a Redis or Valkey server (production: survives restarts, shared by apps).
    memory: each ingress replica's own memory: one replica only (tests, debugging).
    """

    type: Literal["embedded", "redis", "memory"] = Field("embedded", description="the backend, see above")
    url: str | None = Field(None, description="redis: redis://host:6379/0 (default: $REDIS_URL); no password in it")
    password_env: str = Field("REDIS_PASSWORD", description="redis: the environment variable holding the password, if any")
    key_prefix: str = Field("responses-serve:", min_length=1, description="redis: prefix of every key (apps sharing a server differ here)")
    ttl_s: float = Field(30 * 24 * 3600.0, gt=0, description="how long a stored response is kept (OpenAI: 30 days)")
    max_entries: int = Field(100_000, ge=1, description="embedded/memory: keys kept; the oldest go first")
    max_bytes: int = Field(1 << 30, ge=1024, description="embedded/memory: bytes of keys and values kept; the oldest go first")
    timeout_s: float = Field(2.0, gt=0, description="every store call ends within this; a store slower than that is down (503)")
    cache_bytes: int = Field(
        DEFAULT_CACHE_BYTES,
        ge=0,
        description="each ingress replica keeps the finished turns it wrote or read (up to these stored bytes): a "
        "previous_response_id chain is then read from the store one new turn at a time, not whole (0: off)",
    )
    conversation_max_items: int = Field(
        DEFAULT_MAX_ITEMS,
        ge=1,
        description="items one conversation may hold; an append past it (POST .../items, or a turn with `conversation`) is a 400 "
        "(a turn let in may land its output past it: the next is refused)",
    )
    conversation_max_bytes: int = Field(
        DEFAULT_MAX_BYTES,
        ge=1024,
        description="bytes of items (as stored) one conversation may hold; past it, as for conversation_max_items",
    )
    deployment: DeploymentConfig = Field(
        default_factory=lambda: DeploymentConfig(num_replicas=1, max_ongoing_requests=100_000, ray_actor_options={"num_cpus": 0}),
        description="embedded: Serve options of the store deployment (always one replica)",
    )

    @field_validator("url")
    @classmethod
    def _no_password_in_url(cls, url: str | None) -> str | None:
        if url is not None:
            from urllib.parse import urlsplit

            if urlsplit(url).password:
                raise ValueError(
                    "put the Redis password in the environment variable named by password_env (e.g. from a Kubernetes Secret), not in url"
                )
        return url

    @model_validator(mode="after")
    def _one_store_replica(self) -> StoreConfig:
        if self.deployment.num_replicas not in (None, 1) or self.deployment.autoscaling_config is not None:
            raise ValueError("the embedded store runs exactly one replica: leave store.deployment.num_replicas at 1, without autoscaling")
        return self

    def conversation_limits(self) -> ConversationLimits:
        return ConversationLimits(self.conversation_max_items, self.conversation_max_bytes)

    def redis_url(self) -> str | None:
        import os

        return self.url or os.environ.get("REDIS_URL")

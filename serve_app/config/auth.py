"""API keys, tenants and their limits."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import Field, model_validator

from serve_app.api.service_tier import ServiceTier
from serve_app.config.base import Strict

TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
ENV_VAR_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


class TenantLimits(Strict):
    """A tenant's quotas, across every ingress replica (serve_app/state/quotas.py). Each is
    optional: no limit when absent."""

    requests_per_minute: int | None = Field(
        None, ge=1, description="requests (POST /v1/responses) in any 60 s: a token bucket of this size refilled at this rate"
    )
    tokens_per_minute: int | None = Field(
        None, ge=1, description="input + output tokens in any 60 s, a token bucket as above; output tokens count as they are produced"
    )
    max_concurrent_requests: int | None = Field(
        None, ge=1, description="open streams + in-flight non-streaming requests + running background responses"
    )
    max_background: int | None = Field(None, ge=1, description="background responses queued or running")


class APIKeyConfig(Strict):
    """One API key and the tenant it acts for. The key itself is never in the config: it is
    read from the environment variable `key_env` when a replica starts (in Kubernetes, from a
    Secret), or only its SHA-256 is known (`key_sha256`). Several keys may share a tenant; the
    tenant's `limits` and `service_tiers` may be given on any one of them (they must agree)."""

    tenant: str = Field(pattern=TENANT_PATTERN, description="the tenant this key acts for: everything it stores belongs to the tenant")
    key_env: str | None = Field(None, pattern=ENV_VAR_PATTERN, description="the environment variable holding the key")
    key_sha256: str | None = Field(
        None, pattern=r"^[0-9a-fA-F]{64}$", description="the hex SHA-256 of the key (`printf %s KEY | sha256sum`)"
    )
    limits: TenantLimits | None = Field(None, description="the tenant's quotas (default: none)")
    service_tiers: list[ServiceTier] | None = Field(
        None,
        description="the service_tier values this tenant may ask for; any other is served as `default` (and the response says so). "
        "Default: every tier but `priority`",
    )

    @model_validator(mode="after")
    def _one_source(self) -> APIKeyConfig:
        if (self.key_env is None) == (self.key_sha256 is None):
            raise ValueError(f"tenant {self.tenant!r}: give the key as exactly one of key_env (an environment variable) or key_sha256")
        return self


class AuthConfig(Strict):
    """API keys: with this section, every route but the health check needs a key
    (`Authorization: Bearer <key>`), and each key acts for a tenant. Without it the server is
    open and everyone is one anonymous tenant."""

    keys: list[APIKeyConfig] = Field(min_length=1, description="the accepted keys; several may act for one tenant")

    @model_validator(mode="after")
    def _tenants_agree(self) -> AuthConfig:
        for field in ("limits", "service_tiers"):
            given: dict[str, Any] = {}
            for key in self.keys:
                value = getattr(key, field)
                if value is not None and given.setdefault(key.tenant, value) != value:
                    raise ValueError(f"the keys of tenant {key.tenant!r} give different {field}: give them once, or the same on every key")
        return self

    def tenant_limits(self, tenant: str) -> TenantLimits:
        return next((key.limits for key in self.keys if key.tenant == tenant and key.limits is not None), TenantLimits())

    def tenant_tiers(self, tenant: str) -> list[ServiceTier]:
        tiers = next((key.service_tiers for key in self.keys if key.tenant == tenant and key.service_tiers is not None), None)
        return tiers if tiers is not None else [tier for tier in get_args(ServiceTier) if tier != "priority"]

    @property
    def tenants(self) -> list[str]:
        return list(dict.fromkeys(key.tenant for key in self.keys))

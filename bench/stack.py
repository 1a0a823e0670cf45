"""Throughput and time-to-first-event of the whole stack, side by side in one run.

    python -m bench.stack [--duration 8] [--streams 1,64]

Configurations (replay backend at zero step delay, same request everywhere):
  (a) Ray Serve over HTTP, coalescing on      (once per Serve HTTP mode measured)
  (b) Ray Serve over HTTP, coalescing off
  (c) the same FastAPI app in-process under uvicorn, no Ray
Each Serve mode is a fresh `serve run` in a subprocess; the load generator (aiohttp, N
concurrent streaming requests in a loop) runs in this process. Prints a table, writes
bench/results/stack.png and stack.json, and ends with
`serve_vs_inprocess=<(a)/(c) at the highest stream count> tokens_per_s=<(a) there>`,
(a) being the best Serve HTTP mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

RESULTS = Path(__file__).parent / "results"
# ~1,000 output tokens per response (the replay echoes the input), a typical answer length.
PROMPT = ("Benchmarking the Responses stack: tokens flow from the engine to the client. " * 64).strip()
SERVE_MODES = {
    "proxy": {},  # Serve's default HTTP proxy actor
    "direct-ingress": {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},  # ingress replicas serve HTTP themselves
}


def make_serve_env() -> dict[str, str]:
    """The environment `responses-serve run` (and so `make serve`) starts Serve with
    (`cluster_env`: Serve's HAProxy ingress, our HAProxy); an exported value wins."""
    from serve_app.config.cluster import cluster_env

    return {**os.environ, **cluster_env()}


def serve_config(port: int, models: list[dict], ingress: dict, **args) -> dict:
    """A Serve config file (as a dict) for `serve run`: our app with these args (any further
    `args` of the app as keywords), quiet logs."""
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "logging_config": {"log_level": "WARNING", "enable_access_log": False},
        "applications": [
            {
                "name": "responses",
                "route_prefix": "/",
                "import_path": "deployments.builder:build_app",
                "args": {"models": models, "ingress": ingress, **args},
            }
        ],
    }


def replay_models() -> tuple[list[dict], dict]:
    engine = {"num_replicas": 1, "max_ongoing_requests": 1024, "ray_actor_options": {"num_cpus": 0}}
    backend = {"type": "replay", "step_delay_ms": 0}
    models = [
        {"name": "replay-coalesced", "backend": backend, "engine": engine},
        {"name": "replay-raw", "backend": backend, "engine": engine, "coalesce": {"enabled": False}},
    ]
    return models, engine


def wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 240, path: str = "/ready") -> None:
    """Until `url + path` answers 200: our readiness route, every model's engine up (`/health`
    answers while engines still load, and requests then get 503 model_unavailable)."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}{path}", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:  # not up yet, or 503: not ready
            pass
        time.sleep(1)
    raise RuntimeError(f"{url}{path} did not answer 200 within {timeout_s:.0f} s")


def stop(process: subprocess.Popen) -> None:
    """Stop a server: SIGTERM to it, then, after 60 s, SIGKILL to it or, if it was started in
    a session of its own (`start_new_session`), to its whole process group.

    `serve run` and vLLM's server both shut down cleanly on SIGTERM, HAProxy included (SIGINT
    is ignored by a server started from a non-interactive shell's background job). The kill is
    the fallback only: Ray's actors run in process groups of their own, and an HAProxy that
    Serve started outlives a killed Ray (holding its ports)."""
    process.send_signal(signal.SIGTERM)  # a no-op once the process has exited
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(process.pid) == process.pid:
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
        process.wait()


async def one_request(session: aiohttp.ClientSession, url: str, model: str) -> tuple[float, int]:
    """Time to first event, output tokens of one streamed response."""
    start = time.perf_counter()
    first = None
    tail = b""
    async with session.post(f"{url}/v1/responses", json={"model": model, "input": PROMPT, "stream": True}) as response:
        assert response.status == 200, await response.text()
        async for chunk in response.content.iter_any():
            if first is None:
                first = time.perf_counter() - start
            tail = (tail + chunk)[-65536:]
    terminal = tail.rsplit(b"data: ", 1)[1]
    event = json.loads(terminal)
    assert event["type"] == "response.completed", event["type"]
    return first, event["response"]["usage"]["output_tokens"]


async def load(url: str, model: str, streams: int, duration_s: float) -> dict:
    ttfts: list[float] = []
    tokens = 0
    connector = aiohttp.TCPConnector(limit=streams + 8)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await one_request(session, url, model)  # warm-up
        stop_at = time.perf_counter() + duration_s

        async def worker() -> None:
            nonlocal tokens
            while time.perf_counter() < stop_at:
                ttft, count = await one_request(session, url, model)
                ttfts.append(ttft)
                tokens += count

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        elapsed = time.perf_counter() - start
    ttfts.sort()
    return {
        "tokens_per_s": tokens / elapsed,
        "requests": len(ttfts),
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "ttft_p99_ms": 1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
    }


def measure(url: str, model: str, stream_counts: list[int], duration_s: float) -> dict[int, dict]:
    return {n: asyncio.run(load(url, model, n, duration_s)) for n in stream_counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per measurement")
    parser.add_argument("--streams", default="1,64", help="concurrent streams, comma-separated")
    parser.add_argument("--modes", default=",".join(SERVE_MODES), help="Serve HTTP modes to measure")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    stream_counts = [int(n) for n in args.streams.split(",")]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    url = f"http://127.0.0.1:{args.port}"
    results: dict[str, dict[int, dict]] = {}

    print("(c) in-process uvicorn, no Ray ...", flush=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "serve_app.server.local", "--port", str(args.port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(url, process)
        results["(c) in-process"] = measure(url, "gpt-oss-replay", stream_counts, args.duration)
    finally:
        stop(process)

    for mode in args.modes.split(","):
        print(f"Ray Serve, HTTP mode {mode} ...", flush=True)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as config:
            yaml.safe_dump(serve_config(args.port, *replay_models()), config)
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "serve"), "run", config.name],
            env={**env, **SERVE_MODES[mode]},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_ready(url, process)
            results[f"(a) serve {mode}, coalescing on"] = measure(url, "replay-coalesced", stream_counts, args.duration)
            results[f"(b) serve {mode}, coalescing off"] = measure(url, "replay-raw", stream_counts, args.duration)
        finally:
            stop(process)
            os.unlink(config.name)

    top = max(stream_counts)
    print(f"\n{'configuration':<40}{'streams':>8}{'tokens/s':>11}{'req/s':>8}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}")
    for name, by_count in results.items():
        for n, row in by_count.items():
            print(
                f"{name:<40}{n:>8}{row['tokens_per_s']:>11.0f}{row['requests'] / args.duration:>8.1f}{row['ttft_p50_ms']:>13.1f}{row['ttft_p99_ms']:>13.1f}"
            )
    best = max((k for k in results if k.startswith("(a)")), key=lambda k: results[k][top]["tokens_per_s"])
    inprocess = results["(c) in-process"]
    print(f"\nbest Serve mode: {best}")
    print(
        f"TTFT p50 at 1 stream: (a) {results[best][min(stream_counts)]['ttft_p50_ms']:.1f} ms vs (c) {inprocess[min(stream_counts)]['ttft_p50_ms']:.1f} ms"
    )

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "stack.json").write_text(json.dumps(results, indent=2))
    plot(results, stream_counts, RESULTS / "stack.png")
    ratio = results[best][top]["tokens_per_s"] / inprocess[top]["tokens_per_s"]
    print(f"serve_vs_inprocess={ratio:.2f} tokens_per_s={results[best][top]['tokens_per_s']:.0f}")


def plot(results: dict[str, dict[int, dict]], stream_counts: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(stream_counts)
    for i, n in enumerate(stream_counts):
        positions = [x + i * width for x in range(len(names))]
        axes[0].bar(positions, [results[k][n]["tokens_per_s"] for k in names], width, label=f"{n} streams")
        axes[1].bar(positions, [results[k][n]["ttft_p50_ms"] for k in names], width, label=f"{n} streams")
    for axis, title in zip(axes, ("output tokens/s (higher is better)", "time to first event p50, ms")):
        axis.set_title(title)
        axis.set_xticks([x + width * (len(stream_counts) - 1) / 2 for x in range(len(names))])
        axis.set_xticklabels([k.replace(", ", "\n").replace(") serve ", ")\nserve ") for k in names], fontsize=7)
        axis.legend()
    fig.suptitle("bench.stack: replay backend at zero step delay, 2-core machine")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

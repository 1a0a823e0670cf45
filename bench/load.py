"""Load: N concurrent streaming clients against a running server, every stream checked.

    python -m bench.load [--url http://127.0.0.1:8000/v1] [--model gpt-oss-replay]
                         [--concurrency 1,16,64,256] [--repeats 2]
    python -m bench.load --serve bench/load-serve.yaml      # starts (and stops) the server itself

At each concurrency C, C clients each send `--requests-per-client` streaming requests one
after another (a progress bar counts them). Every stream goes through the contract validator
(`tests/support/contract.py`) and the lost-token check; the figures per level are TTFT (request sent
-> first text delta), ITL (gaps between successive SSE chunks that carry deltas, as vLLM's
benchmark defines it; a chunk is one engine batch) at p50/p90/p99, output tokens/s and
requests/s. The whole ramp runs `--repeats` times; the ingress and engine replicas report
their own memory (`memory()`, deployments/memory.py: RSS, glibc heap in use and free, gc
objects, with `--tracemalloc` Python-traced memory and the allocation sites that grew)
before the first run and after each, so growth across runs shows. Reading it joins the
server's Ray cluster (`--ray-address`, `auto`: the one on this machine, e.g. `make serve`).

Lost tokens (harmony models, e.g. gpt-oss-replay): the items the deltas carried, rendered back
into harmony completion tokens (analysis / final / commentary messages, `<|return|>` or
`<|call|>` at the end), must be exactly `usage.output_tokens` tokens. Other model families
report `lost=n/a`.

Writes bench/results/load.json and load.png; the last line is
`violations=N lost=N tokens_per_s@C=... ttft_p50_ms@C=... itl_p99_ms@C=... rss_growth_mb=...
heap_growth_mb=... traced_growth_mb=... objects_growth=...` (after run 1 -> after the last run,
summed over the replicas).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil
import yaml
from tqdm import tqdm

from bench.stack import make_serve_env, stop, wait_ready
from tests.support.contract import check_stream, parse_sse

RESULTS = Path(__file__).parent / "results"
# ~300 output tokens per response: the replay model echoes the input after a short analysis.
PROMPT = "Load test: every token must arrive, in order, exactly once. " * 24


@dataclass
class StreamResult:
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)  # between delta-carrying chunks
    output_tokens: int = 0
    violation: str | None = None
    lost: int | None = None  # None: not checkable for this model


def harmony_tokens(events: list[dict]) -> int:
    """Completion tokens of the items the deltas carried, rendered back into harmony."""
    from openai_harmony import Message, Role

    from serve_app.families.harmony import render_completion

    texts: dict[int, str] = {}
    items: dict[int, dict] = {}
    for event in events:
        if event["type"].endswith(".delta"):
            texts[event["output_index"]] = texts.get(event["output_index"], "") + event["delta"]
        elif event["type"] == "response.output_item.added":
            items[event["output_index"]] = event["item"]
    messages = []
    for index, item in sorted(items.items()):
        text = texts.get(index, "")
        message = Message.from_role_and_content(Role.ASSISTANT, text)
        if item["type"] == "reasoning":
            messages.append(message.with_channel("analysis"))
        elif item["type"] == "message":
            messages.append(message.with_channel("final"))
        else:  # function_call: a commentary message to functions.NAME, JSON arguments
            recipient = f"{item['namespace']}.{item['name']}" if item.get("namespace") else f"functions.{item['name']}"
            messages.append(message.with_channel("commentary").with_recipient(recipient).with_content_type("<|constrain|>json"))
    return len(render_completion(messages)) if messages else 0


async def one_stream(session: aiohttp.ClientSession, url: str, body: dict, harmony: bool) -> StreamResult:
    result = StreamResult()
    start = time.perf_counter()
    last_delta_at = None
    raw = bytearray()
    try:
        async with session.post(f"{url}/responses", json=body) as response:
            if response.status != 200:
                result.violation = f"HTTP {response.status}: {(await response.text())[:200]}"
                return result
            async for chunk in response.content.iter_any():
                now = time.perf_counter()
                raw += chunk
                if b"_text.delta" in chunk or b"arguments.delta" in chunk:
                    if last_delta_at is None:
                        result.ttft_s = now - start
                    else:
                        result.gaps_s.append(now - last_delta_at)
                    last_delta_at = now
        events = parse_sse(bytes(raw))
        terminal = check_stream(events)
        result.output_tokens = terminal.usage.output_tokens
        if terminal.status != "completed":
            result.violation = f"status {terminal.status}"
        elif harmony:
            result.lost = terminal.usage.output_tokens - harmony_tokens(events)
    except AssertionError as exc:
        result.violation = f"contract: {exc}"[:300]
    except Exception as exc:
        result.violation = f"{type(exc).__name__}: {exc}"[:300]
    return result


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def level(url: str, model: str, concurrency: int, per_client: int, harmony: bool, store: bool, progress: tqdm) -> dict:
    connector = aiohttp.TCPConnector(limit=concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=600)
    results: list[StreamResult] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client(index: int) -> None:
            for turn in range(per_client):
                body = {"model": model, "input": f"client {index} turn {turn}. {PROMPT}", "stream": True, "store": store}
                results.append(await one_stream(session, url, body, harmony))
                progress.update(1)

        start = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - start
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
    gaps = [g for r in results for g in r.gaps_s]
    violations = [r.violation for r in results if r.violation]
    lost = [abs(r.lost) for r in results if r.lost is not None]
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "seconds": elapsed,
        "tokens_per_s": sum(r.output_tokens for r in results) / elapsed,
        "requests_per_s": len(results) / elapsed,
        **{f"ttft_p{q}_ms": 1000 * percentile(ttfts, q / 100) for q in (50, 90, 99)},
        **{f"itl_p{q}_ms": 1000 * percentile(gaps, q / 100) for q in (50, 90, 99)},
        "violations": len(violations),
        "first_violation": violations[0] if violations else None,
        "lost_tokens": sum(lost) if harmony else None,
    }


class ReplicaMemory:
    """Each replica's own memory report (`memory()`, deployments/memory.py) through Serve
    handles: this process joins the server's Ray cluster as a driver. One replica per
    deployment is read (the handle picks it; run one replica each to follow one process)."""

    def __init__(self, address: str, app: str, deployments: list[str], trace_frames: int, trim: bool) -> None:
        import ray
        from ray import serve

        for name, value in (("RAY_AUTH_MODE", "disabled"), ("RAY_USAGE_STATS_ENABLED", "0")):
            os.environ.setdefault(name, value)
        ray.init(address=address, log_to_driver=False, logging_level="WARNING")
        self.handles = {name: serve.get_deployment_handle(name, app_name=app) for name in deployments}
        self.trace_frames, self.trim = trace_frames, trim

    def close(self) -> None:
        import ray

        ray.shutdown()  # before the server goes: a driver of a cluster going down logs errors

    def read(self) -> dict[str, dict]:
        return {
            name: handle.memory.remote(trace_frames=self.trace_frames, trim=self.trim).result(timeout_s=120)
            for name, handle in self.handles.items()
        }


def cluster_address(server: subprocess.Popen, timeout_s: float = 60) -> str:
    """The GCS address of the cluster `serve run` started (its raylet's `--gcs-address`): on
    a shared machine `auto` may find another cluster."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in psutil.Process(server.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                for argument in child.cmdline():
                    if argument.startswith("--gcs-address="):
                        return argument.split("=", 1)[1]
        time.sleep(0.5)
    raise RuntimeError("no raylet under the server's process tree")


def start_server(config: Path, port: int) -> subprocess.Popen:
    with open(config) as source:
        settings = yaml.safe_load(source)
    settings["http_options"] = {**settings.get("http_options", {}), "host": "127.0.0.1", "port": port}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as written:
        yaml.safe_dump(settings, written)
    env = make_serve_env()  # HTTP through Serve's HAProxy ingress, as `make serve` runs
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "serve"), "run", written.name],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="gpt-oss-replay")
    parser.add_argument("--concurrency", default="1,16,64,256", help="comma-separated levels, in order")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="runs of the whole ramp (memory growth shows across them)")
    parser.add_argument(
        "--store",
        action="store_true",
        help="store the responses (for previous_response_id); off by default: the store's memory grows by design, up to its bound",
    )
    parser.add_argument("--serve", type=Path, help="a Serve config to start with `serve run` (its port is replaced)")
    parser.add_argument("--port", type=int, default=8766, help="HTTP port for --serve")
    parser.add_argument(
        "--ray-address",
        default="auto",
        help="the server's Ray cluster, to read the replicas' memory (`none`: skip); with --serve, the one it started",
    )
    parser.add_argument("--app", default="responses", help="the Serve application's name (as in the config)")
    parser.add_argument(
        "--tracemalloc", type=int, default=0, metavar="FRAMES", help="trace Python allocations in the replicas from the first reading on"
    )
    parser.add_argument(
        "--malloc-trim", action="store_true", help="after each reading, have the replicas return free heap to the OS (malloc_trim)"
    )
    args = parser.parse_args()
    levels = [int(n) for n in args.concurrency.split(",")]
    harmony = "gpt-oss" in args.model

    process = None
    url = args.url
    if args.serve:
        process = start_server(args.serve, args.port)
        url = f"http://127.0.0.1:{args.port}/v1"
    try:
        if process is not None:
            wait_ready(url.removesuffix("/v1"), process)
        replicas = None
        if process is not None and args.ray_address != "none":
            args.ray_address = cluster_address(process)
        if args.ray_address != "none":
            from serve_app.config import ModelConfig

            deployments = [ModelConfig(name=args.model).deployment_name, "ResponsesIngress"]
            try:
                replicas = ReplicaMemory(args.ray_address, args.app, deployments, args.tracemalloc, args.malloc_trim)
            except ConnectionError as exc:  # a server elsewhere: its cluster is not reachable from here
                print(f"replica memory not read ({exc}); --ray-address none skips it", file=sys.stderr)
        runs, memory = [], [replicas.read() if replicas else {}]
        for repeat in range(args.repeats):
            rows = []
            for concurrency in levels:
                total = concurrency * args.requests_per_client
                with tqdm(total=total, desc=f"run {repeat + 1} C={concurrency}", unit="req", leave=False) as progress:
                    rows.append(asyncio.run(level(url, args.model, concurrency, args.requests_per_client, harmony, args.store, progress)))
            runs.append(rows)
            memory.append(replicas.read() if replicas else {})
            RESULTS.mkdir(exist_ok=True)  # so far (a long series can be followed, or cut short)
            (RESULTS / "load.json").write_text(json.dumps({"runs": runs, "memory": memory}, indent=2))
        if replicas:
            replicas.close()
    finally:
        if process is not None:
            stop(process)

    report(runs, memory, args, harmony)


MEMORY_COLUMNS = (
    ("RSS", "rss_mb"),
    ("anon", "anon"),
    ("file", "file"),
    ("shmem", "shmem"),
    ("heap", "in_use_mb"),
    ("free", "free_mb"),
    ("traced", "traced_mb"),
)


def memory_figure(reading: dict, key: str) -> float:
    if key in ("in_use_mb", "free_mb"):
        value = (reading.get("malloc") or {}).get(key)
    elif key in ("anon", "file", "shmem"):
        value = (reading.get("rss_kinds_mb") or {}).get(key)
    else:
        value = reading.get(key)
    return float("nan") if value is None else value


def report(runs: list[list[dict]], memory: list[dict[str, dict]], args, harmony: bool) -> None:
    header = f"{'run':>3}{'C':>5}{'reqs':>6}{'tok/s':>9}{'req/s':>7}{'TTFT p50':>10}{'p90':>8}{'p99':>8}{'ITL p50':>9}{'p90':>7}{'p99':>7}{'viol':>6}{'lost':>6}"
    print(f"\nbench.load: model={args.model}, {args.requests_per_client} streaming requests per client, store={args.store}; times in ms")
    print(header)
    for number, rows in enumerate(runs, start=1):
        for r in rows:
            lost = "n/a" if r["lost_tokens"] is None else r["lost_tokens"]
            print(
                f"{number:>3}{r['concurrency']:>5}{r['requests']:>6}{r['tokens_per_s']:>9.0f}{r['requests_per_s']:>7.1f}"
                f"{r['ttft_p50_ms']:>10.1f}{r['ttft_p90_ms']:>8.1f}{r['ttft_p99_ms']:>8.1f}"
                f"{r['itl_p50_ms']:>9.1f}{r['itl_p90_ms']:>7.1f}{r['itl_p99_ms']:>7.1f}{r['violations']:>6}{lost:>6}"
            )
            if r["first_violation"]:
                print(f"      first violation: {r['first_violation']}")
    names = sorted(memory[0]) if memory and memory[0] else []
    for name in names:
        print(
            f"\n{name} (pid {memory[0][name]['pid']}): MB (RSS and its anon/file/shmem pages; malloc heap in use, freed but held; Python traced), gc objects, threads, established TCP connections"
        )
        print(
            f"  {'':<12}"
            + "".join(f"{title:>8}" for title, _ in MEMORY_COLUMNS)
            + f"{'objects':>10}{'threads':>8}{'TCP':>6}"
            + ("  RSS after trim" if args.malloc_trim else "")
        )
        for index, snapshot in enumerate(memory):
            reading = snapshot[name]
            label = "before" if index == 0 else f"after run {index}"
            figures = "".join(f"{memory_figure(reading, key):>8.1f}" for _, key in MEMORY_COLUMNS)
            trimmed = f"{reading['rss_after_trim_mb']:>16.1f}" if "rss_after_trim_mb" in reading else ""
            print(
                f"  {label:<12}{figures}{reading['objects']:>10}{reading.get('threads', '?'):>8}{reading.get('tcp_connections', '?'):>6}{trimmed}"
            )
            if index > 1:  # what grew since the previous reading, after the warm-up run
                grew = ", ".join(f"{t} {n:+d}" for t, n in reading.get("types_grew", {}).items())
                print(f"      objects grew: {grew or '-'}")
                for line in reading.get("lines_grew", [])[:3]:
                    print(f"      {line}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "load.json").write_text(json.dumps({"runs": runs, "memory": memory}, indent=2))
    plot(runs, memory, args.model, RESULTS / "load.png")

    violations = sum(r["violations"] for rows in runs for r in rows)
    lost = "n/a" if not harmony else sum(r["lost_tokens"] for rows in runs for r in rows)
    top = runs[-1][-1]
    # Growth from after the first run (warm: caches, pools filled) to after the last.
    growth = "rss_growth_mb=n/a"
    if len(memory) > 2 and names:
        warm, last = memory[1], memory[-1]
        figures = []
        for label, key, digits in (
            ("rss_growth_mb", "rss_mb", 0),
            ("anon_growth_mb", "anon", 1),
            ("heap_growth_mb", "in_use_mb", 1),
            ("traced_growth_mb", "traced_mb", 2),
        ):
            grew = sum(memory_figure(last[n], key) - memory_figure(warm[n], key) for n in names)
            if grew == grew:  # not NaN: measured (no traced figures unless tracing)
                figures.append(f"{label}={grew:+.{digits}f}")
        figures.append(f"objects_growth={sum(last[n]['objects'] - warm[n]['objects'] for n in names):+d}")
        growth = " ".join(figures)
    c = top["concurrency"]
    print(
        f"violations={violations} lost={lost} tokens_per_s@{c}={top['tokens_per_s']:.0f} ttft_p50_ms@{c}={top['ttft_p50_ms']:.0f} "
        f"ttft_p99_ms@{c}={top['ttft_p99_ms']:.0f} itl_p50_ms@{c}={top['itl_p50_ms']:.1f} itl_p99_ms@{c}={top['itl_p99_ms']:.1f} "
        f"{growth}"
    )


def plot(runs: list[list[dict]], memory: list[dict[str, dict]], model: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for number, rows in enumerate(runs, start=1):
        levels = [r["concurrency"] for r in rows]
        axes[0].plot(levels, [r["tokens_per_s"] for r in rows], marker="o", label=f"run {number}")
    for metric, color in (("ttft", "tab:blue"), ("itl", "tab:orange")):
        for q, style in ((50, "-"), (90, ":"), (99, "--")):
            axes[1].plot(levels, [r[f"{metric}_p{q}_ms"] for r in runs[-1]], style, color=color, marker="o", label=f"{metric.upper()} p{q}")
    axes[0].set_title("output tokens/s")
    axes[1].set_title(f"latency, ms (log), run {len(runs)}")
    axes[1].set_yscale("log")
    for axis in axes[:2]:
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent streams")
        axis.legend(fontsize=7)
    if memory and memory[0]:
        names = sorted(memory[0])
        labels = ["before"] + [f"after {i}" for i in range(1, len(memory))]
        for name, color in zip(names, ("tab:blue", "tab:orange", "tab:green")):
            axes[2].plot(labels, [m[name]["rss_mb"] for m in memory], marker="o", color=color, label=f"{name} RSS")
            axes[2].plot(
                labels, [memory_figure(m[name], "in_use_mb") for m in memory], "--", marker=".", color=color, label=f"{name} heap in use"
            )
        axes[2].legend(fontsize=7)
        axes[2].tick_params(axis="x", labelsize=7, rotation=45)
    axes[2].set_title("replica memory, MB")
    fig.suptitle(f"bench.load: {model}, streaming, every stream contract-checked")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

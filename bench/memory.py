"""Does the app itself keep memory across load runs? `python -m bench.memory`

Serves the FastAPI app in a child process (uvicorn, no Ray: both replay models at 10 ms
per engine step, responses not stored) with `tracemalloc` on, drives the ramp of
`bench.load` against it several times, and after each run has the child collect garbage
and report its resident memory, the Python memory `tracemalloc` traces, the number of
objects the garbage collector tracks, and the lines whose allocations grew most since the
previous run. Growth after the first (warm-up) run that Python can see points at a leak in
our code; RSS growth that it cannot see is the allocator or native libraries.

Last line: `violations=N rss_growth_mb=X traced_growth_kb=X objects_growth=N` (after run 1
→ after the last run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time

from tqdm import tqdm

from bench.load import level

MODEL = "gpt-oss-replay"
TOP_LINES = 5


def serve_child(port: int) -> None:
    """The child: serve the app, then answer each line on stdin with a JSON measurement
    (`deployments/memory.py`'s report, the one Serve replicas give bench.load)."""
    import uvicorn

    from deployments.memory import memory_report
    from serve_app.server.app import create_app
    from serve_app.server.local import replay_models

    server = uvicorn.Server(uvicorn.Config(create_app(replay_models(10.0)), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    print(json.dumps({"ready": True}), flush=True)
    for _ in sys.stdin:
        # The first reading starts tracing: after the imports and start-up, not what we look for.
        report = memory_report(top=TOP_LINES, trace_frames=4)
        print(
            json.dumps(
                {
                    "rss_mb": report["rss_mb"],
                    "traced_kb": report["traced_mb"] * 2**10,
                    "objects": report["objects"],
                    "grew": report.get("lines_grew", []),
                }
            ),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--concurrency", default="64,256", help="comma-separated levels, one ramp per run")
    parser.add_argument("--requests-per-client", type=int, default=1)
    parser.add_argument("--port", type=int, default=8767)
    parser.add_argument("--serve-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_child:
        serve_child(args.port)
        return

    child = subprocess.Popen(
        [sys.executable, "-m", "bench.memory", "--serve-child", "--port", str(args.port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def measure() -> dict:
        child.stdin.write("measure\n")
        child.stdin.flush()
        return json.loads(child.stdout.readline())

    url = f"http://127.0.0.1:{args.port}/v1"
    levels = [int(n) for n in args.concurrency.split(",")]
    try:
        assert json.loads(child.stdout.readline()).get("ready")
        readings, violations = [measure()], 0
        for run in range(1, args.runs + 1):
            for concurrency in levels:
                total = concurrency * args.requests_per_client
                with tqdm(total=total, desc=f"run {run} C={concurrency}", unit="req", leave=False) as progress:
                    row = asyncio.run(level(url, MODEL, concurrency, args.requests_per_client, True, False, progress))
                violations += row["violations"]
            readings.append(measure())
    finally:
        child.kill()

    print(f"\nbench.memory: {args.runs} runs of C={args.concurrency}, {args.requests_per_client} request(s) per client, in-process app")
    print(f"{'':<14}{'RSS MB':>8}{'traced kB':>11}{'objects':>9}")
    for index, reading in enumerate(readings):
        label = "before" if index == 0 else f"after run {index}"
        print(f"{label:<14}{reading['rss_mb']:>8.0f}{reading['traced_kb']:>11.0f}{reading['objects']:>9}")
        for line in reading["grew"] if index > 1 else []:
            print(f"    {line}")
    warm, last = readings[1], readings[-1]
    print(
        f"violations={violations} rss_growth_mb={last['rss_mb'] - warm['rss_mb']:+.0f} "
        f"traced_growth_kb={last['traced_kb'] - warm['traced_kb']:+.0f} objects_growth={last['objects'] - warm['objects']:+d}"
    )


if __name__ == "__main__":
    main()

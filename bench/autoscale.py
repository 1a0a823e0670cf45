"""Autoscaling under a load ramp: replicas scale up and back down, no stream is cut.

    python -m bench.autoscale            # full: streams of ~60 s, about 5 minutes
    python -m bench.autoscale --short    # the test's version, about 2 minutes

A local Ray cluster and Serve app (127.0.0.1 only) with autoscaling on the engine and the
ingress (min 1, max 3, small targets, short delays); the replay backend with a step delay,
so every stream lasts long. A load generator ramps concurrent streams up, holds, ramps down;
each stream is read to its end and checked by the event contract (tests/contract.py) and
for its text. Replicas per deployment (`serve.status()`) and open streams are sampled every
second. Streams still running when a replica of their deployment is stopping (picked for
downscaling, draining) are counted. Writes bench/results/autoscale.png and autoscale.json;
the last line is
`failed_streams=N peak_replicas=N peak_engine_replicas=N peak_ingress_replicas=N ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from tests.contract import check_stream, parse_sse

RESULTS = Path(__file__).parent / "results"
MODEL = "replay-slow"
ENGINE = "EngineServer-" + MODEL
INGRESS = "ResponsesIngress"


@dataclass(frozen=True)
class Plan:
    streams: int  # concurrent streams at the hold
    ramp_up_s: float
    hold_s: float
    ramp_down_s: float
    words: int  # words of input echoed back (about 9 output tokens each: reasoning and answer), one token per engine step
    step_delay_ms: float
    settle_s: float  # after the load, how long to wait for the replicas to come back to 1


FULL = Plan(streams=9, ramp_up_s=30, hold_s=60, ramp_down_s=30, words=40, step_delay_ms=200, settle_s=90)  # streams of ~70 s
SHORT = Plan(streams=8, ramp_up_s=8, hold_s=12, ramp_down_s=8, words=20, step_delay_ms=100, settle_s=60)  # streams of ~18 s


def app_args(plan: Plan) -> dict:
    autoscaling = {
        "min_replicas": 1,
        "max_replicas": 3,
        "target_ongoing_requests": 2,  # reachable on this box: 3 replicas at 6 open streams
        "upscale_delay_s": 2,
        "downscale_delay_s": 5,
        "metrics_interval_s": 0.5,
        "look_back_period_s": 2,
    }
    deployment = {"autoscaling_config": autoscaling, "max_ongoing_requests": 32, "ray_actor_options": {"num_cpus": 0}}
    return {
        "models": [
            {
                "name": MODEL,
                "backend": {"type": "replay", "step_delay_ms": plan.step_delay_ms, "min_step_tokens": 1, "max_step_tokens": 1},
                "engine": deployment,
            }
        ],
        "ingress": deployment,
        # The drain budget (Serve's graceful_shutdown_timeout_s) comes from this.
        "max_stream_duration_s": 2 * 10 * plan.words * plan.step_delay_ms / 1000 + 30,
    }


@dataclass
class Tally:
    started: int = 0
    completed: int = 0
    failures: list[str] = field(default_factory=list)
    open: int = 0
    durations: list[float] = field(default_factory=list)
    open_while_stopping: int = 0  # streams that were open at a sample where a replica was stopping
    _seen_stopping: set[int] = field(default_factory=set)


async def one_stream(session: aiohttp.ClientSession, url: str, index: int, plan: Plan, tally: Tally, open_ids: set[int]) -> None:
    text = " ".join(f"w{index}x{i}" for i in range(plan.words))
    started = time.monotonic()  # counted as started and open by the caller, at once
    try:
        async with session.post(f"{url}/responses", json={"model": MODEL, "input": text, "stream": True}) as response:
            raw = await response.read()
            if response.status != 200:
                raise AssertionError(f"HTTP {response.status}: {raw[:200]!r}")
        terminal = check_stream(parse_sse(raw))
        assert terminal.status == "completed", f"ended {terminal.status}"
        assert terminal.output_text == text, "text differs from the input it echoes"
        tally.completed += 1
        tally.durations.append(time.monotonic() - started)
    except Exception as exc:  # every way a stream can go wrong is a failed stream
        tally.failures.append(f"stream {index}: {type(exc).__name__}: {exc}"[:300])
    finally:
        tally.open -= 1
        open_ids.discard(index)


def target_streams(plan: Plan, t: float) -> int:
    """Concurrent streams wanted at `t` s into the load: up, hold, down."""
    if t < plan.ramp_up_s:
        return 1 + int((plan.streams - 1) * t / plan.ramp_up_s)
    t -= plan.ramp_up_s
    if t < plan.hold_s:
        return plan.streams
    t -= plan.hold_s
    if t < plan.ramp_down_s:
        return max(1, plan.streams - int(plan.streams * t / plan.ramp_down_s))
    return 0


def replica_counts() -> dict[str, dict[str, int]]:
    from ray import serve

    deployments = serve.status().applications["responses"].deployments
    return {name: dict(deployments[name].replica_states) for name in (ENGINE, INGRESS)}


async def run_load(url: str, plan: Plan, counts_of=replica_counts) -> tuple[Tally, list[dict]]:
    tally, samples, open_ids, tasks = Tally(), [], set(), set()
    load_s = plan.ramp_up_s + plan.hold_s + plan.ramp_down_s
    begin = time.monotonic()
    connector = aiohttp.TCPConnector(limit=plan.streams * 2 + 8)
    timeout = aiohttp.ClientTimeout(total=app_args(plan)["max_stream_duration_s"] + 60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        index = 0
        settled_at = None
        while True:
            t = time.monotonic() - begin
            # Starts: keep `target_streams` open while the load runs.
            while t < load_s and tally.open < target_streams(plan, t):
                tally.started += 1
                tally.open += 1
                open_ids.add(index)
                tasks.add(asyncio.create_task(one_stream(session, url, index, plan, tally, open_ids)))
                index += 1
            tasks = {task for task in tasks if not task.done()}
            counts = await asyncio.to_thread(counts_of)
            if any(states.get("STOPPING") for states in counts.values()):
                tally._seen_stopping |= open_ids
            samples.append({"t": round(t, 2), "open_streams": tally.open, "replicas": counts})
            running = {name: states.get("RUNNING", 0) for name, states in counts.items()}
            if t >= load_s and not tasks:
                if all(n == 1 for n in running.values()) and not any(s.get("STOPPING") for s in counts.values()):
                    break  # scaled back down
                settled_at = settled_at or time.monotonic()
                if time.monotonic() - settled_at > plan.settle_s:
                    break
            if t > load_s + plan.settle_s + app_args(plan)["max_stream_duration_s"] + 60:
                tally.failures.append("the load did not end in time")
                break
            await asyncio.sleep(1.0)
        for task in tasks:
            task.cancel()
    tally.open_while_stopping = len(tally._seen_stopping)
    return tally, samples


def plot(samples: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    for name, label in ((ENGINE, "engine"), (INGRESS, "ingress")):
        top.step(t, [s["replicas"][name].get("RUNNING", 0) for s in samples], where="post", label=f"{label} running")
        top.step(t, [s["replicas"][name].get("STOPPING", 0) for s in samples], where="post", linestyle=":", label=f"{label} stopping")
    top.set_ylabel("replicas")
    top.legend(loc="upper right", fontsize=8)
    bottom.plot(t, [s["open_streams"] for s in samples], color="black")
    bottom.set_ylabel("open streams")
    bottom.set_xlabel("seconds")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", action="store_true", help="short streams and phases (the test's version)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where autoscale.png/json go")
    args = parser.parse_args()
    plan = SHORT if args.short else FULL
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    import ray
    from ray import serve

    from serve_app.app import build_app

    temp_dir = tempfile.mkdtemp(prefix="ray-autoscale-", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(app_args(plan)), name="responses", route_prefix="/")
        tally, samples = asyncio.run(run_load(f"http://127.0.0.1:{port}/v1", plan))
    finally:
        ray.shutdown()

    peak = {name: max(s["replicas"][name].get("RUNNING", 0) for s in samples) for name in (ENGINE, INGRESS)}
    final = {name: samples[-1]["replicas"][name].get("RUNNING", 0) for name in (ENGINE, INGRESS)}
    longest = max(tally.durations, default=0.0)
    summary = {
        "plan": plan.__dict__,
        "streams": tally.started,
        "completed": tally.completed,
        "failed_streams": len(tally.failures),
        "failures": tally.failures[:20],
        "peak_engine_replicas": peak[ENGINE],
        "peak_ingress_replicas": peak[INGRESS],
        "final_engine_replicas": final[ENGINE],
        "final_ingress_replicas": final[INGRESS],
        "streams_open_while_a_replica_stopped": tally.open_while_stopping,
        "longest_stream_s": round(longest, 1),
        "samples": samples,
    }
    name = "autoscale-short" if args.short else "autoscale"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(summary, indent=1))
    plot(samples, args.out / f"{name}.png", f"replay engine, {plan.step_delay_ms:g} ms/token, up to {plan.streams} streams")
    for failure in tally.failures[:20]:
        print("FAILED", failure)
    print(
        f"failed_streams={len(tally.failures)} peak_replicas={max(peak.values())} peak_engine_replicas={peak[ENGINE]} "
        f"peak_ingress_replicas={peak[INGRESS]} final_engine_replicas={final[ENGINE]} final_ingress_replicas={final[INGRESS]} "
        f"streams={tally.started} open_while_stopping={tally.open_while_stopping} longest_stream_s={longest:.1f}"
    )


if __name__ == "__main__":
    main()

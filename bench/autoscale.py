"""Autoscaling under a load ramp: replicas scale up and back down, no stream is cut.

    python -m bench.autoscale            # full: streams of ~70 s, about 6 minutes
    python -m bench.autoscale --short    # the test's version (tests/multinode/test_autoscale.py)

A local Ray cluster and Serve app (127.0.0.1 only) with autoscaling on the engine and the
ingress (min 1, max 3, small targets, short delays); the replay backend with a step delay,
so every stream lasts long. A load generator ramps concurrent streams up and holds them
(at least `hold_s`, and until the engine runs 3 replicas). Then it opens 2 long tail streams
and ramps the others down; once those have ended, the replicas have far less to do than their
target, and Serve picks two of each deployment to stop while the tail streams run. Each tail
stream carries a `prompt_cache_key` that the engine router's rendezvous hashing sends to an
engine replica of its own (deployments/routing.py; `max_imbalance` is raised so that load
never passes the key over): Serve keeps one replica, so at least one
tail stream is on a replica it stops, whichever it picks. (Left to the hashes of their texts,
both tail streams sat on the replica Serve kept about one run in nine, and the drain went
unexercised.) Each stream is read to its end and checked by the event contract
(tests/support/contract.py) and for its text. Every second: replicas per deployment and state (`serve.status()`), open
streams, and for each replica being stopped (draining) the requests still in flight on it
(the Serve controller's view of its replicas, and the replica's own count). Writes
bench/results/autoscale.png and autoscale.json (`autoscale-short.*` for `--short`); the
last line is
`failed_streams=N peak_replicas=N peak_engine_replicas=N peak_ingress_replicas=N ...`.
The Ray cluster is shut down on every way out (error, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from serve_app.cli.launch import free_side_ports
from tests.support.contract import check_stream, parse_sse

RESULTS = Path(__file__).parent / "results"
APP = "responses"
MODEL = "replay-slow"
ENGINE = "EngineServer-" + MODEL
INGRESS = "ResponsesIngress"
DEPLOYMENTS = {ENGINE: "engine", INGRESS: "ingress"}
TARGET_ONGOING = 2  # Serve's target_ongoing_requests of both deployments
MAX_REPLICAS = 3


@dataclass(frozen=True)
class Plan:
    streams: int  # concurrent streams at the hold
    ramp_up_s: float
    hold_s: float  # at least; then until the engine runs MAX_REPLICAS replicas, up to hold_wait_s more
    hold_wait_s: float
    ramp_down_s: float  # from `streams` down to none, beside the tail streams
    tail_streams: int  # opened when the ramp-down starts, on different engine replicas, and open while the replicas scale down
    tail_s: float  # how long the tail streams run on after the ramp-down
    words: int  # words of input echoed back (about 4.5 output tokens each), one token per engine step
    tail_words: int  # a tail stream's: it outlasts the ramp-down, the streams still open then, Serve's downscale delay and a margin
    step_delay_ms: float
    downscale_delay_s: float  # Serve's: long enough that the fall to the tail is one step down to 1 replica
    settle_s: float  # after the load, how long to wait for the replicas to come back to 1

    @property
    def max_stream_duration_s(self) -> float:
        """The app's stated longest stream (its drain budget follows): twice the expected."""
        return 2 * 6 * max(self.words, self.tail_words) * self.step_delay_ms / 1000 + 30


# Streams of ~70 s, tail streams of ~140 s (0.9 s a word).
FULL = Plan(
    streams=9,
    ramp_up_s=30,
    hold_s=60,
    hold_wait_s=60,
    ramp_down_s=30,
    tail_streams=2,
    tail_s=110,
    words=80,
    tail_words=160,
    step_delay_ms=200,
    downscale_delay_s=15,
    settle_s=90,
)
# Streams of ~11 s, tail streams of ~30 s (0.5 s a word).
SHORT = Plan(
    streams=8,
    ramp_up_s=8,
    hold_s=6,
    hold_wait_s=60,
    ramp_down_s=6,
    tail_streams=2,
    tail_s=24,
    words=22,
    tail_words=60,
    step_delay_ms=100,
    downscale_delay_s=5,
    settle_s=45,
)


def app_args(plan: Plan) -> dict:
    autoscaling = {
        "min_replicas": 1,
        "max_replicas": MAX_REPLICAS,
        "target_ongoing_requests": TARGET_ONGOING,  # reachable on this box: 3 replicas at 5+ open streams
        "upscale_delay_s": 2,
        "downscale_delay_s": plan.downscale_delay_s,
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
                # A tail stream's cache key always wins (the replicas' loads differ by at most
                # the 8-10 streams here): the tail streams land on replicas of their own.
                "routing": {"max_imbalance": 32},
            }
        ],
        "ingress": deployment,
        # Serve's drain budget (graceful_shutdown_timeout_s) of both deployments comes from this.
        "max_stream_duration_s": plan.max_stream_duration_s,
    }


@dataclass
class Tally:
    started: int = 0
    open: int = 0
    completed: set[int] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    started_at: dict[int, float] = field(default_factory=dict)  # stream -> t it started
    seen_draining: set[int] = field(default_factory=set)  # streams open while a replica was draining requests
    draining: dict[str, dict] = field(default_factory=dict)  # replica id -> deployment, first/last t, peak in flight
    tail: dict[int, str] = field(default_factory=dict)  # tail stream -> the engine replica its cache key picks
    ramp_down_at: float | None = None

    @property
    def open_while_stopping(self) -> int:
        """Streams open while a stopping replica still had requests in flight, that completed."""
        return len(self.seen_draining & self.completed)


async def one_stream(
    session: aiohttp.ClientSession, url: str, index: int, words: int, tally: Tally, open_ids: set[int], cache_key: str | None = None
) -> None:
    text = " ".join(f"w{index}x{i}" for i in range(words))
    body = {"model": MODEL, "input": text, "stream": True}
    if cache_key is not None:
        body["prompt_cache_key"] = cache_key
    started = time.monotonic()  # counted as started and open by the caller, at once
    try:
        async with session.post(f"{url}/responses", json=body) as response:
            raw = await response.read()
            if response.status != 200:
                raise AssertionError(f"HTTP {response.status}: {raw[:200]!r}")
        terminal = check_stream(parse_sse(raw))
        assert terminal.status == "completed", f"ended {terminal.status}"
        assert terminal.output_text == text, "text differs from the input it echoes"
        tally.completed.add(index)
        tally.durations.append(time.monotonic() - started)
    except Exception as exc:  # every way a stream can go wrong is a failed stream
        began = tally.started_at[index]
        tally.failures.append(
            f"stream {index} (started at {began:.0f} s, for {time.monotonic() - started:.0f} s): {type(exc).__name__}: {exc}"[:300]
        )
    finally:
        tally.open -= 1
        open_ids.discard(index)


@dataclass
class Phases:
    """When the load's phases start: the ramp-down (and the tail streams) once the hold has
    lasted `hold_s` and the engine has run MAX_REPLICAS replicas for a second (the ingress
    replicas' routers have heard of them all), or `hold_wait_s` more."""

    plan: Plan
    ramp_down_at: float | None = None
    engines_full_at: float | None = None

    def hold_over(self, t: float, running_engines: int) -> bool:
        if running_engines < MAX_REPLICAS:
            self.engines_full_at = None
        elif self.engines_full_at is None:
            self.engines_full_at = t
        held = t - self.plan.ramp_up_s - self.plan.hold_s
        full = self.engines_full_at is not None and t - self.engines_full_at >= 1
        return held >= 0 and (full or held >= self.plan.hold_wait_s)

    def target_streams(self, t: float) -> int:
        """Concurrent streams wanted at `t` s into the load, the tail streams not counted:
        up, hold, down, none."""
        plan = self.plan
        if t < plan.ramp_up_s:
            return 1 + int((plan.streams - 1) * t / plan.ramp_up_s)
        if self.ramp_down_at is None:
            return plan.streams
        return max(0, plan.streams - math.ceil(plan.streams * (t - self.ramp_down_at) / plan.ramp_down_s))

    @property
    def load_s(self) -> float:
        """When the load ends (the tail streams have about run out); unknown during the hold."""
        return math.inf if self.ramp_down_at is None else self.ramp_down_at + self.plan.ramp_down_s + self.plan.tail_s


def cache_key_for(replica: str, replicas: list[str], stream: int) -> str:
    """A `prompt_cache_key` whose rendezvous hash prefers `replica` of `replicas`, so the
    engine router sends the stream there (nothing is loaded enough to pass it over)."""
    from deployments.routing import preferred_replica
    from serve_app.api.request import ResponsesRequest
    from serve_app.runtime.run import affinity_key

    for attempt in range(1000):  # each try wins with chance 1 / len(replicas)
        key = f"tail-{stream}-{attempt}"
        if preferred_replica(affinity_key(ResponsesRequest(model=MODEL, input="-", prompt_cache_key=key), []), replicas) == replica:
            return key
    raise AssertionError(f"no prompt_cache_key prefers replica {replica}")


def sample_serve() -> dict:
    """Replicas per deployment and state, and the requests in flight on each stopping replica."""
    import ray
    from ray import serve
    from ray.serve._private.common import DeploymentID, ReplicaState
    from ray.serve.context import _get_global_client

    statuses = serve.status().applications[APP].deployments
    controller = _get_global_client()._controller
    sample = {"replicas": {}, "stopping": {}, "running_engines": []}
    for name, label in DEPLOYMENTS.items():
        sample["replicas"][label] = dict(statuses[name].replica_states)
        # Which replicas are stopping, and what they still serve: the controller's own
        # bookkeeping (the hook Serve's tests use) and each replica's count of its requests.
        replicas = ray.get(controller._dump_replica_states_for_testing.remote(DeploymentID(name=name, app_name=APP)))
        if label == "engine":  # the ids the engine router hashes over
            sample["running_engines"] = sorted(replica.replica_id.unique_id for replica in replicas.get([ReplicaState.RUNNING]))
        in_flight = {}
        for replica in replicas.get([ReplicaState.STOPPING]):
            try:
                in_flight[replica.replica_id.unique_id] = ray.get(replica.actor_handle.get_num_ongoing_requests.remote(), timeout=5)
            except Exception:  # already gone (or going): nothing in flight to count
                in_flight[replica.replica_id.unique_id] = None
        sample["stopping"][label] = in_flight
    return sample


async def run_load(url: str, plan: Plan, sample_of=sample_serve) -> tuple[Tally, list[dict]]:
    tally, samples, open_ids, tasks = Tally(), [], set(), set()
    phases = Phases(plan)
    deadline = (
        plan.ramp_up_s + plan.hold_s + plan.hold_wait_s + plan.ramp_down_s + plan.tail_s + plan.settle_s + plan.max_stream_duration_s + 60
    )
    begin = time.monotonic()
    connector = aiohttp.TCPConnector(limit=plan.streams * 2 + 8)
    timeout = aiohttp.ClientTimeout(total=plan.max_stream_duration_s + 60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        index = 0
        settled_at = None
        running_engines: list[str] = []

        def start(t: float, words: int, cache_key: str | None = None) -> None:
            nonlocal index
            tally.started += 1
            tally.open += 1
            tally.started_at[index] = t
            open_ids.add(index)
            tasks.add(asyncio.create_task(one_stream(session, url, index, words, tally, open_ids, cache_key)))
            index += 1

        while True:
            t = time.monotonic() - begin
            if phases.ramp_down_at is None and phases.hold_over(t, len(running_engines)):
                phases.ramp_down_at = tally.ramp_down_at = t
                # The tail streams, each on an engine replica of its own (as many as run).
                for replica in (running_engines * plan.tail_streams)[: plan.tail_streams]:
                    tally.tail[index] = replica
                    start(t, plan.tail_words, cache_key_for(replica, running_engines, index))
            # Starts: keep `target_streams` open (beside the tail streams) while the load runs.
            while t < phases.load_s and len(open_ids - tally.tail.keys()) < phases.target_streams(t):
                start(t, plan.words)
            tasks = {task for task in tasks if not task.done()}
            sample = await asyncio.to_thread(sample_of)
            running_engines = sample.pop("running_engines")
            for label, in_flight in sample["stopping"].items():
                for replica, n in in_flight.items():
                    # How long the open streams (one of them on this replica, if any) had run when it was picked.
                    ages = sorted(round(t - tally.started_at[i], 1) for i in open_ids)
                    seen = tally.draining.setdefault(
                        replica, {"deployment": label, "first_t": round(t, 1), "peak_in_flight": 0, "open_stream_ages_s": ages}
                    )
                    seen["last_t"] = t
                    seen["peak_in_flight"] = max(seen["peak_in_flight"], n or 0)
                    if n:
                        tally.seen_draining |= open_ids
            samples.append({"t": round(t, 2), "open_streams": tally.open, **sample})
            counts = sample["replicas"]
            if t >= phases.load_s and not tasks:
                if all(states.get("RUNNING", 0) == 1 and len(states) == 1 for states in counts.values()):
                    break  # scaled back down: one replica each, nothing starting or stopping
                settled_at = settled_at or time.monotonic()
                if time.monotonic() - settled_at > plan.settle_s:
                    break
            if t > deadline:
                tally.failures.append("the load did not end in time")
                break
            await asyncio.sleep(max(0.0, begin + t + 1.0 - time.monotonic()))
        for task in tasks:
            task.cancel()
    return tally, samples


def timeline(ramp_down_at: float | None, samples: list[dict]) -> dict:
    """When each deployment reached its peak after the load first asked for more than one
    replica, and came back to one after it last asked for one (Serve's delays included)."""
    high = next((s["t"] for s in samples if s["open_streams"] > TARGET_ONGOING), None)
    low = next((s["t"] for s in samples if s["t"] >= (ramp_down_at or 0) and s["open_streams"] <= TARGET_ONGOING), None)
    out = {"load_above_one_replica_t": high, "load_back_to_one_replica_t": low}
    for label in DEPLOYMENTS.values():
        running = [s["replicas"][label].get("RUNNING", 0) for s in samples]
        peak = max(running)
        peak_at = next(i for i, n in enumerate(running) if n == peak)
        back = next(
            (s["t"] for s in samples[peak_at:] if s["replicas"][label].get("RUNNING", 0) == 1 and len(s["replicas"][label]) == 1),
            None,
        )
        out[label] = {
            "peak_t": samples[peak_at]["t"],
            "back_to_one_t": back,
            "scale_up_s": None if high is None else round(samples[peak_at]["t"] - high, 1),
            "scale_down_s": None if low is None or back is None else round(back - low, 1),
        }
    return out


def plot(samples: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in samples]
    fig, axes = plt.subplots(3, 1, sharex=True, figsize=(9, 7), height_ratios=(1, 1, 1.4))
    for ax, label, color in zip(axes, DEPLOYMENTS.values(), ("tab:blue", "tab:orange")):
        ax.step(t, [s["replicas"][label].get("RUNNING", 0) for s in samples], where="post", color=color, linewidth=2, label="running")
        ax.step(
            t,
            [s["replicas"][label].get("STOPPING", 0) for s in samples],
            where="post",
            color=color,
            linestyle=":",
            label="stopping (draining)",
        )
        ax.set_ylabel(f"{label} replicas")
        ax.set_yticks(range(4))
        ax.legend(loc="upper right", fontsize=8)
    bottom = axes[-1]
    bottom.plot(t, [s["open_streams"] for s in samples], color="black", label="open streams")
    for label, color, width in zip(DEPLOYMENTS.values(), ("tab:blue", "tab:orange"), (5, 1.5)):  # often equal
        in_flight = [sum(n or 0 for n in s["stopping"][label].values()) for s in samples]
        bottom.step(t, in_flight, where="post", color=color, linewidth=width, alpha=0.8, label=f"streams on stopping {label} replicas")
    bottom.set_ylabel("streams")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def dumps(summary: dict) -> str:
    """The summary as indented JSON, with one line per sample (a short, diffable file)."""
    head = json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=1)
    samples = ",\n  ".join(json.dumps(s, separators=(",", ":")) for s in summary["samples"])
    return head[: -len("\n}")] + f',\n "samples": [\n  {samples}\n ]\n}}\n'


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the `finally` that stops Ray


def run(plan: Plan) -> tuple[Tally, list[dict]]:
    """Start a local Ray cluster and the app, run the load, always stop the cluster."""
    import ray
    from ray import serve

    from deployments.builder import build_app

    temp_dir = tempfile.mkdtemp(prefix="ray-autoscale-", dir="/tmp")
    signal.signal(signal.SIGTERM, _interrupt)  # a test's timeout, `kill`: as Ctrl-C
    ok = False
    try:
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False)
        port = free_side_ports(1)[0]
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(app_args(plan)), name=APP, route_prefix="/")
        result = asyncio.run(run_load(f"http://127.0.0.1:{port}/v1", plan))
        ok = not result[0].failures  # Ray's logs are kept for a failed stream
        return result
    finally:
        ray.shutdown()  # stops every process this driver's cluster started
        if ok:
            shutil.rmtree(temp_dir, ignore_errors=True)
        else:
            print(f"Ray's logs: {temp_dir}/session_latest/logs", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", action="store_true", help="short streams and phases (the test's version)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where autoscale.png/json go")
    args = parser.parse_args()
    plan = SHORT if args.short else FULL
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_SERVE_ENABLE_DIRECT_INGRESS", "0")  # the proxy spreads streams over the ingress replicas
    from serve_app.config.cluster import CLUSTER_ENV

    for name, value in CLUSTER_ENV.items():  # as `make serve` starts Ray (HAProxy keeps streams across its reloads)
        os.environ.setdefault(name, value)

    began = time.monotonic()
    tally, samples = run(plan)
    wall_s = time.monotonic() - began

    peak = {label: max(s["replicas"][label].get("RUNNING", 0) for s in samples) for label in DEPLOYMENTS.values()}
    final = {label: samples[-1]["replicas"][label].get("RUNNING", 0) for label in DEPLOYMENTS.values()}
    longest = max(tally.durations, default=0.0)
    drained = {replica: {**seen, "draining_s": round(seen["last_t"] - seen["first_t"], 1)} for replica, seen in tally.draining.items()}
    drained_requests = sum(seen["peak_in_flight"] for seen in drained.values())
    times = timeline(tally.ramp_down_at, samples)
    summary = {
        "plan": asdict(plan),
        "app_args": app_args(plan),
        "wall_s": round(wall_s, 1),
        "streams": tally.started,
        "completed": len(tally.completed),
        "failed_streams": len(tally.failures),
        "failures": tally.failures[:20],
        "peak_engine_replicas": peak["engine"],
        "peak_ingress_replicas": peak["ingress"],
        "final_engine_replicas": final["engine"],
        "final_ingress_replicas": final["ingress"],
        "open_while_stopping": tally.open_while_stopping,
        "drained_requests": drained_requests,
        "stopped_replicas": drained,
        "ramp_down_t": None if tally.ramp_down_at is None else round(tally.ramp_down_at, 1),
        "tail_stream_engines": {str(stream): replica for stream, replica in tally.tail.items()},
        "longest_stream_s": round(longest, 1),
        "median_stream_s": round(sorted(tally.durations)[len(tally.durations) // 2], 1) if tally.durations else None,
        "timeline": times,
        "samples": samples,
    }
    name = "autoscale-short" if args.short else "autoscale"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(dumps(summary))
    plot(samples, args.out / f"{name}.png", f"replay engine, {plan.step_delay_ms:g} ms/token, up to {plan.streams} streams")
    for failure in tally.failures[:20]:
        print("FAILED", failure)
    if tally.ramp_down_at is not None:
        print(f"hold over at {tally.ramp_down_at:.0f} s; tail streams on engine replicas {', '.join(tally.tail.values())}")
    for replica, seen in drained.items():
        ages = seen["open_stream_ages_s"]
        print(
            f"stopped {seen['deployment']} replica {replica} at {seen['first_t']:.0f} s: draining {seen['draining_s']} s, "
            f"{seen['peak_in_flight']} requests in flight; the open streams had run {ages[0] if ages else '-'}..{ages[-1] if ages else '-'} s"
        )
    for label in DEPLOYMENTS.values():
        print(f"{label}: scale-up {times[label]['scale_up_s']} s, scale-down {times[label]['scale_down_s']} s")
    print(f"wall {wall_s:.0f} s, plot and samples: {args.out / name}.png/.json")
    print(
        f"failed_streams={len(tally.failures)} peak_replicas={max(peak.values())} peak_engine_replicas={peak['engine']} "
        f"peak_ingress_replicas={peak['ingress']} final_engine_replicas={final['engine']} final_ingress_replicas={final['ingress']} "
        f"streams={tally.started} open_while_stopping={tally.open_while_stopping} drained_requests={drained_requests} "
        f"longest_stream_s={longest:.1f}"
    )


if __name__ == "__main__":
    main()

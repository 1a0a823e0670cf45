"""Overload: four times what the engines can serve, for a fixed time, through Serve.

    python -m bench.overload [--seconds 20] [--factor 4] [--capacity 8] [--step-ms 20]

Starts its own Serve app (`serve run`, HTTP through Serve's HAProxy ingress, as `make serve`):
one ingress replica and one `gpt-oss-replay` engine replica whose capacity is known: it runs
at most `--capacity` streams at once (`max_ongoing_requests`), each writing one token every
`--step-ms`, and each ingress replica's handle lets `--engine-queue` more wait for it
(`max_queued_requests`); past that, the ingress refuses a request with 503 `engine_at_capacity`
before it starts. Through Serve, not the in-process app, because the bounds under test are
Serve's and the ingress's together: the engine's concurrency, the handle's queue, and the
ingress refusing what they would not take.

Then, side by side in one run:
1. unloaded: `--capacity / 2` streams at a time for `--seconds / 2` (their TPOT: the baseline);
2. overload: streamed requests arriving at `--factor` times the rate the engine serves them
   (capacity / a stream's duration), evenly spaced, for `--seconds`.

Every answer is checked: an admitted stream must pass the event contract
(tests/support/contract.py), end `completed`, carry all its tokens (harmony: the deltas
rendered back are `usage.output_tokens`) and echo its input whole; a refusal must be a 429 or
503 with `Retry-After`. The ingress replica's RSS is read (its `memory()`) before the
overload and after it. The last line:

    lost=N cut=N refused=N refusal_p99_ms=X admitted_tpot_ratio=Y rss_growth_mb=Z

lost: admitted streams that completed with text or tokens missing; cut: admitted streams
that ended without their terminal event (or failed); refused: 429/503 answers (`bad_refusals`
counts refusals of any other kind, or without Retry-After); admitted_tpot_ratio: the overload's
median TPOT over the unloaded one. Writes bench/results/overload.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import yaml

from bench.load import ReplicaMemory, cluster_address, harmony_tokens, percentile, start_server
from bench.stack import serve_config as stack_serve_config
from bench.stack import stop, wait_ready
from tests.support.contract import check_stream, parse_sse

RESULTS = Path(__file__).parent / "results"
MODEL = "gpt-oss-replay"
# ~70 output tokens: a short analysis, then the input echoed.
PROMPT = "Overload: every admitted token arrives, in order, exactly once, at its pace. " * 4


@dataclass
class Outcome:
    kind: str  # "admitted", "refused", "bad_refusal"
    status: int = 0
    latency_s: float = 0.0  # to the answer (a refusal) or to the end of the stream
    tpot_s: float | None = None  # an admitted stream's time per output token after its first
    lost: bool = False
    cut: bool = False
    detail: str = ""


@dataclass
class Phase:
    outcomes: list[Outcome] = field(default_factory=list)

    def of(self, kind: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == kind]

    def median_tpot(self) -> float:
        return percentile([o.tpot_s for o in self.of("admitted") if o.tpot_s is not None], 0.5)


async def one_request(session: aiohttp.ClientSession, url: str) -> Outcome:
    start = time.perf_counter()
    first_delta = last_delta = None
    raw = bytearray()
    try:
        async with session.post(f"{url}/responses", json={"model": MODEL, "input": PROMPT, "stream": True, "store": False}) as response:
            if response.status != 200:
                body = await response.text()
                good = response.status in (429, 503) and "retry-after" in response.headers
                return Outcome("refused" if good else "bad_refusal", response.status, time.perf_counter() - start, detail=body[:200])
            async for chunk in response.content.iter_any():
                raw += chunk
                if b"_text.delta" in chunk:
                    last_delta = time.perf_counter()
                    first_delta = first_delta or last_delta
    except Exception as exc:  # the connection dropped: cut
        return Outcome("admitted", 200, time.perf_counter() - start, cut=True, detail=f"{type(exc).__name__}: {exc}"[:200])
    outcome = Outcome("admitted", 200, time.perf_counter() - start)
    try:
        events = parse_sse(bytes(raw))
        terminal = check_stream(events)
    except AssertionError as exc:
        outcome.cut, outcome.detail = True, f"contract: {exc}"[:200]
        return outcome
    if terminal.status != "completed":
        outcome.cut, outcome.detail = True, f"ended {terminal.status}: {terminal.error}"[:200]
        return outcome
    tokens = terminal.usage.output_tokens
    if terminal.output_text != PROMPT or harmony_tokens(events) != tokens:
        outcome.lost, outcome.detail = True, "text or tokens missing"
    if first_delta is not None and last_delta is not None and tokens > 1:
        outcome.tpot_s = (last_delta - first_delta) / (tokens - 1)
    return outcome


async def unloaded(url: str, concurrency: int, seconds: float) -> Phase:
    """`concurrency` clients, each sending a request after the other, for `seconds`."""
    phase = Phase()
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def client() -> None:
            while time.monotonic() < deadline:
                phase.outcomes.append(await one_request(session, url))

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return phase


async def overload(url: str, rate_per_s: float, seconds: float) -> Phase:
    """Requests arriving every 1 / `rate_per_s` seconds for `seconds`, whatever the answers."""
    phase = Phase()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        tasks = []
        start = time.monotonic()
        for index in range(int(rate_per_s * seconds)):
            await asyncio.sleep(max(0.0, start + index / rate_per_s - time.monotonic()))
            tasks.append(asyncio.create_task(one_request(session, url)))
        phase.outcomes = list(await asyncio.gather(*tasks))
    return phase


def serve_config(port: int, capacity: int, engine_queue: int, step_ms: float) -> dict:
    engine = {
        "num_replicas": 1,
        "max_ongoing_requests": capacity,
        "max_queued_requests": engine_queue,
        "ray_actor_options": {"num_cpus": 0},
    }
    model = {"name": MODEL, "backend": {"type": "replay", "min_step_tokens": 1, "max_step_tokens": 1, "step_delay_ms": step_ms}}
    ingress = {"num_replicas": 1, "max_ongoing_requests": 1024, "ray_actor_options": {"num_cpus": 0}}
    return stack_serve_config(port, [{**model, "engine": engine}], ingress, store={"type": "memory"})


def summary(base: Phase, loaded: Phase, rss_growth_mb: float) -> dict:
    admitted = loaded.of("admitted")
    refusals = [o.latency_s for o in loaded.of("refused")]
    return {
        "lost": sum(o.lost for o in admitted + base.of("admitted")),
        "cut": sum(o.cut for o in admitted + base.of("admitted")),
        "refused": len(refusals),
        "refusal_p99_ms": percentile(refusals, 0.99) * 1e3,
        "admitted_tpot_ratio": loaded.median_tpot() / base.median_tpot(),
        "rss_growth_mb": rss_growth_mb,
        "admitted": len(admitted),
        "bad_refusals": len(loaded.of("bad_refusal")) + len(base.of("bad_refusal")),
        "unloaded_refused": len(base.of("refused")),
        "unloaded_tpot_ms": base.median_tpot() * 1e3,
        "overload_tpot_ms": loaded.median_tpot() * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the overload lasts")
    parser.add_argument("--factor", type=float, default=4.0, help="offered load over what the engine serves")
    parser.add_argument("--capacity", type=int, default=8, help="streams the engine runs at once (its max_ongoing_requests)")
    parser.add_argument(
        "--engine-queue", type=int, default=2, help="requests waiting for the engine per ingress replica (max_queued_requests)"
    )
    parser.add_argument("--step-ms", type=float, default=20.0, help="the replay engine's time per token")
    parser.add_argument("--port", type=int, default=8767)
    args = parser.parse_args()

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as written:
        yaml.safe_dump(serve_config(args.port, args.capacity, args.engine_queue, args.step_ms), written)
    process = start_server(Path(written.name), args.port)
    url = f"http://127.0.0.1:{args.port}/v1"
    replicas = None
    try:
        wait_ready(url.removesuffix("/v1"), process)
        replicas = ReplicaMemory(cluster_address(process), "responses", ["ResponsesIngress"], trace_frames=0, trim=False)
        # One request first: the ingress's handle learns of the engine replica (until it has,
        # requests wait in its queue, and a burst then fills a small one).
        asyncio.run(unloaded(url, 1, 0.1))
        base = asyncio.run(unloaded(url, max(1, args.capacity // 2), args.seconds / 2))
        stream_s = percentile([o.latency_s for o in base.of("admitted")], 0.5)
        rate = args.factor * args.capacity / stream_s
        before = replicas.read()["ResponsesIngress"]["rss_mb"]
        print(
            f"unloaded: {len(base.outcomes)} streams of {stream_s:.2f} s; overload: {rate:.1f} requests/s for {args.seconds:g} s",
            file=sys.stderr,
        )
        loaded = asyncio.run(overload(url, rate, args.seconds))
        time.sleep(2)  # what the overload left behind is freed (or not)
        after = replicas.read()["ResponsesIngress"]["rss_mb"]
    finally:
        if replicas is not None:
            with contextlib.suppress(Exception):
                replicas.close()
        stop(process)

    result = summary(base, loaded, after - before)
    RESULTS.mkdir(exist_ok=True)
    details = {
        "args": vars(args),
        "summary": result,
        "unloaded": [asdict(o) for o in base.outcomes],
        "overload": [asdict(o) for o in loaded.outcomes],
    }
    (RESULTS / "overload.json").write_text(json.dumps(details, indent=2))
    print(
        f"offered {len(loaded.outcomes)} in {args.seconds:g} s: admitted {result['admitted']}, refused {result['refused']} "
        f"(bad refusals {result['bad_refusals']}; refused unloaded {result['unloaded_refused']}); TPOT {result['unloaded_tpot_ms']:.1f} ms unloaded, "
        f"{result['overload_tpot_ms']:.1f} ms overloaded"
    )
    for outcome in loaded.outcomes + base.outcomes:
        if outcome.lost or outcome.cut or outcome.kind == "bad_refusal":
            print(f"  {outcome.kind} {outcome.status}: {outcome.detail}")
    print(
        f"lost={result['lost']} cut={result['cut']} refused={result['refused']} refusal_p99_ms={result['refusal_p99_ms']:.1f} "
        f"admitted_tpot_ratio={result['admitted_tpot_ratio']:.2f} rss_growth_mb={result['rss_growth_mb']:.1f}"
    )


if __name__ == "__main__":
    main()

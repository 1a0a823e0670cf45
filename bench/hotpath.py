"""Per-token cost of the ingress hot path against the bare parser or decoder underneath it.

    python -m bench.hotpath [--tokens 120000] [--rounds 5] [--family harmony|chat_template|both]

harmony: one long gpt-oss completion (mixed channels: reasoning, preambles, tool calls, a
final answer) in real harmony tokens. chat_template: the same kind of completion written as
Qwen3 text (`<think>`, message text, hermes `<tool_call>`s) through SmolLM2's tokenizer.
Each is cut into replay-like steps of 1..4 tokens. Side by side, in alternating rounds:
- the floor: `openai_harmony.StreamableParser.process` on every token (harmony), or the
  tokenizer's own incremental decode, `tokenizers.decoders.DecodeStream.step`, on every
  token (chat_template);
- `hot path`: `ResponseStream.feed(batch)` + SSE encoding of its events — split, decode,
  parse, events, bytes, exactly what the ingress does per batch.
The best round of each is reported, then `ratio_to_parser=<x>` (harmony) and
`ratio_to_decode=<x>` (chat_template). Where vLLM is installed, its own streaming `qwen3`
and `hermes` parsers are timed on the first `--vllm-tokens` chat-template tokens for
comparison (they re-read the whole text so far on each call, so they slow down with length).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from openai_harmony import Message, Role, StreamableParser

from serve_app.api.request import ResponsesRequest
from serve_app.api.sse import encode_events
from serve_app.core.logprobs import LogprobFormatter
from serve_app.core.stream import ResponseStream
from serve_app.core.tokens import TokenBatch
from serve_app.families.harmony import HarmonyModel, HarmonyParser, render_completion
from serve_app.families.vocab import harmony_encoding

PARAGRAPH = (
    "Speculative decoding hands the server several tokens per step; every one of them must "
    "reach the client exactly once — même les caractères accentués, 日本語のテキスト, and emoji 👍🏽. "
)


def long_completion(min_tokens: int) -> list[int]:
    def assistant(text: str, channel: str) -> Message:
        return Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)

    messages: list[Message] = []
    tokens: list[int] = []
    while len(tokens) < min_tokens:
        messages += [
            assistant(PARAGRAPH * 40, "analysis"),
            assistant(PARAGRAPH * 4, "commentary"),
            assistant('{"query": "' + PARAGRAPH * 3 + '", "limit": 10}', "commentary")
            .with_recipient("functions.search")
            .with_content_type("<|constrain|>json"),
        ]
        tokens = render_completion([*messages, assistant(PARAGRAPH * 20, "final")])
    return tokens


def steps(tokens: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    batches, position = [], 0
    while position < len(tokens):
        size = rng.randint(1, 4)
        batches.append(tokens[position : position + size])
        position += size
    return batches


def time_parser(tokens: list[int]) -> float:
    parser = StreamableParser(harmony_encoding(), Role.ASSISTANT)
    process = parser.process
    start = time.perf_counter()
    for token in tokens:
        process(token)
    return time.perf_counter() - start


def chat_completion(tokenizer, min_tokens: int) -> list[int]:
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "' + PARAGRAPH * 3 + '", "limit": 10}}\n</tool_call>\n'
    turn = "<think>\n" + PARAGRAPH * 40 + "\n</think>\n\n" + PARAGRAPH * 4 + "\n" + call
    tokens: list[int] = []
    text = ""
    while len(tokens) < min_tokens:
        text += turn
        tokens = tokenizer.encode(text + PARAGRAPH * 20, add_special_tokens=False)
    return [*tokens, tokenizer.eos_token_id]


def time_transformers_decode(tokenizer, tokens: list[int]) -> float:
    decode = tokenizer.decode
    start = time.perf_counter()
    for token in tokens:
        decode([token])
    return time.perf_counter() - start


def time_decode(tokenizer, tokens: list[int]) -> float:
    from tokenizers.decoders import DecodeStream

    backend, step = tokenizer.backend_tokenizer, DecodeStream(skip_special_tokens=False).step
    start = time.perf_counter()
    for token in tokens:
        step(backend, token)
    return time.perf_counter() - start


def time_vllm_parsers(tokenizer, tokens: list[int]) -> dict[str, float]:
    """µs/token of vLLM's streaming `qwen3` reasoning and `hermes` tool parsers, fed as vLLM's
    server feeds them (the whole text so far on every call), over the same tokens."""
    from tokenizers.decoders import DecodeStream
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    backend, step = tokenizer.backend_tokenizer, DecodeStream(skip_special_tokens=False).step
    deltas = [step(backend, token) or "" for token in tokens]
    results = {}
    for name, parser, method, extra in (
        ("vLLM qwen3 reasoning parser", ReasoningParserManager.get_reasoning_parser("qwen3")(tokenizer), "extract_reasoning_streaming", ()),
        ("vLLM hermes tool parser", ToolParserManager.get_tool_parser("hermes")(tokenizer), "extract_tool_calls_streaming", (None,)),
    ):
        call = getattr(parser, method)
        previous_text, previous_ids = "", []
        start = time.perf_counter()
        for token, delta in zip(tokens, deltas):
            current_text, current_ids = previous_text + delta, [*previous_ids, token]
            call(previous_text, current_text, delta, previous_ids, current_ids, [token], *extra)
            previous_text, previous_ids = current_text, current_ids
        results[name] = (time.perf_counter() - start) / len(tokens) * 1e6
    return results


def time_hot_path(
    batches: list[list[int]], request: ResponsesRequest, parser_factory: Callable = HarmonyParser, vocabulary=None
) -> tuple[float, int]:
    """`vocabulary` (a model family): with output-text logprobs, 5 alternatives per token."""
    logprobs = LogprobFormatter(vocabulary) if vocabulary is not None else None
    stream = ResponseStream(request, parser_factory=parser_factory, logprobs=logprobs)
    # The engine's TokenBatches are the input (the ingress receives them ready-made from Ray).
    last = len(batches) - 1
    token_batches = [
        TokenBatch(
            batch,
            finish_reason="stop" if index == last else None,
            logprobs=[(-0.5, [(t + k, -0.5 - k) for k in range(5)]) for t in batch] if logprobs else None,
        )
        for index, batch in enumerate(batches)
    ]
    wire = 0
    start = time.perf_counter()
    wire += len(encode_events(stream.start()))
    for token_batch in token_batches:
        wire += len(encode_events(stream.feed(token_batch)))
    elapsed = time.perf_counter() - start
    assert stream.response.status == "completed"
    return elapsed, wire


Timer = tuple[str, Callable[[], float]]


def compare(
    name: str,
    floor: Timer,
    tokens: list[int],
    request: ResponsesRequest,
    rounds: int,
    parser_factory: Callable = HarmonyParser,
    references: tuple[Timer, ...] = (),
    vocabulary=None,
) -> float:
    """Alternating rounds of the floor, the hot path and any reference paths (shown, not part
    of the ratio); prints a table, returns the hot path's ratio to the floor. `vocabulary` (a
    model family): also time the hot path with output-text logprobs (a reference)."""
    batches = steps(tokens)
    if vocabulary is not None:
        with_logprobs = lambda: time_hot_path(batches, request, parser_factory, vocabulary)[0]  # noqa: E731
        references += (("hot path with logprobs (top 5)", with_logprobs),)
    time_hot_path(batches[:2000], request, parser_factory)  # warm-up: imports, caches
    floor_times, hot_times = [], []
    reference_times: list[list[float]] = [[] for _ in references]
    wire_bytes = 0
    for _ in range(rounds):
        floor_times.append(floor[1]())
        elapsed, wire_bytes = time_hot_path(batches, request, parser_factory)
        hot_times.append(elapsed)
        for (_, timer), times in zip(references, reference_times):
            times.append(timer())

    per_token = lambda seconds: seconds / len(tokens) * 1e6  # noqa: E731
    print(f"{name}: {len(tokens)} tokens in {len(batches)} batches (1..4 tokens), {wire_bytes / 1e6:.1f} MB of SSE")
    print(f"{'path':<40}{'µs/token (best)':>16}{'µs/token (median)':>19}")
    rows = [(floor[0], floor_times), ("hot path: parse+events+SSE", hot_times)]
    rows += [(label, times) for (label, _), times in zip(references, reference_times)]
    for label, times in rows:
        median = sorted(times)[len(times) // 2]
        print(f"{label:<40}{per_token(min(times)):>16.2f}{per_token(median):>19.2f}")
    return min(hot_times) / min(floor_times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=120_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--family", choices=["harmony", "chat_template", "both"], default="both")
    parser.add_argument("--logprobs", action="store_true", help="also time the hot path with output-text logprobs")
    parser.add_argument("--vllm-tokens", type=int, default=5000, help="tokens to time vLLM's own parsers on (they slow down with length)")
    args = parser.parse_args()

    if args.family in ("harmony", "both"):
        tokens = long_completion(args.tokens)
        request = ResponsesRequest(model="gpt-oss-replay", input="bench")
        ratio = compare(
            "harmony",
            ("StreamableParser.process", lambda: time_parser(tokens)),
            tokens,
            request,
            args.rounds,
            vocabulary=HarmonyModel() if args.logprobs else None,
        )
        print(f"ratio_to_parser={ratio:.2f}")
    if args.family in ("chat_template", "both"):
        from serve_app.families.chat_template import ChatTemplateModel
        from serve_app.families.smollm2 import SMOLLM2, load_tokenizer

        tokenizer = load_tokenizer(SMOLLM2)
        model = ChatTemplateModel(tokenizer, template="qwen3", reasoning_parser="qwen3", tool_parser="hermes")
        tokens = chat_completion(tokenizer, args.tokens)
        request = ResponsesRequest(model="qwen3-replay", input="bench")
        ratio = compare(
            "chat_template (qwen3 + hermes)",
            ("DecodeStream.step", lambda: time_decode(tokenizer, tokens)),
            tokens,
            request,
            args.rounds,
            lambda sink: model.parser(sink, []),
            references=(("reference: tokenizer.decode([token])", lambda: time_transformers_decode(tokenizer, tokens)),),
            vocabulary=model if args.logprobs else None,
        )
        print(f"ratio_to_decode={ratio:.2f}")
        try:
            import vllm  # noqa: F401
        except Exception:
            return
        if args.vllm_tokens <= 0:
            return
        first = tokens[: args.vllm_tokens]
        for name, micros in time_vllm_parsers(tokenizer, first).items():
            print(f"{name + f' ({len(first)} tokens)':<50}{micros:>10.2f} µs/token")


if __name__ == "__main__":
    main()

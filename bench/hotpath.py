"""Per-token cost of the ingress hot path against the bare harmony parser.

    python -m bench.hotpath [--tokens 120000] [--rounds 5]

One long replayed completion (mixed channels: reasoning, preambles, tool calls, a final
answer) is cut into replay-like steps of 1..4 tokens. Side by side, in alternating rounds:
- `parser`: `openai_harmony.StreamableParser.process` on every token (the floor);
- `hot path`: `ResponseStream.feed(batch)` + SSE encoding of its events — split, parse,
  events, bytes, exactly what the ingress does per batch.
The best round of each is reported; the last line is `ratio_to_parser=<x>`.
"""

from __future__ import annotations

import argparse
import random
import time

from openai_harmony import Message, Role, StreamableParser

from serve_app.protocol.harmony import render_completion
from serve_app.protocol.request import ResponsesRequest
from serve_app.protocol.sse import encode_events
from serve_app.protocol.stream import ResponseStream
from serve_app.protocol.tokens import TokenBatch
from serve_app.vocab import harmony_encoding

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
        tokens = render_completion(messages + [assistant(PARAGRAPH * 20, "final")])
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


def time_hot_path(batches: list[list[int]], request: ResponsesRequest) -> tuple[float, int]:
    stream = ResponseStream(request)
    wire = 0
    start = time.perf_counter()
    wire += len(encode_events(stream.start()))
    last = len(batches) - 1
    for index, batch in enumerate(batches):
        token_batch = TokenBatch(batch, finish_reason="stop" if index == last else None)
        wire += len(encode_events(stream.feed(token_batch)))
    elapsed = time.perf_counter() - start
    assert stream.response.status == "completed"
    return elapsed, wire


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=120_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    tokens = long_completion(args.tokens)
    batches = steps(tokens)
    request = ResponsesRequest(model="gpt-oss-replay", input="bench")
    time_hot_path(batches[:2000], request)  # warm-up: imports, caches

    parser_times, hot_times = [], []
    wire_bytes = 0
    for _ in range(args.rounds):
        parser_times.append(time_parser(tokens))
        elapsed, wire_bytes = time_hot_path(batches, request)
        hot_times.append(elapsed)

    per_token = lambda seconds: seconds / len(tokens) * 1e6  # noqa: E731
    parser_us, hot_us = per_token(min(parser_times)), per_token(min(hot_times))
    print(f"completion: {len(tokens)} tokens in {len(batches)} batches (1..4 tokens), {wire_bytes / 1e6:.1f} MB of SSE")
    print(f"{'path':<34}{'µs/token (best)':>16}{'µs/token (median)':>19}")
    for name, times in (("StreamableParser.process", parser_times), ("hot path: parse+events+SSE", hot_times)):
        median = sorted(times)[len(times) // 2]
        print(f"{name:<34}{per_token(min(times)):>16.2f}{per_token(median):>19.2f}")
    print(f"ratio_to_parser={hot_us / parser_us:.2f}")


if __name__ == "__main__":
    main()

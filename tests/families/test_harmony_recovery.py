"""Malformed harmony: whatever tokens a model writes, one valid stream that keeps them.

A model with random weights (the tiny gpt-oss of tests/deployments/test_vllm_gpt_oss.py) writes special
tokens in any order, headers without `<|message|>`, channels without messages, recipients
that name no tool and messages that never end. The harmony parser never fails on them:
harmony keeps stray special tokens inside content as text, and what it cannot place in a
message becomes a *raw* message item (no `phase`) holding the tokens as written.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serve_app.api.request import ResponsesRequest
from serve_app.core.stream import ResponseStream
from serve_app.core.tokens import TokenBatch
from serve_app.families.harmony import MAX_HEADER_TOKENS, HarmonyParser
from serve_app.families.vocab import harmony_encoding
from tests.core.test_stream_properties import partition
from tests.support.contract import check_stream

REQUEST = ResponsesRequest(model="gpt-oss-replay", input="hi")
ENCODING = harmony_encoding()
# o200k_harmony's special tokens: <|startoftext|>, <|endoftext|>, <|return|>, <|constrain|>,
# <|channel|>, <|start|>, <|end|>, <|message|>, <|call|> and the reserved ones between them.
SPECIALS = list(range(199998, 200019))


def tokens(text: str) -> list[int]:
    return ENCODING.encode(text, allowed_special="all")


def run(batches: list[list[int]], finish_reason: str = "stop"):
    stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
    events = stream.start()
    for index, batch in enumerate(batches):
        last = index == len(batches) - 1
        events += stream.feed(TokenBatch(batch, finish_reason=finish_reason if last else None))
    return events


def items(terminal) -> list[tuple]:
    out = []
    for item in terminal.output:
        if item.type == "message":
            out.append(("message", item.phase, item.content[0].text))
        elif item.type == "reasoning":
            out.append(("reasoning", item.content[0].text))
        else:
            out.append(("function_call", item.namespace, item.name, item.arguments))
    return out


RAW = ("message", None)  # a raw message: (type, phase) of what harmony could not place

CASES = [
    # Text with no header at all (the model never wrote <|message|>).
    ("hello world", "stop", [(*RAW, "hello world")]),
    # ... also when it stopped on <|return|> (the stop token itself is not text).
    ("x<|return|>", "stop", [(*RAW, "x")]),
    # Text where <|start|> must come: the missing <|start|> is implied, a header begins.
    (
        "<|channel|>final<|message|>hi<|end|>oops<|channel|>analysis<|message|>r<|end|>",
        "stop",
        [("message", "final_answer", "hi"), (*RAW, "oops<|channel|>analysis<|message|>r")],
    ),
    (
        "<|channel|>final<|message|>hi<|end|><|channel|>analysis<|message|>r<|end|>",
        "stop",
        [("message", "final_answer", "hi"), ("reasoning", "r")],
    ),
    # A channel marker without a channel (harmony rejects the header).
    ("<|channel|><|message|>x<|end|>", "stop", [(*RAW, "<|channel|><|message|>x")]),
    # A channel that is none of analysis / commentary / final.
    ("<|channel|>thoughts<|message|>x<|end|>", "stop", [(*RAW, "<|channel|>thoughts<|message|>x")]),
    # Another role than the assistant's.
    ("<|start|>user<|message|>u<|end|>", "stop", [(*RAW, "<|start|>user<|message|>u")]),
    # Recipients that name no tool; stray header words harmony reads as a recipient.
    ("<|channel|>commentary to=functions.<|message|>{}<|call|>", "stop", [(*RAW, "<|channel|>commentary to=functions.<|message|>{}")]),
    ("<|channel|>final blah<|message|>w<|end|>", "stop", [(*RAW, "<|channel|>final blah<|message|>w")]),
    ("<|channel|>commentary to=<|start|><|message|>{}<|call|>", "stop", [(*RAW, "<|channel|>commentary to=<|start|><|message|>{}")]),
    # Well-formed calls still are calls.
    ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>", "stop", [("function_call", None, "f", "{}")]),
    (" to=crm.lookup<|channel|>commentary json<|message|>{}<|call|>", "stop", [("function_call", "crm", "lookup", "{}")]),
    # Special tokens inside content are text (harmony's own behaviour).
    (
        "<|channel|>final<|message|>a<|start|>b<|channel|>c<|reserved_200000|><|end|>",
        "stop",
        [("message", "final_answer", "a<|start|>b<|channel|>c<|reserved_200000|>")],
    ),
    # A message that never ends: completed (stop) or incomplete (length), text kept.
    ("<|channel|>analysis<|message|>unterminated", "stop", [("reasoning", "unterminated")]),
    ("<|channel|>analysis<|message|>unterminated", "length", [("reasoning", "unterminated")]),
    # A header the completion ends in: garbage is shown ...
    (
        "<|channel|>final<|message|>hi<|end|><|start|><|end|><|start|>",
        "stop",
        [("message", "final_answer", "hi"), (*RAW, "<|start|><|end|><|start|>")],
    ),
    (
        "<|channel|>final<|message|>hi<|end|><|start|>assistant<|channel|>fin",
        "stop",
        [("message", "final_answer", "hi"), (*RAW, "<|start|>assistant<|channel|>fin")],
    ),
    ("<|channel|>final<|message|>hi<|end|>garbage here", "length", [("message", "final_answer", "hi"), (*RAW, "garbage here")]),
    # ... but a well-formed header the token limit cut loses nothing but structure.
    ("<|channel|>final<|message|>hi<|end|><|start|>assistant<|channel|>fin", "length", [("message", "final_answer", "hi")]),
    ("<|channel|>analysis<|message|>r<|end|><|start|>assistant to=functions.get", "length", [("reasoning", "r")]),
]


@pytest.mark.parametrize(("text", "finish", "expected"), CASES, ids=[c[0][:40] for c in CASES])
def test_malformed_completion_is_kept(text, finish, expected):
    completion = tokens(text)
    for batches in ([completion], [[t] for t in completion]):
        terminal = check_stream(run(batches, finish))
        assert terminal.status == ("completed" if finish == "stop" else "incomplete")
        assert items(terminal) == expected


def test_abort_mid_header_fails_cleanly():
    terminal = check_stream(run([tokens("<|channel|>final<|message|>hi<|end|><|start|>assis")], "abort"))
    assert terminal.status == "failed"
    assert items(terminal) == [("message", "final_answer", "hi")]


# Random completions: mostly special tokens and header words, some arbitrary ids (parts of
# multi-byte characters among them), in any order.
HEADER_WORDS = sorted(
    {
        t
        for word in [
            "assistant",
            "user",
            "analysis",
            "final",
            "commentary",
            " to",
            "=",
            "functions",
            ".",
            "get_weather",
            " json",
            "{}",
            " ",
            "é",
            "世界",
        ]
        for t in tokens(word)
    }
)
random_tokens = st.lists(
    st.one_of(st.sampled_from(SPECIALS), st.sampled_from(HEADER_WORDS), st.integers(0, 199997)), max_size=3 * MAX_HEADER_TOKENS
)


@pytest.mark.slow
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(random_tokens, st.lists(st.integers(1, 7), max_size=80), st.sampled_from(["stop", "length", "abort"]))
def test_random_tokens_never_break_the_stream(completion, sizes, finish):
    """Never a crash, one terminal event, a valid lifecycle, and the same items whatever
    the batching."""
    outputs = []
    for batches in ([completion], partition(completion, sizes), [[t] for t in completion]):
        terminal = check_stream(run(batches or [[]], finish), allow_replacement=True)
        assert terminal.status == {"stop": "completed", "length": "incomplete", "abort": "failed"}[finish]
        assert terminal.usage.output_tokens == len(completion)
        outputs.append(items(terminal))
    assert outputs[0] == outputs[1] == outputs[2]


# Text tokens: any id but the special ones (parts of multi-byte characters and bytes that are
# no character among them), more than a header can hold.
text_tokens = st.lists(st.integers(0, 199997), min_size=1, max_size=3 * MAX_HEADER_TOKENS)


@settings(max_examples=100)
@given(text_tokens, st.lists(st.integers(1, 7), max_size=60))
def test_text_without_structure_is_one_raw_message(completion, sizes):
    """Text tokens alone (no special token): all of it, decoded, in one raw message."""
    terminal = check_stream(run(partition(completion, sizes)), allow_replacement=True)
    assert items(terminal) == [(*RAW, ENCODING.decode(completion))]


@pytest.mark.slow
@settings(max_examples=100)
@given(text_tokens, st.booleans(), st.lists(st.integers(1, 7), max_size=60))
def test_content_is_every_token_decoded(content, ended, sizes):
    """A message's text is its tokens as a decode shows them: harmony's own content deltas
    lost the token after bytes that are no character when the message ended there."""
    completion = tokens("<|channel|>final<|message|>") + content + (tokens("<|end|>") if ended else [])
    terminal = check_stream(run(partition(completion, sizes)), allow_replacement=True)
    assert items(terminal) == [("message", "final_answer", ENCODING.decode(content))]


def test_a_header_too_long_to_be_one_is_shown_while_the_model_writes():
    """Text where a header belongs is held back only up to MAX_HEADER_TOKENS tokens, not
    until the completion ends: a random model's stream went a minute without an event."""
    text = tokens("word " * (2 * MAX_HEADER_TOKENS))
    stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
    stream.start()
    assert stream.feed(TokenBatch(text[: MAX_HEADER_TOKENS - 1])) == []
    shown = stream.feed(TokenBatch(text[MAX_HEADER_TOKENS - 1 : MAX_HEADER_TOKENS]))
    assert [e.type for e in shown] == ["response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    assert shown[0].item.phase is None
    assert shown[-1].delta == ENCODING.decode(text[:MAX_HEADER_TOKENS])
    after = text[MAX_HEADER_TOKENS : MAX_HEADER_TOKENS + 3]
    assert [e.delta for e in stream.feed(TokenBatch(after))] == [ENCODING.decode(after)]  # the content, as it comes


def test_a_long_header_is_cut_only_between_characters():
    """At the limit inside a character, the header takes the tokens that finish it."""
    clef = tokens(" 𝄞")  # " ", then one 4-byte character in three tokens
    assert len(clef) == 4
    text = tokens("a") * (MAX_HEADER_TOKENS - 2) + clef + tokens(" end")
    events = run([[t] for t in text])
    terminal = check_stream(events)  # no U+FFFD: no character was split
    first = next(e for e in events if e.type == "response.output_text.delta")
    assert first.delta == "a" * (MAX_HEADER_TOKENS - 2) + " 𝄞"
    assert items(terminal) == [(*RAW, ENCODING.decode(text))]

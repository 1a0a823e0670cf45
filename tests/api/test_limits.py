"""Request shape (serve_app/api/limits.py): what is not JSON by the standard, and what is
over a limit, is a 400 that says so (the limit named), decided before the request is
validated; nothing else ever escapes (never a 500)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.api.errors import APIError
from serve_app.api.limits import RequestLimits
from serve_app.api.request import parse_request
from serve_app.api.websocket import CreateEvent, parse_client_event

SMALL = RequestLimits(
    max_json_depth=8,
    max_input_items=3,
    max_tools=3,
    max_array_items=4,
    max_schema_depth=3,
    max_schema_nodes=12,
    max_text_chars=1024,
    max_id_chars=64,
    max_metadata_pairs=2,
    max_metadata_key_chars=4,
    max_metadata_value_chars=8,
)
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}


def refused(body: dict | bytes, limits: RequestLimits = SMALL) -> APIError:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(APIError) as error:
        parse_request(data, limits)
    assert error.value.status_code == 400
    return error.value


def request(**fields) -> dict:
    return {"model": "m", "input": "hi", **fields}


def tools(n: int) -> list[dict]:
    return [{**TOOL, "name": f"f{i}"} for i in range(n)]


def nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


# (name, body over the limit, body at the limit, setting, code, param)
OVER = [
    (
        "input items",
        request(input=["x"] * 4),
        request(input=[{"role": "user", "content": "x"}] * 3),
        "max_input_items",
        "array_above_max_length",
        "input",
    ),
    ("tools", request(tools=tools(4)), request(tools=tools(3)), "max_tools", "array_above_max_length", "tools"),
    (
        "namespace functions count as tools",
        request(tools=[{"type": "namespace", "name": "ns", "tools": tools(3)}]),
        request(tools=[{"type": "namespace", "name": "ns", "tools": tools(2)}]),
        "max_tools",
        "array_above_max_length",
        "tools",
    ),
    (
        "any other array",
        request(include=["x"] * 5),
        request(include=["reasoning.encrypted_content"] * 4),
        "max_array_items",
        "array_above_max_length",
        "include",
    ),
    ("nesting", request(extra=nested(8)), request(extra=nested(6)), "max_json_depth", "nesting_too_deep", "extra" + "[0]" * 7),
    (
        "schema depth",
        request(tools=[{**TOOL, "parameters": {"type": "object", "properties": {"a": {"type": "object"}}, "x": [[[1]]]}}]),
        request(tools=[{**TOOL, "parameters": {"type": "object", "properties": {"a": {"type": "object"}}}}]),
        "max_schema_depth",
        "nesting_too_deep",
        "tools[0].parameters",
    ),
    (
        "schema values, all schemas together",
        request(
            tools=tools(3), text={"format": {"type": "json_schema", "name": "a", "schema": {"type": "object", "properties": {"a": {}}}}}
        ),
        request(tools=tools(3), text={"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}}),
        "max_schema_nodes",
        "schema_too_large",
        "text.format.schema",
    ),
    ("a text", request(input="x" * 1025), request(input="x" * 1024), "max_text_chars", "string_above_max_length", "input"),
    ("a key", request(extra={"k" * 1025: 1}), request(extra={"k" * 1024: 1}), "max_text_chars", "string_above_max_length", "extra"),
    (
        "an id",
        request(previous_response_id="r" * 65),
        request(user="u" * 64),
        "max_id_chars",
        "string_above_max_length",
        "previous_response_id",
    ),
    (
        "an item's call id",
        request(input=[{"type": "function_call_output", "call_id": "c" * 65, "output": "x"}]),
        request(input=[{"role": "user", "content": "x", "id": "i" * 64}]),
        "max_id_chars",
        "string_above_max_length",
        "input[0].call_id",
    ),
    (
        "metadata pairs",
        request(metadata={"a": "1", "b": "2", "c": "3"}),
        request(metadata={"a": "1", "b": "2"}),
        "max_metadata_pairs",
        "object_above_max_properties",
        "metadata",
    ),
    (
        "metadata key",
        request(metadata={"abcde": "1"}),
        request(metadata={"abcd": "1"}),
        "max_metadata_key_chars",
        "string_above_max_length",
        "metadata",
    ),
    (
        "metadata value",
        request(metadata={"a": "123456789"}),
        request(metadata={"a": "12345678"}),
        "max_metadata_value_chars",
        "string_above_max_length",
        "metadata.a",
    ),
]


@pytest.mark.parametrize(("name", "over", "within", "setting", "code", "param"), OVER, ids=[case[0] for case in OVER])
def test_a_request_over_a_limit_is_a_400_naming_it(name, over, within, setting, code, param):
    error = refused(over)
    assert (error.code, error.param) == (code, param)
    assert f"request_limits.{setting}" in error.message
    other: APIError | None = None
    try:
        parse_request(json.dumps(within).encode(), SMALL)
    except APIError as error:
        other = error
    assert other is None or f"request_limits.{setting}" not in other.message  # within the limits: whatever else is wrong, not this limit


def test_limits_are_checked_before_validation():
    """Tools whose schemas are each wrong, and input items each wrong: refused by their count
    alone, before any of them is looked at (validating 50,000 tools took ~55 s)."""
    many_tools = request(tools=[{**TOOL, "name": f"f{i}", "parameters": {"type": "nope"}} for i in range(5_000)])
    assert refused(many_tools, RequestLimits()).code == "array_above_max_length"
    assert refused(request(input=[{"role": "robot"}] * 50_000), RequestLimits()).param == "input"


def test_duplicate_tool_names_are_found_among_many():
    body = request(tools=[*tools(511), {**TOOL, "name": "f7"}])
    error = refused(body, RequestLimits())
    assert "duplicate function or custom tool names: ['f7']" in error.message


@pytest.mark.slow
def test_many_items_are_validated_in_slices_with_their_place_named():
    """Items validated a slice at a time still name the item at fault by its place."""
    items = [{"role": "user", "content": "x"}] * 5_000 + [{"role": "robot", "content": "x"}]
    error = refused(request(input=items), RequestLimits())
    assert (error.param, error.code) == ("input[5000].role", "invalid_value")
    parts = [{"role": "user", "content": [{"type": "input_text", "text": "x"}] * 900}] * 9 + [
        {"role": "user", "content": [{"type": "input_image"}]}
    ]
    assert refused(request(input=parts), RequestLimits()).param == "input[9].content[0]"
    ok = parse_request(json.dumps(request(input=[{"role": "user", "content": str(i)} for i in range(5_000)])).encode())
    assert [item.text for item in ok.input_items()] == [str(i) for i in range(5_000)]


# --- JSON that is not JSON ------------------------------------------------------------------

MALFORMED = [
    ("lone surrogate in metadata", b'{"model":"m","input":"hi","metadata":{"k":"\\ud800"}}', "invalid_value", "metadata.k"),
    ("lone surrogate in user", b'{"model":"m","input":"hi","user":"\\udc00"}', "invalid_value", "user"),
    ("lone surrogate in a text", b'{"model":"m","input":[{"role":"user","content":"a\\udbff b"}]}', "invalid_value", "input[0].content"),
    ("lone surrogate in a key", b'{"model":"m","input":"hi","extra":{"\\ud800":1}}', "invalid_value", "extra"),
    (
        "lone surrogate in a tool",
        b'{"model":"m","input":"hi","tools":[{"type":"function","name":"f","description":"\\ude00"}]}',
        "invalid_value",
        "tools[0].description",
    ),
    ("low before high", b'{"model":"m","input":"\\udc00\\ud800"}', "invalid_value", "input"),
    ("deep nesting", b'{"model":"m","input":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nesting_too_deep", None),
    ("deep objects", b'{"model":"m","input":"hi","x":' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"}", "nesting_too_deep", None),
    ("NaN", b'{"model":"m","input":"hi","temperature":NaN}', "invalid_json", None),
    ("Infinity", b'{"model":"m","input":"hi","temperature":Infinity}', "invalid_json", None),
    ("-Infinity", b'{"model":"m","input":"hi","top_p":-Infinity}', "invalid_json", None),
    ("a float beyond a double", b'{"model":"m","input":"hi","temperature":1e999}', "invalid_json", None),
    ("a huge integer", b'{"model":"m","input":"hi","max_output_tokens":1' + b"0" * 5_000 + b"}", "invalid_json", None),
    ("a long fraction", b'{"model":"m","input":"hi","temperature":0.' + b"1" * 500 + b"}", "invalid_json", None),
    ("a duplicate key", b'{"model":"m","input":"hi","input":"there"}', "invalid_json", None),
    ("a duplicate nested key", b'{"model":"m","input":[{"role":"user","role":"system","content":"x"}]}', "invalid_json", None),
    ("not UTF-8", b'{"model":"m","input":"\xff\xfe"}', "invalid_json", None),
    ("UTF-8 of a surrogate", b'{"model":"m","input":"\xed\xa0\x80"}', "invalid_value", "input"),  # json reads it as one
    ("trailing data", b'{"model":"m","input":"hi"} {}', "invalid_json", None),
]


@pytest.mark.parametrize(("name", "body", "code", "param"), MALFORMED, ids=[case[0] for case in MALFORMED])
def test_what_is_not_json_is_a_400(name, body, code, param):
    error = refused(body, RequestLimits())
    assert (error.code, error.param) == (code, param)


def test_a_surrogate_pair_is_text():
    assert parse_request(b'{"model":"m","input":"hi \\ud83d\\ude00"}').input == "hi \U0001f600"


@pytest.mark.parametrize(("name", "body", "code", "param"), MALFORMED, ids=[case[0] for case in MALFORMED])
def test_a_websocket_message_is_decoded_as_strictly(name, body, code, param):
    message = body.replace(b'{"model"', b'{"type":"response.create","model"', 1)
    try:
        event = parse_client_event(message)
    except APIError as error:  # the message itself is unusable
        got = error.code
    else:
        assert isinstance(event, CreateEvent)
        assert event.error is not None
        got = event.error.code
    assert got == code


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec=None), max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(st.characters(codec=None), max_size=6), inner, max_size=4),
    max_leaves=20,
)


@pytest.mark.slow
@settings(max_examples=300)
@given(st.sampled_from(["input", "metadata", "user", "tools", "text", "instructions", "extra"]), JSON)
def test_any_value_anywhere_is_a_request_or_a_400(field, value):
    """Any JSON value (lone surrogates in strings and keys, any number) in any field: a
    request, or an APIError, nothing else."""
    body = json.dumps({"model": "m", "input": "hi", field: value}).encode()  # ensure_ascii: surrogates as \\u escapes
    refusal: APIError | None = None
    try:
        parse_request(body, SMALL)
    except APIError as error:
        refusal = error
    assert refusal is None or refusal.status_code == 400


def test_an_image_url_is_bounded_by_its_own_limit_not_the_texts():
    """A data URL is the image itself: longer than any text may be, bounded by `max_image_url_chars`."""
    limits = SMALL.model_copy(update={"max_image_url_chars": 4096})
    url = "data:image/png;base64," + "A" * 3000  # longer than max_text_chars (1024)
    image = {"type": "input_image", "image_url": url, "file_id": None}
    ok = parse_request(json.dumps(request(input=[{"role": "user", "content": [image]}])).encode(), limits)
    assert ok.input_items()[0].content[0].image_url == url
    too_long = {**image, "image_url": url + "A" * 2000}
    error = refused(request(input=[{"role": "user", "content": [too_long]}]), limits)
    assert (error.param, error.code) == ("input[0].content[0]", "string_above_max_length")
    assert "request_limits.max_image_url_chars" in error.message
    # Any other string that long is still a text over its limit.
    assert refused(request(input=[{"role": "user", "content": [{"type": "input_text", "text": url}]}]), limits).code == (
        "string_above_max_length"
    )


def test_a_chat_image_url_is_bounded_by_the_image_limit():
    from serve_app.api.chat import parse_chat_request

    limits = SMALL.model_copy(update={"max_image_url_chars": 4096})
    url = "data:image/png;base64," + "A" * 3000
    part = {"type": "image_url", "image_url": {"url": url, "detail": "low"}}
    _, responses = parse_chat_request(json.dumps({"model": "m", "messages": [{"role": "user", "content": [part]}]}).encode(), limits)
    assert responses.input_items()[0].content[0].model_dump() == {"type": "input_image", "image_url": url, "file_id": None, "detail": "low"}
    part["image_url"]["url"] += "A" * 2000
    with pytest.raises(APIError) as error:
        parse_chat_request(json.dumps({"model": "m", "messages": [{"role": "user", "content": [part]}]}).encode(), limits)
    assert error.value.param == "messages[0].content[0].image_url"

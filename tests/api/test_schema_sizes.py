"""Schemas whose smallest value is huge: `minLength`, `minItems` and pattern repetitions that
multiply along the nesting (or along `$ref`s reached by many paths). The engine's grammar would
be asked for more than any answer holds, and the replay models' `instance()` built the whole
value in memory (`minLength: 10**10` is ten gigabytes): one request took a replica down."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from serve_app.api.json_schema import MAX_SMALLEST_SIZE, instance, schema_error
from serve_app.api.request import ResponsesRequest
from serve_app.engines.replay import ReplayBackend
from serve_app.families.constraints import callable_functions
from serve_app.server.app import ServedModel, create_app


def _strict(properties: dict, defs: dict | None = None) -> dict:
    schema = {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}
    return {**schema, "$defs": defs} if defs else schema


def _nested_arrays(levels: int, min_items: int) -> dict:
    node: dict = {"type": "string"}
    for _ in range(levels):
        node = {"type": "array", "items": node, "minItems": min_items}
    return node


def _ref_chain(levels: int, width: int, **properties: dict) -> dict:
    """Each level holds the next one `width` times: width**levels leaves, from a schema of
    `levels` nodes (within the nesting `instance()` follows)."""
    defs = {f"d{i}": _strict({f"p{j}": {"$ref": f"#/$defs/d{i + 1}"} for j in range(width)}) for i in range(levels)}
    defs[f"d{levels}"] = {"type": "string"}
    return _strict({"root": {"$ref": "#/$defs/d0"}, **properties}, defs)


HUGE = {
    "one long string": _strict({"a": {"type": "string", "minLength": 10**10}}),
    "arrays nested": _strict({"a": _nested_arrays(3, 1000)}),
    "refs reached by many paths": _ref_chain(15, 4),
    "a pattern's repetitions": _strict({"a": {"type": "string", "pattern": "^(a{1000}){1000}$"}}),
    "many items of a long string": _strict({"a": {"type": "array", "minItems": 2000, "items": {"type": "string", "minLength": 1000}}}),
}


@pytest.mark.parametrize("name", HUGE)
def test_a_schema_whose_smallest_value_is_huge_is_a_400(name):
    error = schema_error(HUGE[name], strict=True, param="text.format.schema", what="text.format")
    assert error is not None
    assert error.status_code == 400
    assert f"at most {MAX_SMALLEST_SIZE}" in error.message


@pytest.mark.parametrize("name", HUGE)
def test_a_function_with_such_a_schema_is_not_enforced(name):
    request = ResponsesRequest.model_validate(
        {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f", "parameters": HUGE[name]}], "tool_choice": "required"}
    )
    assert callable_functions(request) == {"f": True}  # any JSON: nothing for a grammar, nothing for instance() to build


def test_ordinary_schemas_with_minimums_are_kept():
    schema = _ref_chain(
        6,
        2,
        summary={"type": "string", "minLength": 500},
        tags={"type": "array", "minItems": 3, "maxItems": 3, "items": {"type": "string", "pattern": "^[a-z]{3,8}$"}},
    )
    assert schema_error(schema, strict=True, param="p", what="w") is None
    assert len(instance(schema)["summary"]) == 500


def test_through_the_api_the_replay_model_answers_400_before_building_anything():
    app = create_app([ServedModel("gpt-oss-replay", ReplayBackend())])
    body = {
        "model": "gpt-oss-replay",
        "input": "hi",
        "text": {"format": {"type": "json_schema", "name": "big", "strict": True, "schema": _strict({"a": _nested_arrays(2, 1100)})}},
    }

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as client:
            return await client.post("/v1/responses", json=body)

    response = asyncio.run(post())
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["param"] == "text.format.schema"

"""The supported JSON Schema subset: what is refused (named), and the replay models'
deterministic instances, which must validate (formats included) against their schema."""

from __future__ import annotations

import jsonschema
import pytest
import regex

from serve_app.api.json_schema import FORMAT_EXAMPLES, PATTERN_TIMEOUT_S, UnsupportedSchema, check_schema, instance, strict_problem

SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "string", "minLength": 12}, "b": {"type": "string", "maxLength": 3}}},
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 9}, "x": {"type": "number", "exclusiveMinimum": 2.5}},
    },
    {"type": "object", "properties": {"n": {"type": "integer", "exclusiveMaximum": -3}, "m": {"type": "integer", "exclusiveMinimum": 0.5}}},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 3, "maxItems": 4},
    {"type": "array", "prefixItems": [{"const": 1}, {"type": "null"}], "items": False},
    {"type": ["null", "string"], "enum": [None, "x"]},
    {
        "anyOf": [{"$ref": "#/$defs/p"}, {"type": "null"}],
        "$defs": {"p": {"type": "object", "properties": {"q": {"$ref": "#/definitions/r"}}, "required": ["q"]}},
        "definitions": {"r": {"type": "string", "enum": ["z"]}},
    },
    {"type": "object", "properties": {f: {"type": "string", "format": f} for f in FORMAT_EXAMPLES}},
    {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2,4}$"},
            "mail": {"type": "string", "pattern": "^[^@]+@[a-z]+\\.(com|org)$"},
        },
    },
    {"type": "object", "additionalProperties": {"type": "integer"}},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_instances_validate(schema):
    check_schema(schema)
    value = instance(schema)
    jsonschema.validate(value, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    assert instance(schema) == value  # deterministic


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "object", "not": {}}, "'not'"),
        ({"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}, "'oneOf' (at schema.properties.a)"),
        ({"type": "array", "contains": {"type": "string"}}, "'contains'"),
        ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "'if'"),
        ({"type": "string", "pattern": "a+", "maxLength": 3}, "'pattern'/'format' together with"),
        ({"type": "object", "minProperties": 1}, "'minProperties'"),
        ({"type": "object", "properties": {"p": {"type": "string", "pattern": "^(?!admin).+$"}}}, "(at schema.properties.p): lookaround"),
        ({"type": "string", "pattern": "(a+)-\\1"}, "backreferences"),
        ({"type": "string", "pattern": "x|(y(?<=y))*"}, "lookaround"),
    ],
)
def test_unsupported_features_are_named(schema, named):
    with pytest.raises(UnsupportedSchema, match=named.replace("(", r"\(").replace(")", r"\)")):
        check_schema(schema)


def test_regular_patterns_are_fine():
    for pattern in ("^[A-Z]{3}-\\d{2,4}$", "(a|b)+?c", "^(?:x|y){2}$"):
        check_schema({"type": "string", "pattern": pattern})


def test_a_property_named_like_a_keyword_is_fine():
    check_schema({"type": "object", "properties": {"not": {"type": "string"}, "allOf": {"type": "integer"}}})


def test_not_json_schema():
    for schema in ({"type": "nope"}, {"properties": 5}, {"required": "a"}):
        with pytest.raises(ValueError, match="not a valid JSON schema") as info:
            check_schema(schema)
        assert not isinstance(info.value, UnsupportedSchema)


def test_strict_rules():
    closed = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {}, "additionalProperties": False}},
        "required": ["a"],
        "additionalProperties": False,
    }
    assert strict_problem(closed) is None
    assert "additionalProperties" in strict_problem({**closed, "additionalProperties": True})
    assert "missing 'a'" in strict_problem({**closed, "required": []})
    nested_open = {**closed, "properties": {"a": {"type": "object", "properties": {}}}}
    assert "schema.properties.a" in strict_problem(nested_open)
    assert "root" in strict_problem({"type": "array"})


def test_a_backtracking_pattern_gets_its_example_in_bounded_time():
    """`^(a*)*a{22}$` made `re` backtrack for 0.5 s, doubling per character: the example
    string is checked by `regex` with a timeout (`PATTERN_TIMEOUT_S`), so any pattern costs
    at most that, and an example it cannot confirm in time is refused, not waited for."""
    for pattern in ["^(a*)*a{22}$", "^(a|aa)+$", "^(\\w+\\s?)*$"]:
        example = instance({"type": "string", "pattern": pattern})
        assert regex.fullmatch(pattern, example, timeout=1.0), (pattern, example)
    assert PATTERN_TIMEOUT_S <= 0.1

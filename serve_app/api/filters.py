"""Attribute filters as OpenAI's `filters` (vector store search, `file_search`): a comparison
`{"key", "type": eq|ne|gt|gte|lt|lte|in|nin, "value"}` or a compound `{"type": and|or,
"filters": [...]}`, evaluated on a file's `attributes` (strings, numbers, booleans).

A comparison on a key the attributes do not hold is false (`ne` and `nin` too: a file without
the attribute is not what the filter asks about); an order comparison of values of different
types is false. Filters are bounded in depth and size when they are parsed."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Scalar = str | float | bool
MAX_FILTER_DEPTH = 8
MAX_FILTER_NODES = 256
MAX_ATTRIBUTES = 16  # as OpenAI: up to 16 key-value pairs on a file
MAX_ATTRIBUTE_KEY_CHARS = 64
MAX_ATTRIBUTE_VALUE_CHARS = 512
# What `check_attributes` checks, as JSON Schema (/openapi.json): `json_schema_extra` of an
# `attributes: dict[str, Any] | None` field.
ATTRIBUTES_FIELD: dict[str, Any] = {
    "anyOf": [
        {"type": "null"},
        {
            "type": "object",
            "maxProperties": MAX_ATTRIBUTES,
            "propertyNames": {"type": "string", "minLength": 1, "maxLength": MAX_ATTRIBUTE_KEY_CHARS},
            "additionalProperties": {
                "anyOf": [{"type": "string", "maxLength": MAX_ATTRIBUTE_VALUE_CHARS}, {"type": "number"}, {"type": "boolean"}]
            },
        },
    ]
}


class ComparisonFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=MAX_ATTRIBUTE_KEY_CHARS)
    type: Literal["eq", "ne", "gt", "gte", "lt", "lte", "in", "nin"]
    value: Annotated[str, Field(max_length=MAX_ATTRIBUTE_VALUE_CHARS)] | bool | float | list[str | float] = Field(
        union_mode="left_to_right"
    )

    def matches(self, attributes: dict[str, Any]) -> bool:
        if self.key not in attributes:
            return False
        have = attributes[self.key]
        want = self.value
        if self.type in ("in", "nin"):
            values = want if isinstance(want, list) else [want]
            found = any(_equal(have, value) for value in values)
            return found if self.type == "in" else not found
        if isinstance(want, list):
            return False
        if self.type == "eq":
            return _equal(have, want)
        if self.type == "ne":
            return not _equal(have, want)
        if isinstance(have, bool) or isinstance(want, bool):
            return False
        if isinstance(have, str) != isinstance(want, str):
            return False
        try:
            if self.type == "gt":
                return bool(have > want)
            if self.type == "gte":
                return bool(have >= want)
            if self.type == "lt":
                return bool(have < want)
            return bool(have <= want)
        except TypeError:
            return False


class CompoundFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["and", "or"]
    filters: list[ComparisonFilter | CompoundFilter] = Field(min_length=1, max_length=MAX_FILTER_NODES)

    def matches(self, attributes: dict[str, Any]) -> bool:
        results = (f.matches(attributes) for f in self.filters)
        return all(results) if self.type == "and" else any(results)


Filter = ComparisonFilter | CompoundFilter


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return bool(a == b)


def check_filter(value: Filter) -> Filter:
    """`value`, or a ValueError when it is deeper or larger than this server evaluates."""

    def walk(node: Filter, depth: int) -> int:
        if depth > MAX_FILTER_DEPTH:
            raise ValueError(f"filters nest deeper than {MAX_FILTER_DEPTH} levels")
        if isinstance(node, ComparisonFilter):
            return 1
        return 1 + sum(walk(child, depth + 1) for child in node.filters)

    if walk(value, 1) > MAX_FILTER_NODES:
        raise ValueError(f"filters hold more than {MAX_FILTER_NODES} conditions")
    return value


def check_attributes(attributes: dict[str, Any] | None) -> dict[str, Scalar]:
    """A file's attributes as OpenAI bounds them (16 keys of 64 characters, values strings
    of 512, numbers or booleans); a ValueError naming what is wrong."""
    if attributes is None:
        return {}
    if len(attributes) > MAX_ATTRIBUTES:
        raise ValueError(f"attributes hold at most {MAX_ATTRIBUTES} keys")
    checked: dict[str, Scalar] = {}
    for key, value in attributes.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_ATTRIBUTE_KEY_CHARS:
            raise ValueError(f"attribute keys are strings of 1 to {MAX_ATTRIBUTE_KEY_CHARS} characters")
        if isinstance(value, str):
            if len(value) > MAX_ATTRIBUTE_VALUE_CHARS:
                raise ValueError(f"attribute {key!r}: strings hold at most {MAX_ATTRIBUTE_VALUE_CHARS} characters")
        elif not isinstance(value, bool | int | float):
            raise ValueError(f"attribute {key!r}: values are strings, numbers or booleans")
        checked[key] = value
    return checked

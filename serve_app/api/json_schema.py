"""The JSON Schema subset this server enforces (`text.format` json_schema), OpenAI's strict-mode
rules, and a deterministic instance of a schema (what the replay models answer).

The engine's grammar (vLLM structured outputs, xgrammar) turns a schema into a token mask;
xgrammar covers only part of JSON Schema and silently ignores some keywords, so a schema using
one is refused here with a 400 naming it, rather than "enforced" wrongly. The keyword list
comes from `jsonschema` (every keyword with validation meaning in drafts 7 and 2020-12).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from re import _constants as sre  # type: ignore[attr-defined]  # the stdlib's regex parser: no new dependency
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

import jsonschema
import regex

from serve_app.api.errors import APIError, invalid_request

# What xgrammar enforces (vLLM's `has_xgrammar_unsupported_json_features` and xgrammar's
# JSON-schema converter) and `instance()` below can produce.
SUPPORTED_KEYWORDS = frozenset(
    {
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "anyOf",
        "$ref",
    }
)
VALIDATION_KEYWORDS = frozenset(jsonschema.Draft202012Validator.VALIDATORS) | frozenset(jsonschema.Draft7Validator.VALIDATORS)
UNSUPPORTED_KEYWORDS = VALIDATION_KEYWORDS - SUPPORTED_KEYWORDS
# xgrammar's string formats (vLLM's STRING_SUPPORTED_FORMATS) that `instance()` can write.
FORMAT_EXAMPLES = {
    "email": "user@example.com",
    "date": "2024-01-31",
    "time": "12:00:00Z",
    "date-time": "2024-01-31T12:00:00Z",
    "duration": "P1D",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "hostname": "example.com",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "uri": "https://example.com/",
    "uri-reference": "/path",
    "uri-template": "/items/{id}",
    "json-pointer": "/a/b",
    "relative-json-pointer": "0/a",
}
_SCHEMA_TYPES = {"object", "array", "string", "integer", "number", "boolean", "null"}


# `json_schema_extra` of a field whose value is a JSON Schema: /openapi.json (server/openapi.py)
# describes it as one (any, or of type `object`: a function's `parameters`).
SCHEMA_FIELD: dict[str, Any] = {"x-json-schema": "any"}
OBJECT_SCHEMA_FIELD: dict[str, Any] = {"x-json-schema": "object"}


class UnsupportedSchema(ValueError):
    """A valid JSON Schema this server cannot enforce (or strict mode does not allow)."""


def check_schema(schema: Any) -> None:
    """`ValueError` unless `schema` is a JSON Schema; `UnsupportedSchema` naming the first
    feature this server cannot enforce."""
    if not isinstance(schema, dict):
        raise ValueError("a JSON schema must be an object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"not a valid JSON schema: {exc.message}") from None
    for path, node in _subschemas(schema, "schema"):
        if not isinstance(node, dict):
            continue
        if used := sorted(UNSUPPORTED_KEYWORDS & node.keys()):
            raise UnsupportedSchema(f"'{used[0]}' (at {path}) is not supported by this server's structured outputs")
        fmt = node.get("format")
        if fmt is not None and fmt not in FORMAT_EXAMPLES:
            raise UnsupportedSchema(f"string format '{fmt}' (at {path}) is not supported by this server's structured outputs")
        if isinstance(pattern := node.get("pattern"), str) and (problem := regex_problem(pattern)):
            raise UnsupportedSchema(f"'pattern' {pattern!r} (at {path}): {problem}")
        if ("pattern" in node or "format" in node) and ("minLength" in node or "maxLength" in node):
            raise UnsupportedSchema(f"'pattern'/'format' together with 'minLength'/'maxLength' (at {path}) is not supported")
        ref = node.get("$ref")
        if ref is not None and not (ref == "#" or ref.startswith(("#/$defs/", "#/definitions/"))):
            raise UnsupportedSchema(f"'$ref' to '{ref}' (at {path}): only local references ('#/$defs/...') are supported")
    if (size := _smallest_size(schema, schema, 0, {})) > MAX_SMALLEST_SIZE:
        raise UnsupportedSchema(
            f"the smallest value it allows is about {size} characters long (minLength, minItems and pattern repetitions "
            f"multiplied along its nesting); at most {MAX_SMALLEST_SIZE} are supported"
        )


# The smallest value a schema allows, in characters, as `instance()` writes it: a schema
# whose minimums multiply along its nesting (`minItems` 1000 three arrays deep) asks the
# engine for more than any answer holds, and `instance()` would build all of it in memory.
MAX_SMALLEST_SIZE = 1_000_000


def _smallest_size(schema: Any, root: dict[str, Any], depth: int, seen: dict[tuple[int, int], int]) -> int:
    """The length of `instance(schema)`, roughly, without building it: each node sized once
    per depth (`$ref`s reached along many paths would otherwise be walked once per path)."""
    if not isinstance(schema, dict) or depth > 32:  # deeper: `instance()` refuses it
        return 2
    if (known := seen.get((id(schema), depth))) is not None:
        return known
    size = seen[(id(schema), depth)] = _node_size(schema, root, depth, seen)
    return size


def _node_size(schema: dict[str, Any], root: dict[str, Any], depth: int, seen: dict[tuple[int, int], int]) -> int:
    if "$ref" in schema:
        try:
            target = _resolve(root, schema["$ref"])
        except (KeyError, TypeError, AttributeError):
            return 2
        return _smallest_size(target, root, depth + 1, seen)
    if "const" in schema or "enum" in schema:
        return 2  # written in the request: within its size limit
    if isinstance(schema.get("anyOf"), list) and schema["anyOf"]:
        return _smallest_size(schema["anyOf"][0], root, depth + 1, seen)
    types = _types(schema) or ["object" if "properties" in schema else "string"]
    kind = next((t for t in types if t != "null"), "null")
    if kind == "object":
        properties = schema.get("properties")
        named: dict[str, Any] = properties if isinstance(properties, dict) else {}
        return 2 + sum(len(name) + 4 + _smallest_size(sub, root, depth + 1, seen) for name, sub in named.items())
    if kind == "array":
        given = schema.get("prefixItems")
        prefix: list[Any] = given if isinstance(given, list) else []
        count = max(_count(schema.get("minItems"), 1), len(prefix))
        count = min(count, _count(schema.get("maxItems"), count))
        items = schema.get("items")
        each = _smallest_size(items if isinstance(items, dict) else {}, root, depth + 1, seen)
        return 2 + sum(_smallest_size(sub, root, depth + 1, seen) for sub in prefix) + max(0, count - len(prefix)) * (each + 1)
    if kind == "string":
        if isinstance(pattern := schema.get("pattern"), str):
            try:
                return 2 + _pattern_size(sre_parse.parse(pattern))
            except (re.error, RecursionError):
                return 2
        return 2 + max(len("example"), _count(schema.get("minLength"), 0))
    return 24  # a number, a boolean, null


def _count(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _pattern_size(tokens: Any) -> int:
    """The length of the shortest-repetition example of a parsed pattern (`_regex_example`)."""
    size = 0
    for op, arg in tokens:
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
            size += arg[0] * _pattern_size(arg[2])
        elif op is sre.SUBPATTERN:
            size += _pattern_size(arg[-1])
        elif op is sre.BRANCH:
            size += _pattern_size(arg[1][0])
        elif op is getattr(sre, "ATOMIC_GROUP", None):
            size += _pattern_size(arg)
        elif op is not sre.AT:
            size += 1
    return size


# Grammar engines match regular languages: no lookaround, no backreferences.
_IRREGULAR = {
    sre.ASSERT: "lookaround",
    sre.ASSERT_NOT: "lookaround",
    sre.GROUPREF: "backreferences",
    sre.GROUPREF_EXISTS: "conditional groups",
}


def regex_problem(pattern: str) -> str | None:
    """Why a grammar cannot enforce `pattern` (xgrammar and llguidance alike), or None.
    (`check_schema` has refused a pattern `re` cannot read: jsonschema checks it.)"""
    try:
        tokens = list(sre_parse.parse(pattern))
    except re.error:
        return None
    while tokens:
        op, arg = tokens.pop()
        if op in _IRREGULAR:
            return f"{_IRREGULAR[op]} cannot be enforced by a grammar"
        if op is sre.SUBPATTERN:
            tokens.extend(arg[-1])
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
            tokens.extend(arg[2])
        elif op is sre.BRANCH:
            tokens.extend(token for branch in arg[1] for token in branch)
        elif op is getattr(sre, "ATOMIC_GROUP", None):
            tokens.extend(arg)
    return None


def strict_problem(schema: dict[str, Any]) -> str | None:
    """What breaks OpenAI's strict-mode rules (every object closed, every property required)."""
    if schema.get("type") != "object":
        return "the root of a strict schema must be 'type': 'object'"
    for path, node in _subschemas(schema, "schema"):
        if not isinstance(node, dict) or "object" not in _types(node):
            continue
        if node.get("additionalProperties") is not False:
            return f"'additionalProperties' is required to be supplied and to be false (at {path})"
        missing = sorted(set(node.get("properties", {})) - set(node.get("required", [])))
        if missing:
            return f"'required' must list every property; missing '{missing[0]}' (at {path})"
    return None


def _types(node: dict[str, Any]) -> list[str]:
    kind = node.get("type")
    return [kind] if isinstance(kind, str) else list(kind or [])


def _subschemas(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every schema position in a schema (not the keys of `properties` and the like)."""
    yield path, node
    if not isinstance(node, dict):
        return
    for key in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas"):
        for name, sub in (node.get(key) or {}).items() if isinstance(node.get(key), dict) else ():
            yield from _subschemas(sub, f"{path}.{key}.{name}")
    for key in (
        "additionalProperties",
        "items",
        "not",
        "contains",
        "propertyNames",
        "if",
        "then",
        "else",
        "unevaluatedItems",
        "unevaluatedProperties",
        "additionalItems",
    ):
        sub = node.get(key)
        if isinstance(sub, dict):
            yield from _subschemas(sub, f"{path}.{key}")
        elif key == "items" and isinstance(sub, list):
            for i, item in enumerate(sub):
                yield from _subschemas(item, f"{path}.items[{i}]")
    for key in ("anyOf", "allOf", "oneOf", "prefixItems"):
        for i, sub in enumerate(node.get(key) or ()):
            yield from _subschemas(sub, f"{path}.{key}[{i}]")


def schema_error(schema: Any, *, strict: bool, param: str, what: str) -> APIError | None:
    """The 400 for a schema that is not JSON Schema, unsupported, or not strict; None if fine."""
    try:
        check_schema(schema)
        problem = strict_problem(schema) if strict else None
    except UnsupportedSchema as exc:
        return invalid_request(f"Invalid schema for {what}: {exc}.", param=param, code="invalid_value")
    except ValueError as exc:
        return invalid_request(f"Invalid schema for {what}: {exc}.", param=param, code="invalid_value")
    if problem:
        return invalid_request(f"Invalid schema for {what} (strict): {problem}.", param=param, code="invalid_value")
    return None


# --- a deterministic instance ------------------------------------------------------------


def instance(schema: Any, root: dict[str, Any] | None = None, _depth: int = 0) -> Any:
    """A small JSON value valid against `schema` (the supported subset), the same every time."""
    root = schema if root is None else root
    if schema is True or schema == {} or not isinstance(schema, dict):
        return {}
    if _depth > 32:
        raise UnsupportedSchema("the schema nests deeper than 32 levels")
    if "$ref" in schema:
        return instance(_resolve(root, schema["$ref"]), root, _depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return instance(schema["anyOf"][0], root, _depth + 1)
    types = _types(schema) or ["object" if "properties" in schema else "string"]
    kind = next((t for t in types if t != "null"), "null")
    if kind == "object":
        properties = schema.get("properties", {})
        return {name: instance(sub, root, _depth + 1) for name, sub in properties.items()}
    if kind == "array":
        prefix = [instance(sub, root, _depth + 1) for sub in schema.get("prefixItems", [])]
        count = max(schema.get("minItems", 1), len(prefix))
        count = min(count, schema.get("maxItems", count))
        items = schema.get("items")
        if items is False:
            return prefix[:count]
        return (prefix + [instance(items if isinstance(items, dict) else {}, root, _depth + 1) for _ in range(count - len(prefix))])[:count]
    if kind == "string":
        return _string(schema)
    if kind in ("integer", "number"):
        return _number(schema, kind)
    if kind == "boolean":
        return True
    return None


def _resolve(root: dict[str, Any], ref: str) -> Any:
    node: Any = root
    for part in ref.removeprefix("#").strip("/").split("/") if ref != "#" else ():
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _string(schema: dict[str, Any]) -> str:
    if "format" in schema:
        return FORMAT_EXAMPLES[schema["format"]]
    if "pattern" in schema:
        return _regex_example(schema["pattern"])
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    text = "example"
    if len(text) < low:
        text += "x" * (low - len(text))
    return text if high is None else text[:high]


def _number(schema: dict[str, Any], kind: str) -> int | float:
    bounds: dict[str, Any] = {k: schema[k] for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in schema}
    step = 1 if kind == "integer" else 0.5
    candidates: list[Any] = [0, bounds.get("minimum"), bounds.get("maximum")]
    candidates += [bounds["exclusiveMinimum"] + step] if "exclusiveMinimum" in bounds else []
    candidates += [bounds["exclusiveMaximum"] - step] if "exclusiveMaximum" in bounds else []
    check = jsonschema.Draft202012Validator({"type": kind, **bounds})
    for value in candidates:
        if value is not None:
            value = int(-(-value // 1)) if kind == "integer" else value  # round up to an integer
            if check.is_valid(value):
                return value
    raise UnsupportedSchema(f"no {kind} satisfies {bounds}")


_CATEGORY_EXAMPLES = {
    sre.CATEGORY_DIGIT: "0",
    sre.CATEGORY_WORD: "a",
    sre.CATEGORY_SPACE: " ",
    sre.CATEGORY_NOT_DIGIT: "a",
    sre.CATEGORY_NOT_WORD: "-",
    sre.CATEGORY_NOT_SPACE: "a",
}


def _regex_example(pattern: str) -> str:
    """The shortest-repetition string the pattern matches (first branch, first character of
    each class): deterministic, checked with `re` before it is used."""

    def write(tokens: Iterable[tuple[Any, Any]]) -> str:
        out = []
        for op, arg in tokens:
            if op is sre.LITERAL:
                out.append(chr(arg))
            elif op is sre.ANY:
                out.append("a")
            elif op is sre.NOT_LITERAL:
                out.append("b" if arg == ord("a") else "a")
            elif op is sre.IN:
                out.append(_class_example(arg))
            elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
                low, _, sub = arg
                out.append(write(sub) * low)
            elif op is sre.SUBPATTERN:
                out.append(write(arg[-1]))
            elif op is sre.BRANCH:
                out.append(write(arg[1][0]))
            elif op is sre.CATEGORY:
                out.append(_CATEGORY_EXAMPLES.get(arg, "a"))
            elif op is sre.AT:
                continue
            else:
                raise UnsupportedSchema(f"no example string for pattern {pattern!r}")
        return "".join(out)

    example = write(sre_parse.parse(pattern))
    try:  # a client's pattern, backtracking (`^(a*)*a{22}$` doubles its time per character): bounded
        found = regex.search(pattern, example, timeout=PATTERN_TIMEOUT_S)
    except (TimeoutError, regex.error):
        found = None
    if found is None:
        raise UnsupportedSchema(f"no example string for pattern {pattern!r} (or not within {PATTERN_TIMEOUT_S} s)")
    return example


PATTERN_TIMEOUT_S = 0.05  # a client's pattern against a string: at most this long


def _class_example(items: list[tuple[Any, Any]]) -> str:
    negated = items and items[0][0] is sre.NEGATE
    if negated:
        for candidate in "a0 -_xZ":
            if not any(_in_class(candidate, op, arg) for op, arg in items[1:]):
                return candidate
        raise UnsupportedSchema("no example for a negated character class")
    op, arg = items[0]
    if op is sre.LITERAL:
        return chr(arg)
    if op is sre.RANGE:
        return chr(arg[0])
    if op is sre.CATEGORY:
        return _CATEGORY_EXAMPLES.get(arg, "a")
    raise UnsupportedSchema("no example for a character class")


def _in_class(char: str, op: Any, arg: Any) -> bool:
    if op is sre.LITERAL:
        return char == chr(arg)
    if op is sre.RANGE:
        return bool(arg[0] <= ord(char) <= arg[1])  # arg: the range's (low, high) code points
    if op is sre.CATEGORY:
        return {
            sre.CATEGORY_DIGIT: char.isdigit(),
            sre.CATEGORY_WORD: char.isalnum() or char == "_",
            sre.CATEGORY_SPACE: char.isspace(),
        }.get(arg, False)
    return False

"""What a request may hold, checked before anything expensive is done with it.

A body is decoded by `decode_json`, strictly: text that is not JSON by the standard is a 400
before anything else looks at it (NaN and Infinity, numbers of more than `MAX_NUMBER_CHARS`
characters or beyond a float's range, a key twice in one object, nesting deeper than Python
can decode). `check_shape` then walks the decoded body once, in linear time, before it is
validated into a request, rendered or tokenized, and refuses with a 400 that names the
limit (`RequestLimits`, the config's `request_limits`):

- nesting of arrays and objects anywhere (`max_json_depth`) and inside a schema
  (`max_schema_depth`); JSON values in the request's schemas together (`max_schema_nodes`);
- input items, tools (namespaces and their functions count), any other array;
- strings: every text (`max_text_chars`), ids and names (`max_id_chars`: the request's, and
  its input items' or a conversation's new items'), `metadata`;
- a lone UTF-16 surrogate in any string (`"\\ud800"` decodes to one): not text, it could
  not be stored or sent back.

The counts that matter most (input items, tools, metadata) are checked before the walk, in
constant time: a body of 50,000 tools is refused after its decoding alone.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from serve_app.api.errors import APIError, invalid_request

MAX_NUMBER_CHARS = 100  # digits, sign, point and exponent of one number
_SURROGATE = re.compile("[\ud800-\udfff]")
# Identifiers and names: at most `max_id_chars` each (item and tool fields below, and these).
ID_FIELDS = ("model", "previous_response_id", "user", "prompt_cache_key", "safety_identifier", "service_tier", "truncation")
ITEM_ID_FIELDS = ("id", "call_id", "name", "namespace", "role", "type", "status")


class RequestLimits(BaseModel):
    """What one request may hold; a request over a limit is a 400 that names it. Checked in
    linear time before the request is validated, rendered or tokenized."""

    model_config = ConfigDict(extra="forbid")

    max_json_depth: int = Field(64, ge=8, le=500, description="nesting of arrays and objects anywhere in a request body")
    max_input_items: int = Field(10_000, ge=1, description="items in `input` (a conversation sent whole holds all of its turns)")
    max_tools: int = Field(512, ge=1, description="tools, counting each namespace and each function in it")
    max_array_items: int = Field(1_000, ge=1, description="any other array: content parts, `include`, a schema's `enum`, ...")
    max_schema_depth: int = Field(32, ge=1, description="nesting inside one JSON schema (a tool's `parameters`, `text.format.schema`)")
    max_schema_nodes: int = Field(20_000, ge=1, description="JSON values in all the request's schemas together")
    max_text_chars: int = Field(
        512 * 1024, ge=1024, description="characters of any one string (a message, instructions, a tool output): about a 131k-token context"
    )
    max_id_chars: int = Field(
        512, ge=64, description="characters of an id or a name (`model`, `previous_response_id`, `user`, call ids ...)"
    )
    max_image_url_chars: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="characters of an image's URL (`input_image.image_url`, Chat Completions' `image_url.url`): a base64 `data:` URL "
        "holds the image; bounded apart from `max_text_chars` (and by the model's `vision.max_image_bytes` when read)",
    )
    max_metadata_pairs: int = Field(16, ge=0, description="pairs in `metadata` (the OpenAI API's 16)")
    max_metadata_key_chars: int = Field(64, ge=1, description="characters of a `metadata` key (the OpenAI API's 64)")
    max_metadata_value_chars: int = Field(512, ge=1, description="characters of a `metadata` value (the OpenAI API's 512)")


DEFAULT_LIMITS = RequestLimits()

# The schema of a field holding an image's URL (`input_image.image_url`, Chat Completions'
# `image_url.url`): bounded by `max_image_url_chars`, not `max_text_chars` (server/openapi.py).
IMAGE_URL_FIELD: dict[str, Any] = {"x-image-url": True}


# --- decoding ------------------------------------------------------------------------------


class _InvalidJSON(ValueError):
    """What `decode_json` found wrong; its caller says where."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise _InvalidJSON(f"the key {json.dumps(duplicate)} appears twice in one object")
    return value


def _number(text: str) -> str:
    if len(text) > MAX_NUMBER_CHARS:
        raise _InvalidJSON(f"a number of {len(text)} characters (at most {MAX_NUMBER_CHARS})")
    return text


def _int(text: str) -> int:
    return int(_number(text))


def _float(text: str) -> float:
    value = float(_number(text))
    if not math.isfinite(value):
        raise _InvalidJSON(f"the number {text} is beyond the range of a double")
    return value


def _constant(name: str) -> Any:
    raise _InvalidJSON(f"{name} is not JSON")


BODY = "We could not parse the JSON body of your request: {}. The body must be a JSON object with 'Content-Type: application/json'."


def decode_json(body: bytes | str, message: str = BODY) -> Any:
    """The JSON value of `body`, or an `APIError` (400, `invalid_json`) whose `message` says
    what was wrong in its `{}`."""
    try:
        return json.loads(body, object_pairs_hook=_object, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except RecursionError:
        raise _nesting(None) from None
    except (UnicodeDecodeError, _InvalidJSON, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise invalid_request(message.format(exc), code="invalid_json") from None


# --- the shape -----------------------------------------------------------------------------


def _nesting(limit: int | None, param: str | None = None, setting: str = "max_json_depth") -> APIError:
    levels = f"deeper than {limit} levels (request_limits.{setting})" if limit is not None else "deeper than this server decodes"
    return invalid_request(f"The request nests arrays and objects {levels}.", param=param, code="nesting_too_deep")


def _too_many(param: str, count: int, limit: int, setting: str) -> APIError:
    return invalid_request(
        f"Invalid '{param}': array too long. Expected an array with maximum length {limit}, but got an array with length "
        f"{count} instead (request_limits.{setting}).",
        param=param,
        code="array_above_max_length",
    )


def _too_long(param: str, count: int, limit: int, setting: str) -> APIError:
    return invalid_request(
        f"Invalid '{param}': string too long. Expected a string with maximum length {limit}, but got a string with length "
        f"{count} instead (request_limits.{setting}).",
        param=param,
        code="string_above_max_length",
    )


def check_shape(data: dict[str, Any], limits: RequestLimits = DEFAULT_LIMITS) -> None:
    """Refuse a request body (decoded) over any of `limits`, with a 400 naming the limit; one
    walk over it, linear in its size. What it does not look at, validation checks later."""
    items = data.get("input")
    if isinstance(items, list) and len(items) > limits.max_input_items:
        raise _too_many("input", len(items), limits.max_input_items, "max_input_items")
    _check_tools(data.get("tools"), limits)
    _check_metadata(data.get("metadata"), limits)
    for name in ID_FIELDS:
        check_id(data.get(name), name, limits)
    conversation = data.get("conversation")
    check_id(conversation.get("id") if isinstance(conversation, dict) else conversation, "conversation", limits)
    counted = {id(items), *_tool_lists(data.get("tools"))}  # arrays with limits of their own
    for key in ("input", "items"):  # a response's input, a conversation's new items
        listed = data.get(key)
        for index, item in enumerate(listed if isinstance(listed, list) else []):
            if isinstance(item, dict):
                for name in ITEM_ID_FIELDS:
                    check_id(item.get(name), f"{key}[{index}].{name}", limits)
    schemas = list(_schemas(data))
    _check_schemas(schemas, limits)
    _walk(data, limits, counted)


def check_id(value: Any, param: str, limits: RequestLimits) -> None:
    if isinstance(value, str) and len(value) > limits.max_id_chars:
        raise _too_long(param, len(value), limits.max_id_chars, "max_id_chars")


def _check_tools(tools: Any, limits: RequestLimits) -> None:
    if not isinstance(tools, list):
        return
    count = len(tools)
    if count <= limits.max_tools:  # namespaces count their functions too
        count += sum(len(tool["tools"]) for tool in tools if isinstance(tool, dict) and isinstance(tool.get("tools"), list))
    if count > limits.max_tools:
        raise _too_many("tools", count, limits.max_tools, "max_tools")
    for index, tool in enumerate(tools):
        if isinstance(tool, dict):
            for name in ("name", "type"):
                check_id(tool.get(name), f"tools[{index}].{name}", limits)


def _tool_lists(tools: Any) -> list[int]:
    """The ids of `tools` and of its namespaces' lists of functions (counted by `max_tools`)."""
    if not isinstance(tools, list):
        return []
    return [id(tools)] + [id(tool["tools"]) for tool in tools if isinstance(tool, dict) and isinstance(tool.get("tools"), list)]


def _check_metadata(metadata: Any, limits: RequestLimits) -> None:
    if not isinstance(metadata, dict):
        return
    if len(metadata) > limits.max_metadata_pairs:
        raise invalid_request(
            f"Invalid 'metadata': too many properties. Expected an object with at most {limits.max_metadata_pairs} properties, "
            f"but got an object with {len(metadata)} properties instead (request_limits.max_metadata_pairs).",
            param="metadata",
            code="object_above_max_properties",
        )
    for key, value in metadata.items():
        if len(key) > limits.max_metadata_key_chars:
            raise _too_long("metadata", len(key), limits.max_metadata_key_chars, "max_metadata_key_chars")
        if isinstance(value, str) and len(value) > limits.max_metadata_value_chars:
            raise _too_long(f"metadata.{key}", len(value), limits.max_metadata_value_chars, "max_metadata_value_chars")


def _schemas(data: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(param, schema) of every JSON schema in the request: tools' parameters (namespaces'
    functions too) and `text.format.schema`."""
    tools = data.get("tools")
    for index, tool in enumerate(tools if isinstance(tools, list) else []):
        if not isinstance(tool, dict):
            continue
        if "parameters" in tool:
            yield f"tools[{index}].parameters", tool["parameters"]
        inner = tool.get("tools")
        for position, function in enumerate(inner if isinstance(inner, list) else []):
            if isinstance(function, dict) and "parameters" in function:
                yield f"tools[{index}].tools[{position}].parameters", function["parameters"]
    text = data.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and "schema" in fmt:
        yield "text.format.schema", fmt["schema"]


def _check_schemas(schemas: list[tuple[str, Any]], limits: RequestLimits) -> None:
    """Depth of each schema, values of all together; stops as soon as a limit is passed."""
    nodes = 0
    for param, schema in schemas:
        stack = [(schema, 1)]
        while stack:
            value, depth = stack.pop()
            nodes += 1
            if nodes > limits.max_schema_nodes:
                raise invalid_request(
                    f"The request's JSON schemas hold more than {limits.max_schema_nodes} values together "
                    "(request_limits.max_schema_nodes).",
                    param=param,
                    code="schema_too_large",
                )
            if isinstance(value, dict):
                children: Any = value.values()
            elif isinstance(value, list):
                children = value
            else:
                continue
            if depth > limits.max_schema_depth:
                raise _nesting(limits.max_schema_depth, param, "max_schema_depth")
            stack.extend((child, depth + 1) for child in children)


def _walk(data: dict[str, Any], limits: RequestLimits, counted: set[int]) -> None:
    """Every value once: depth, array lengths, string lengths, lone surrogates. The place of
    a fault is found again only when there is one (`_where`)."""
    max_depth, max_array, max_chars = limits.max_json_depth, limits.max_array_items, limits.max_text_chars
    surrogate = _SURROGATE.search
    chat_images: set[int] = set()
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if len(value) > max_chars:
                raise _too_long(_where(data, value) or "body", len(value), max_chars, "max_text_chars")
            if surrogate(value):
                raise _surrogate(_where(data, value), value)
        elif isinstance(value, dict):
            if depth > max_depth:
                raise _nesting(max_depth, _where(data, value))
            image = _image_url(value, chat_images)
            for key, child in value.items():
                if key == "file_data" and isinstance(child, str):  # an `input_file`'s base64: bounded by the body's size, decoded later
                    continue
                if image is not None and child is image:  # a data URL is the image itself: bounded on its own
                    if len(image) > limits.max_image_url_chars:
                        raise _too_long(_where(data, value) or "body", len(image), limits.max_image_url_chars, "max_image_url_chars")
                    if surrogate(image):
                        raise _surrogate(_where(data, value), image)
                    continue
                if len(key) > max_chars:
                    raise _too_long(_where(data, value) or "body", len(key), max_chars, "max_text_chars")
                if surrogate(key):
                    raise _surrogate(_where(data, value), key)
                if isinstance(child, (str, dict, list)):
                    stack.append((child, depth + 1))
        elif isinstance(value, list):
            if depth > max_depth:
                raise _nesting(max_depth, _where(data, value))
            if len(value) > max_array and id(value) not in counted:
                raise _too_many(_where(data, value) or "body", len(value), max_array, "max_array_items")
            stack.extend((child, depth + 1) for child in value if isinstance(child, (str, dict, list)))


def _image_url(value: dict[str, Any], chat_images: set[int]) -> str | None:
    """The URL string of an image part (`input_image.image_url`), or of a Chat Completions
    image part's `image_url` object (its `url`; such objects' ids are gathered in `chat_images`
    as their parts are seen), if `value` is one."""
    kind = value.get("type")
    if kind == "image_url" and isinstance(value.get("image_url"), dict):
        chat_images.add(id(value["image_url"]))
    url = value.get("image_url") if kind == "input_image" else value.get("url") if id(value) in chat_images else None
    return url if isinstance(url, str) else None


def _surrogate(param: str | None, text: str) -> APIError:
    found = _SURROGATE.search(text)
    code_point = f"\\u{ord(found.group(0)):04x}" if found else "a surrogate"
    return invalid_request(
        f"Invalid '{param or 'body'}': the string holds a lone UTF-16 surrogate ({code_point}), which is not text.",
        param=param,
        code="invalid_value",
    )


def _where(data: Any, target: Any) -> str | None:
    """The param path ('input[3].content') of the value that is `target` (by identity), found
    again by a walk that stops there; None for the body itself."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, path = stack.pop()
        if value is target:
            return path or None
        if isinstance(value, dict):
            stack.extend((child, f"{path}.{key}" if path else str(key)) for key, child in value.items())
        elif isinstance(value, list):
            stack.extend((child, f"{path}[{index}]") for index, child in enumerate(value))
    return None

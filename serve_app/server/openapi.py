"""The OpenAPI schema served at `/openapi.json`: every request body and the main answers, as
strict as the server that serves it.

The routes read their bodies themselves (a tenant's quotas admit a request from its headers,
before its body is read: server/routes/responses.py `admit`), so FastAPI knows nothing of
them. This module writes them into the app's schema from the very pydantic models the routes
validate with (`OPERATIONS`), so the two cannot drift, then tightens them with what this
app's settings enforce (`_Tightener`): `request_limits` (api/limits.py: strings, ids and
names, arrays, input items, tools, metadata, image URLs), the names of the served models (for
`/v1/completions`, of those that take raw prompts), the tag rules of the item and tool
unions. What JSON Schema cannot say (rules across fields, references to stored objects,
nesting and schema sizes) is listed in each operation's `x-unstated-rules` and description:
the server answers such a request with a 4xx in OpenAI's error shape.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI
from openai.types import Completion, FileObject, VectorStore
from openai.types.chat import ChatCompletion
from openai.types.conversations import Conversation, ConversationItemList
from openai.types.responses import CompactedResponse, InputTokenCountResponse
from openai.types.responses import Response as OpenAIResponse
from openai.types.shared import ErrorObject
from openai.types.vector_stores import VectorStoreFile, VectorStoreFileBatch
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from serve_app.api.chat import ChatRequest
from serve_app.api.completions import CompletionRequest
from serve_app.api.conversations import ConversationCreate, ConversationUpdate, ItemsCreate
from serve_app.api.filters import MAX_FILTER_DEPTH, MAX_FILTER_NODES
from serve_app.api.json_schema import UNSUPPORTED_KEYWORDS
from serve_app.api.limits import ID_FIELDS, ITEM_ID_FIELDS, RequestLimits
from serve_app.api.request import CompactRequest, ResponsesRequest
from serve_app.api.vector_stores import (
    BatchCreate,
    FileAttach,
    FileUpdate,
    SearchPage,
    SearchRequest,
    VectorStoreCreate,
    VectorStoreUpdate,
)
from serve_app.runtime.turn import ServedModel
from serve_app.server.routes.files import MAX_EXPIRES_S, MIN_EXPIRES_S, PURPOSES

__all__ = ["OPERATIONS", "Operation", "Rule", "install_openapi", "openapi_schema"]

REF = "#/components/schemas/{model}"
JSON_VALUE = "JsonValue"
JSON_SCHEMA = "JsonSchemaDocument"
JSON_SCHEMA_OBJECT = "JsonSchemaObject"
ERROR = "Error"


@dataclass(frozen=True, slots=True)
class Rule:
    """A rule of the server's that the schema cannot state: a request breaking it gets
    `status` with an OpenAI-shaped error whose `param` matches `param` (a regular expression)."""

    param: str
    status: int
    text: str

    def matches(self, status: int, param: str | None) -> bool:
        return status == self.status and re.fullmatch(self.param, param or "") is not None


# What every request with a body may meet, whatever its fields say.
_SHAPE_RULES = (
    Rule(r".*", 400, "nesting deeper than `request_limits.max_json_depth` (or, in a JSON schema, `max_schema_depth`)"),
    Rule(r".*", 400, "JSON schemas holding more than `request_limits.max_schema_nodes` values together"),
    Rule(r".*", 400, "a lone UTF-16 surrogate (`\\ud800`) in a string: JSON can spell it, but it is not text"),
)
_TOOL_RULES = (
    Rule(
        r"tools",
        400,
        "function and custom tool names (and `namespace.function`) unique; MCP `server_label`s unique and none "
        "a namespace's name or `functions`; at most one web_search, one code_interpreter and one file_search "
        "tool, whose names (`browser`, `python`, `file_search`) no other tool takes",
    ),
    Rule(
        r"tools(\[\d+\].*)?",
        400,
        f"a file_search tool's `filters` nest at most {MAX_FILTER_DEPTH} levels and hold at most {MAX_FILTER_NODES} conditions",
    ),
    Rule(r"tools", 400, "`request_limits.max_tools` counts each namespace's functions too"),
    Rule(r"tools\[\d+\](\.tools\[\d+\])?\.parameters", 400, "a function's `parameters` must be a valid JSON Schema of type `object`"),
    Rule(r"tools(\[\d+\].*)?", 400, "an MCP tool's `server_url` must be one the server's `tools.mcp.allowed_urls` allow"),
    Rule(
        r"tool_choice.*",
        400,
        "a named `tool_choice` (and `allowed_tools`, and a hosted one this server runs: file_search, web_search, code_interpreter) must name a tool in `tools`; `required` needs one",
    ),
    Rule(r"input", 400, "`text.format` `json_object` needs the word 'json' in the input or instructions"),
    Rule(
        r"text\.format.*",
        400,
        "a `json_schema` format's schema must be valid and use only what the engine's grammar enforces "
        "(strict mode: OpenAI's strict rules)",
    ),
)
_REFERENCE_RULES = (
    Rule(r"previous_response_id", 400, "`previous_response_id` names a response of the caller's that is stored"),
    Rule(r"conversation", 404, "`conversation` names a conversation of the caller's"),
    Rule(r"input\[\d+\]", 404, "an `item_reference` names an item of the caller's stored responses"),
    Rule(r"input\[\d+\].*", 400, "`encrypted_content` (reasoning, compaction) is what this server sealed for the caller"),
    Rule(
        r"input(\[\d+\].*)?",
        400,
        "the history (input, previous response, conversation) renders to a prompt within the model's "
        "context, and tool outputs answer calls in it",
    ),
)
_MEDIA_RULES = (
    Rule(
        r"(input\[\d+\]\.content\[\d+\].*)|previous_response_id|conversation",
        400,
        "an `input_image` is read by a vision model only (the model's `vision` config), in user messages, at most "
        "`vision.max_images` per conversation; it must be a readable image (a data URL, an http(s) URL the egress "
        "policy allows, or an uploaded file) within the model's `vision` bounds",
    ),
    Rule(
        r"input\[\d+\]\.(content|output)\[\d+\].*",
        400,
        "an `input_file` must be a readable document (PDF or text) within `files.input`, fetched under the egress policy by URL",
    ),
    Rule(r"input\[\d+\]\.(content|output)\[\d+\]\.file_id", 404, "an `input_image` or `input_file` `file_id` names a file of the caller's"),
)
_RESPONSES_RULES = (
    *_SHAPE_RULES,
    *_TOOL_RULES,
    *_REFERENCE_RULES,
    *_MEDIA_RULES,
    Rule(r"background", 400, "`background: true` needs `store: true`"),
    Rule(r"tools\[\d+\]\.vector_store_ids\[\d+\]", 404, "a file_search tool's `vector_store_ids` name vector stores of the caller's"),
    Rule(r"tools\[\d+\]\.vector_store_ids\[\d+\]", 400, "a file_search tool's vector stores have not expired"),
    Rule(r"conversation", 400, "at most one of `previous_response_id` and `conversation`"),
)
# The Vector Stores API's (server/routes/vector_stores.py).
_VECTOR_STORES_ON = Rule(r"", 404, "the server's config has `vector_stores` (else every Vector Stores route is a 404)")
_STORE_RULES = (
    *_SHAPE_RULES,
    _VECTOR_STORES_ON,
    Rule(r"vector_store_id", 404, "`vector_store_id` names a vector store of the caller's"),
    Rule(r"vector_store_id", 400, "the vector store has not expired"),
)
_CHUNKING_RULE = Rule(r"(files\[\d+\]\.)?chunking_strategy.*", 400, "a static `chunking_strategy`'s overlap is at most half its chunk size")
_ATTACH_RULES = (
    *_STORE_RULES,
    _CHUNKING_RULE,
    Rule(r"file_id", 400, "a vector store holds at most `vector_stores.max_files_per_store` files"),
    Rule(r"file_id", 404, "every file named is one of the caller's (Files API)"),
)
_QUEUE_RULE = Rule(
    r"file_ids|files",
    400,
    "one request attaches at most as many files as one tenant may have waiting for ingestion on a replica "
    "(`vector_stores.ingest_queue_per_tenant`; without `auth`, `ingest_queue`)",
)
_LEGACY_RULES = (
    Rule(r"n|best_of|logit_bias|suffix|store", 400, "what this server does not do (see the API page)"),
    Rule(r"stream_options", 400, "`stream_options` only with `stream: true`"),
)


@dataclass(frozen=True, slots=True)
class Operation:
    """What `/openapi.json` says of one route: its body (the model the route validates
    with; None: it takes none), its JSON answer, whether it streams (`stream: true`: an
    `text/event-stream`), and the rules the schema cannot state."""

    body: type[BaseModel] | None
    answer: type[BaseModel] | None
    summary: str
    streams: bool = False
    body_required: bool = True
    models: Literal["all", "raw_prompts"] | None = "all"
    rules: tuple[Rule, ...] = ()
    form: Mapping[str, Any] | None = None  # a multipart/form-data body's schema (`body` is None)


OPERATIONS: dict[tuple[str, str], Operation] = {
    ("/v1/responses", "post"): Operation(ResponsesRequest, OpenAIResponse, "Create a response", streams=True, rules=_RESPONSES_RULES),
    ("/v1/responses/compact", "post"): Operation(
        CompactRequest,
        CompactedResponse,
        "Compact a conversation",
        rules=(*_SHAPE_RULES, *_REFERENCE_RULES, *_MEDIA_RULES),
    ),
    ("/v1/responses/input_tokens", "post"): Operation(
        ResponsesRequest, InputTokenCountResponse, "Count a response's input tokens", rules=_RESPONSES_RULES
    ),
    ("/v1/chat/completions", "post"): Operation(
        ChatRequest,
        ChatCompletion,
        "Create a chat completion",
        streams=True,
        rules=(
            *_SHAPE_RULES,
            *_TOOL_RULES,
            *_LEGACY_RULES,
            Rule(
                r"messages(\[\d+\].*)?|input(\[\d+\].*)?",
                400,
                "the messages render to a prompt within the model's context (and to at most `request_limits.max_input_items` items)",
            ),
            Rule(r"top_logprobs", 400, "`top_logprobs` needs `logprobs: true`"),
            Rule(
                r"response_format.*",
                400,
                "a `json_schema` response format's schema must be valid and use only what the engine's grammar enforces "
                "(strict mode: OpenAI's strict rules)",
            ),
            Rule(r"messages", 400, "`response_format` `json_object` needs the word 'json' in the messages"),
            Rule(
                r"messages\[\d+\]\.content\[\d+\].*",
                400,
                "an `image_url` part is read by a vision model only, in user messages, within its `vision` bounds; a "
                "`file` part must be a readable document within `files.input`",
            ),
            Rule(r"messages\[\d+\]\.content\[\d+\]\.file_id", 404, "a `file` part's `file_id` names a file of the caller's"),
        ),
    ),
    ("/v1/completions", "post"): Operation(
        CompletionRequest,
        Completion,
        "Create a completion (raw prompt)",
        streams=True,
        models="raw_prompts",
        rules=(
            *_SHAPE_RULES,
            *_LEGACY_RULES,
            Rule(r"prompt", 400, "one prompt, not empty, within the model's context"),
        ),
    ),
    ("/v1/conversations", "post"): Operation(
        ConversationCreate, Conversation, "Create a conversation", body_required=False, models=None, rules=_SHAPE_RULES
    ),
    ("/v1/conversations/{conversation_id}", "post"): Operation(
        ConversationUpdate,
        Conversation,
        "Update a conversation's metadata",
        models=None,
        rules=(*_SHAPE_RULES, Rule(r"conversation_id", 404, "the conversation exists")),
    ),
    ("/v1/conversations/{conversation_id}/items", "post"): Operation(
        ItemsCreate,
        ConversationItemList,
        "Add items to a conversation",
        models=None,
        rules=(
            *_SHAPE_RULES,
            Rule(r"conversation_id", 404, "the conversation exists"),
            Rule(r"items.*", 400, "the conversation stays within `store.conversation_max_items` and `..._max_bytes`"),
        ),
    ),
    ("/v1/files", "post"): Operation(
        None,
        FileObject,
        "Upload a file",
        models=None,
        form={
            "type": "object",
            "properties": {
                "file": {"type": "string", "format": "binary"},
                "purpose": {"enum": list(PURPOSES)},
                "expires_after[anchor]": {"const": "created_at"},
                "expires_after[seconds]": {"type": "integer", "minimum": MIN_EXPIRES_S, "maximum": MAX_EXPIRES_S},
            },
            "required": ["file", "purpose"],
            "dependentRequired": {"expires_after[anchor]": ["expires_after[seconds]"], "expires_after[seconds]": ["expires_after[anchor]"]},
            "additionalProperties": False,
        },
        rules=(
            Rule(r"file", 413, "the file is within files.max_file_bytes"),
            Rule(r"file", 400, "the tenant's files stay within files.max_bytes_per_tenant and files.max_files_per_tenant"),
        ),
    ),
    ("/v1/vector_stores", "post"): Operation(
        VectorStoreCreate,
        VectorStore,
        "Create a vector store",
        body_required=False,
        models=None,
        rules=(
            *_SHAPE_RULES,
            _VECTOR_STORES_ON,
            _CHUNKING_RULE,
            Rule(r"name", 400, "a tenant holds at most `vector_stores.max_stores_per_tenant` vector stores"),
            Rule(r"file_id", 400, "a vector store holds at most `vector_stores.max_files_per_store` files"),
            Rule(r"file_id", 404, "every file named is one of the caller's (Files API)"),
            _QUEUE_RULE,
        ),
    ),
    ("/v1/vector_stores/{vector_store_id}", "post"): Operation(
        VectorStoreUpdate, VectorStore, "Update a vector store", body_required=False, models=None, rules=_STORE_RULES
    ),
    ("/v1/vector_stores/{vector_store_id}/search", "post"): Operation(
        SearchRequest,
        SearchPage,
        "Search a vector store",
        models=None,
        rules=(
            *_STORE_RULES,
            Rule(r"filters.*", 400, f"`filters` nest at most {MAX_FILTER_DEPTH} levels and hold at most {MAX_FILTER_NODES} conditions"),
        ),
    ),
    ("/v1/vector_stores/{vector_store_id}/files", "post"): Operation(
        FileAttach, VectorStoreFile, "Attach a file to a vector store", models=None, rules=_ATTACH_RULES
    ),
    ("/v1/vector_stores/{vector_store_id}/files/{file_id}", "post"): Operation(
        FileUpdate,
        VectorStoreFile,
        "Update a vector store file's attributes",
        models=None,
        rules=(*_STORE_RULES, Rule(r"file_id", 404, "the file is in the vector store")),
    ),
    ("/v1/vector_stores/{vector_store_id}/file_batches", "post"): Operation(
        BatchCreate, VectorStoreFileBatch, "Attach a batch of files to a vector store", models=None, rules=(*_ATTACH_RULES, _QUEUE_RULE)
    ),
    ("/v1/vector_stores/{vector_store_id}/file_batches/{batch_id}/cancel", "post"): Operation(
        None,
        VectorStoreFileBatch,
        "Cancel a file batch",
        models=None,
        rules=(_VECTOR_STORES_ON, Rule(r"vector_store_id", 404, "the vector store exists"), Rule(r"batch_id", 404, "the batch exists")),
    ),
    ("/v1/responses/{response_id}/cancel", "post"): Operation(
        None,
        OpenAIResponse,
        "Cancel a background response",
        models=None,
        rules=(
            Rule(r"response_id", 404, "the response exists"),
            Rule(r"response_id", 400, "it is a background response"),
        ),
    ),
}


def install_openapi(app: FastAPI, served: Mapping[str, ServedModel], limits: RequestLimits) -> None:
    """Serve `openapi_schema` at the app's `/openapi.json` (made at the first call, then kept)."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_schema(base(), served, limits)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to change its schema


def openapi_schema(generated: dict[str, Any], served: Mapping[str, ServedModel], limits: RequestLimits) -> dict[str, Any]:
    """FastAPI's schema of the app (`generated`: its paths) with `OPERATIONS` written in."""
    schema = copy.deepcopy(generated)
    schema["openapi"] = "3.1.0"
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = []
    for operation in OPERATIONS.values():
        if operation.body is not None:
            models.append((operation.body, "validation"))
        if operation.answer is not None:
            models.append((operation.answer, "serialization"))
    models.append((ErrorObject, "serialization"))
    keys, definitions = models_json_schema(list(dict.fromkeys(models)), ref_template=REF)
    components.update(definitions.get("$defs", {}))
    components[ERROR] = {
        "type": "object",
        "properties": {"error": keys[(ErrorObject, "serialization")]},
        "required": ["error"],
        "description": "Every error: OpenAI's shape, `param` naming the parameter at fault.",
    }
    tightener = _Tightener(components, limits)
    tightener.define_json_values()
    names = list(served)
    raw = [name for name, model in served.items() if model.raw_prompts]
    for (path, method), operation in OPERATIONS.items():
        entry = schema["paths"].get(path, {}).get(method)
        if entry is None:
            continue
        entry["summary"] = operation.summary
        if operation.body is not None:
            body = copy.deepcopy(keys[(operation.body, "validation")])
            served_names = names if operation.models == "all" else raw if operation.models else None
            tightener.root(components[_ref_name(body)], served_names)
            entry["requestBody"] = {"required": operation.body_required, "content": {"application/json": {"schema": body}}}
        elif operation.form is not None:
            entry["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": dict(operation.form)}}}
        entry["responses"] = _responses(operation, keys)
        if operation.rules:
            entry["x-unstated-rules"] = [{"param": rule.param, "status": rule.status, "rule": rule.text} for rule in operation.rules]
            entry["description"] = "Rules the schema cannot state (a 4xx names the parameter):\n" + "\n".join(
                f"- {rule.text} ({rule.status})" for rule in dict.fromkeys(operation.rules)
            )
    return schema


def _responses(operation: Operation, keys: Mapping[tuple[Any, JsonSchemaMode], Any]) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": {"$ref": REF.format(model=ERROR)}}}}
    ok: dict[str, Any] = {"description": "Successful Response"}
    if operation.answer is not None:
        content: dict[str, Any] = {"application/json": {"schema": keys[(operation.answer, "serialization")]}}
        if operation.streams:
            content["text/event-stream"] = {"schema": {"type": "string"}, "description": "with `stream: true`"}
        ok["content"] = content
    answers: dict[str, Any] = {"200": ok}
    for status, what in [
        ("400", "Invalid request"),
        ("401", "No valid API key"),
        ("404", "Not found (a model, or a stored object the request names)"),
        ("408", "The body did not arrive in time"),
        ("413", "The body is too large"),
        ("429", "Over the tenant's quotas"),
        ("503", "The server or the model is at capacity, or unavailable"),
    ]:
        answers[status] = {"description": what, **error}
    return answers


def _ref_name(node: Mapping[str, Any]) -> str:
    return str(node["$ref"]).rsplit("/", 1)[-1]


class _Tightener:
    """Writes `request_limits` and the tag rules into the request models' schemas (in
    `components`, in place). Each definition reachable from a request body is tightened once."""

    def __init__(self, components: dict[str, Any], limits: RequestLimits) -> None:
        self.components = components
        self.limits = limits
        self.done: set[str] = set()

    # -- free-form JSON --

    def define_json_values(self) -> None:
        """`JsonValue`: any JSON value within the string, key and array limits;
        `JsonSchemaDocument`: a JSON Schema as the server takes one (the keywords it checks typed)."""
        limits = self.limits
        value = {"$ref": REF.format(model=JSON_VALUE)}
        string = {"type": "string", "maxLength": limits.max_text_chars}
        self.components[JSON_VALUE] = {
            "description": "Any JSON value (strings, keys and arrays within `request_limits`).",
            "anyOf": [
                string,
                {"type": "number"},
                {"type": "boolean"},
                {"type": "null"},
                {"type": "array", "items": value, "maxItems": limits.max_array_items},
                {"type": "object", "propertyNames": string, "additionalProperties": value},
            ],
        }
        schema = {"$ref": REF.format(model=JSON_SCHEMA)}
        types = {"enum": ["object", "array", "string", "integer", "number", "boolean", "null"]}
        names = {"type": "string", "maxLength": limits.max_text_chars}
        count = {"type": "integer", "minimum": 0}
        schemas = {"type": "array", "items": schema, "minItems": 1, "maxItems": limits.max_array_items}
        self.components[JSON_SCHEMA] = {
            "description": "A JSON Schema (its keywords typed as the server checks them).",
            "type": "object",
            "properties": {
                "type": {"anyOf": [types, {"type": "array", "items": types, "minItems": 1, "uniqueItems": True, "maxItems": 7}]},
                "properties": {"type": "object", "propertyNames": names, "additionalProperties": schema},
                "required": {"type": "array", "items": names, "uniqueItems": True, "maxItems": limits.max_array_items},
                "items": schema,
                "additionalProperties": {"anyOf": [{"type": "boolean"}, schema]},
                "enum": {"type": "array", "items": value, "minItems": 1, "maxItems": limits.max_array_items},
                "const": value,
                "anyOf": schemas,
                "minItems": count,
                "maxItems": count,
                "minLength": count,
                "maxLength": count,
                "minimum": {"type": "number"},
                "maximum": {"type": "number"},
                "description": names,
                "title": names,
                "$defs": {"type": "object", "propertyNames": names, "additionalProperties": schema},
            },
            # Other keys are annotations (the validation keywords the grammar cannot enforce are refused).
            "propertyNames": {**names, "not": {"enum": sorted(UNSUPPORTED_KEYWORDS | {"$ref", "format", "pattern"})}},
            "additionalProperties": value,
        }
        self.components[JSON_SCHEMA_OBJECT] = {
            "description": "A JSON Schema of type `object` (a function's `parameters`).",
            "allOf": [schema, {"properties": {"type": {"const": "object"}}}],
        }
        self.done |= {JSON_VALUE, JSON_SCHEMA, JSON_SCHEMA_OBJECT}

    # -- the bodies --

    def root(self, node: dict[str, Any], model_names: list[str] | None) -> None:
        """A request body's schema (its own definition), tightened, with `model` one of
        `model_names` (None: left as it is). Definitions no body reaches (the answers') stay
        as pydantic wrote them."""
        limits = self.limits
        properties = node.get("properties", {})
        for name in ID_FIELDS:
            if name in properties:
                self._id(properties[name])
        if "conversation" in properties:
            self._id(properties["conversation"])
            for ref in self._refs(properties["conversation"]):
                self._id(self.components[ref]["properties"]["id"])
        if model_names is not None and "model" in properties:
            properties["model"] = {**properties["model"], "enum": model_names}
        for name, limit in [("input", limits.max_input_items), ("tools", limits.max_tools), ("items", limits.max_input_items)]:
            if name in properties:
                for array in self._arrays(properties[name]):
                    array["maxItems"] = min(array.get("maxItems", limit), limit)
                    if name in ("input", "items"):
                        self._item_ids(array["items"])
                    if name == "tools":
                        self._tool_names(array["items"])
        if "metadata" in properties:
            for mapping in self._objects(properties["metadata"]):  # within the limits and the model's own bounds
                mapping["maxProperties"] = min(mapping.get("maxProperties", limits.max_metadata_pairs), limits.max_metadata_pairs)
                for key, limit in [
                    ("propertyNames", limits.max_metadata_key_chars),
                    ("additionalProperties", limits.max_metadata_value_chars),
                ]:
                    own = mapping.get(key)
                    bound = own.get("maxLength", limit) if isinstance(own, dict) else limit
                    mapping[key] = {"type": "string", "maxLength": min(bound, limit)}
        self._walk(node)

    def _id(self, node: dict[str, Any]) -> None:
        for string in self._strings(node):
            string["maxLength"] = min(string.get("maxLength", self.limits.max_id_chars), self.limits.max_id_chars)

    def _item_ids(self, union: dict[str, Any]) -> None:
        for ref in self._refs(union):
            properties = self.components[ref].get("properties", {})
            for name in ITEM_ID_FIELDS:
                if name in properties:
                    self._id(properties[name])

    def _tool_names(self, union: dict[str, Any]) -> None:
        for ref in self._refs(union):
            properties = self.components[ref].get("properties", {})
            for name in ("name", "type"):
                if name in properties:
                    self._id(properties[name])

    def _walk(self, node: Any) -> None:
        """Every string, array and free-form object under `node` within the limits."""
        if isinstance(node, list):
            for child in node:
                self._walk(child)
            return
        if not isinstance(node, dict):
            return
        if "$ref" in node:
            name = _ref_name(node)
            if name not in self.done:
                self.done.add(name)
                self._walk(self.components[name])
            return
        if node.pop("x-image-url", None):  # api/limits.py IMAGE_URL_FIELD: an image's URL, a data URL holding the image
            for string in self._strings(node):
                string["maxLength"] = min(string.get("maxLength", self.limits.max_image_url_chars), self.limits.max_image_url_chars)
            return
        marker = node.pop("x-json-schema", None)  # api/json_schema.py SCHEMA_FIELD
        if marker is not None:
            target = REF.format(model=JSON_SCHEMA_OBJECT if marker == "object" else JSON_SCHEMA)
            for branch in list(self._branches(node)):
                if branch.get("type") == "object":
                    branch.clear()
                    branch["$ref"] = target
            if "$ref" in node:
                return
        limits = self.limits
        kind = node.get("type")
        if kind == "string":
            node["maxLength"] = min(node.get("maxLength", limits.max_text_chars), limits.max_text_chars)
        elif kind == "array":
            node["maxItems"] = min(node.get("maxItems", limits.max_array_items), limits.max_array_items)
            node.setdefault("items", {})
        elif kind == "object":
            extra = node.get("additionalProperties")
            if extra is True or (extra is None and not node.get("properties")):
                node["additionalProperties"] = {"$ref": REF.format(model=JSON_VALUE)}
            if "additionalProperties" in node or "propertyNames" in node:
                names = node.setdefault("propertyNames", {"type": "string"})
                names["maxLength"] = min(names.get("maxLength", limits.max_text_chars), limits.max_text_chars)
        for key in ("properties", "$defs"):
            for child in node.get(key, {}).values():
                self._replace_any(child)
                self._walk(child)
        for key in ("items", "additionalProperties", "not", "propertyNames"):
            if isinstance(node.get(key), dict):
                self._replace_any(node[key])
                self._walk(node[key])
        for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            for child in node.get(key, []):
                self._replace_any(child)
                self._walk(child)

    @staticmethod
    def _replace_any(node: dict[str, Any]) -> None:
        """`Any` (a schema without a type, a reference or a union) -> a bounded `JsonValue`. A
        schema of properties alone (a branch of a rule across fields: `MessageItem`'s) is a
        constraint beside its object's own schema, not `Any`."""
        keys = ("type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const", "not", "properties", "required")
        if isinstance(node, dict) and not any(key in node for key in keys):
            node["$ref"] = REF.format(model=JSON_VALUE)

    # -- finding the parts of a property's schema --

    def _branches(self, node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """`node` and, through unions and references, the schemas it may be."""
        yield node
        for key in ("anyOf", "oneOf", "allOf"):
            for child in node.get(key, []):
                yield from self._branches(child)

    def _strings(self, node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        return (branch for branch in self._branches(node) if branch.get("type") == "string")

    def _arrays(self, node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        return (branch for branch in self._branches(node) if branch.get("type") == "array")

    def _objects(self, node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        return (branch for branch in self._branches(node) if branch.get("type") == "object")

    def _refs(self, node: dict[str, Any]) -> Iterator[str]:
        return (_ref_name(branch) for branch in self._branches(node) if "$ref" in branch)

"""The `POST /v1/responses` request as the `openai` SDK, the Agents SDK and Codex send it.

Pydantic models validate the subset of the Responses API this server implements: its input
items in `items.py`, its tools and tool choice in `tools.py`, the request and how a body is
parsed here. Unknown top-level and item fields are ignored (Codex sends `client_metadata`,
items carry `status` and ids...); hosted tool types this server does not run (`file_search`,
...) are accepted, left out of the response and named in its headers
(`tools.server_tools.ServerToolRuntime.admit`); whether the server runs the built-in tools
(`web_search`, `code_interpreter`) is its configuration's (tools/builtin/). Everything else
that is wrong is a 400.
"""

from __future__ import annotations

import collections
from typing import Annotated, Any, Literal, TypeVar

from openai.types.responses import ResponseIncludable
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from serve_app.api.errors import from_validation_error, invalid_request
from serve_app.api.items import FUNCTION_NAME_PATTERN, HistoryItem, InputItem, ItemReference, Lenient, MessageItem
from serve_app.api.json_schema import SCHEMA_FIELD, check_schema, strict_problem
from serve_app.api.limits import DEFAULT_LIMITS, RequestLimits, check_shape, decode_json
from serve_app.api.service_tier import ServiceTier
from serve_app.api.tools import (
    SERVER_TOOL_TYPES,
    AllowedToolsChoice,
    BuiltinTool,
    CodeInterpreterTool,
    CustomTool,
    FileSearchTool,
    FunctionTool,
    HostedChoice,
    McpTool,
    McpToolChoice,
    NamedCustomChoice,
    NamedFunctionChoice,
    NamespaceTool,
    Tool,
    ToolChoiceObject,
    WebSearchTool,
    server_tool_kind,
)

_Model = TypeVar("_Model", bound=BaseModel)


class ReasoningConfig(Lenient):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class TextFormat(Lenient):
    # `_format_tag` needs the `type` (a format without one is a 400): the schema says so.
    model_config = ConfigDict(extra="ignore", json_schema_extra={"required": ["type"]})
    type: Literal["text"] = "text"


class JSONSchemaFormat(Lenient):
    """Structured outputs: the answer is JSON valid against `schema` (enforced by the engine's
    grammar). `strict: true` also makes OpenAI's strict-mode rules apply to the schema."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["json_schema"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    schema_: dict[str, Any] = Field(alias="schema", json_schema_extra=SCHEMA_FIELD)
    description: str | None = None
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _enforceable(cls, schema: dict[str, Any]) -> dict[str, Any]:
        check_schema(schema)  # not JSON Schema, or a feature the grammar cannot enforce -> 400
        return schema

    @model_validator(mode="after")
    def _strict_rules(self) -> JSONSchemaFormat:
        if self.strict and (problem := strict_problem(self.schema_)):
            raise ValueError(f"Invalid schema for response_format '{self.name}' (strict): {problem}")
        return self


class JSONObjectFormat(Lenient):
    type: Literal["json_object"]


def _format_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return f"format:{kind}" if kind in ("text", "json_schema", "json_object") else None


AnyTextFormat = Annotated[
    Annotated[TextFormat, Tag("format:text")]
    | Annotated[JSONSchemaFormat, Tag("format:json_schema")]
    | Annotated[JSONObjectFormat, Tag("format:json_object")],
    Discriminator(
        _format_tag,
        custom_error_type="invalid_value",
        custom_error_message=("text.format must be of type 'text', 'json_schema' or 'json_object'"),
    ),
]


class TextConfig(Lenient):
    format: AnyTextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # echoed (no engine knob); "medium" when unset


# The API's sampling defaults: what a request that sets none runs with, and what its
# response reports (OpenAI writes the values it used, never null).
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0


# --- the request -------------------------------------------------------------------------


class ConversationRef(Lenient):
    id: str = Field(min_length=1)


# Below this many prompt tokens compaction would hardly shorten anything (its summary and the
# latest user messages it keeps are about this long).
MIN_COMPACT_THRESHOLD = 1000


class ContextManagement(Lenient):
    """`{"type": "compaction", "compact_threshold": N}`: a response whose prompt is over N
    tokens is compacted first, inside the response (runtime/compaction.py)."""

    type: Literal["compaction"]
    compact_threshold: int | None = Field(default=None, ge=MIN_COMPACT_THRESHOLD)


def _not_empty(schema: dict[str, Any]) -> None:
    """The schema of `_not_empty`'s check: a string or an array, neither empty."""
    for branch in schema.get("anyOf", []):
        if branch.get("type") == "string":
            branch["minLength"] = 1
        elif branch.get("type") == "array":
            branch["minItems"] = 1


def _set(name: str) -> dict[str, Any]:
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


class ResponsesRequest(Lenient):
    # The schema says what `_check_combinations` checks (OpenAI's rules).
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "allOf": [
                {"not": {"required": ["background", "store"], "properties": {"background": {"const": True}, "store": {"const": False}}}},
                {"not": {"allOf": [_set("conversation"), _set("previous_response_id")]}},
            ]
        },
    )
    model: str = Field(min_length=1)
    input: str | list[InputItem] = Field(json_schema_extra=_not_empty)
    instructions: str | None = None
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceObject = "auto"
    parallel_tool_calls: bool = True
    max_tool_calls: int | None = Field(default=None, ge=0)  # server-side tool calls one response may run
    reasoning: ReasoningConfig | None = None
    # The SDK's values; those about hosted tools this server does not run include nothing.
    include: list[ResponseIncludable] = Field(default_factory=list)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    # Open Responses' (and Chat Completions') penalties; OpenAI's Responses API reports them as 0.0.
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = None  # as vLLM takes it (Chat Completions has it; the Responses API does not)
    stream: bool = False
    store: bool = True
    background: bool = False
    metadata: dict[str, str] | None = None
    previous_response_id: str | None = None
    conversation: str | ConversationRef | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    # Served as `priority`, `default` or `flex` where the model orders by tier (service_tier.py).
    service_tier: ServiceTier | None = None
    text: TextConfig | None = None
    # "auto": the oldest items are dropped to fit the context (families/truncation.py).
    truncation: Literal["auto", "disabled"] | None = "disabled"
    context_management: list[ContextManagement] | None = Field(default=None, max_length=1)

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[Any]) -> str | list[Any]:
        if not value:
            raise ValueError("input must not be empty")
        return value

    @field_validator("tools")
    @classmethod
    def _consistent_tools(cls, tools: list[Tool]) -> list[Tool]:
        """Tools the model could not tell apart (a 400 naming `tools`)."""
        functions = [t for t in tools if isinstance(t, FunctionTool)]
        customs = [t for t in tools if isinstance(t, CustomTool)]
        namespaces = [t for t in tools if isinstance(t, NamespaceTool)]
        # Functions and custom tools are both called by name (harmony: `functions.NAME`).
        names = collections.Counter([f.name for f in functions] + [c.name for c in customs])
        names.update(f"{ns.name}.{f.name}" for ns in namespaces for f in ns.functions)
        duplicates = [name for name, count in names.items() if count > 1]
        if duplicates:
            raise ValueError(f"duplicate function or custom tool names: {sorted(duplicates)}")
        # An MCP server's tools are offered as a namespace named by its label.
        labels = collections.Counter(tool.server_label for tool in tools if isinstance(tool, McpTool))
        taken = {namespace.name for namespace in namespaces} | {"functions"}
        if clash := sorted(label for label, count in labels.items() if count > 1 or label in taken):
            raise ValueError(f"MCP server_label must be unique and differ from namespace tool names and 'functions': {clash}")
        # The built-in tools are called as `browser.FUNCTION` and `python`: those names are theirs.
        builtin = collections.Counter(
            tool.type.startswith("web_search") for tool in tools if isinstance(tool, WebSearchTool | CodeInterpreterTool)
        )
        if any(count > 1 for count in builtin.values()):
            raise ValueError("at most one web_search tool and one code_interpreter tool")
        if sum(isinstance(tool, FileSearchTool) for tool in tools) > 1:
            raise ValueError("at most one file_search tool (it may name several vector_store_ids)")
        reserved = ({"browser"} if builtin[True] else set()) | ({"python"} if builtin[False] else set())
        reserved |= {"file_search"} if any(isinstance(tool, FileSearchTool) for tool in tools) else set()
        names_used = {f.name for f in functions} | {c.name for c in customs} | set(labels) | {namespace.name for namespace in namespaces}
        if clash := sorted(reserved & names_used):
            raise ValueError(
                f"the built-in tools web_search, code_interpreter and file_search are called as 'browser', 'python' and "
                f"'file_search': {clash} is taken"
            )
        return tools

    def check_consistency(self) -> None:
        """What the fields only mean together (400s that name the field)."""
        names = {f.name for f in self.function_tools()}
        names |= {f"{ns.name}.{f.name}" for ns in self.namespace_tools() for f in ns.functions}
        custom = {tool.name for tool in self.custom_tools()}
        choice = self.tool_choice
        if isinstance(choice, NamedFunctionChoice) and choice.name not in names:
            raise invalid_request(f"tool_choice names function '{choice.name}', which is not in tools.", param="tool_choice")
        if isinstance(choice, NamedCustomChoice) and choice.name not in custom:
            raise invalid_request(f"tool_choice names custom tool '{choice.name}', which is not in tools.", param="tool_choice")
        if isinstance(choice, AllowedToolsChoice):
            for index, tool in enumerate(choice.tools):
                if (tool.type == "function" and tool.name not in names) or (tool.type == "custom" and tool.name not in custom):
                    raise invalid_request(
                        f"tool_choice.tools[{index}] names {tool.type} tool '{tool.name}', which is not in tools.",
                        param=f"tool_choice.tools[{index}].name",
                    )
        if isinstance(choice, McpToolChoice) and choice.server_label not in {tool.server_label for tool in self.mcp_tools()}:
            raise invalid_request(
                f"tool_choice names MCP server '{choice.server_label}', which is not in tools.", param="tool_choice.server_label"
            )
        hosted = {server_tool_kind(tool.type) for tool in self.tools if tool.type in SERVER_TOOL_TYPES}
        if isinstance(choice, HostedChoice) and choice.type in SERVER_TOOL_TYPES and server_tool_kind(choice.type) not in hosted:
            raise invalid_request(f"tool_choice names {choice.type}, which is not in tools.", param="tool_choice.type")
        if choice == "required" and not names and not custom and not self.mcp_tools() and not hosted:
            raise invalid_request("tool_choice 'required' needs at least one tool the model can call in tools.", param="tool_choice")
        fmt = self.text.format if self.text else None
        if isinstance(fmt, JSONObjectFormat):
            texts = [self.instructions or ""] + [getattr(item, "text", "") for item in self.input_items()]
            if not any("json" in text.lower() for text in texts):
                raise invalid_request(
                    "'input' must contain the word 'json' in some form to use 'text.format' of type 'json_object'.",
                    param="input",
                )

    # -- views used by rendering --

    def compact_threshold(self, max_model_len: int) -> int | None:
        """Prompt tokens above which this response compacts first (None: never): the
        request's `compact_threshold`, else (compaction asked for without one) 80% of the
        model's context."""
        entry = next((entry for entry in self.context_management or [] if entry.type == "compaction"), None)
        if entry is None:
            return None
        return entry.compact_threshold or max(MIN_COMPACT_THRESHOLD, max_model_len * 4 // 5)

    @property
    def conversation_id(self) -> str | None:
        return self.conversation.id if isinstance(self.conversation, ConversationRef) else self.conversation

    def input_items(self) -> list[HistoryItem | ItemReference]:
        """This turn's input as sent: item references are resolved by the run (`state.responses`)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    def function_tools(self) -> list[FunctionTool]:
        return [t for t in self.tools if isinstance(t, FunctionTool)]

    def custom_tools(self) -> list[CustomTool]:
        return [t for t in self.tools if isinstance(t, CustomTool)]

    def namespace_tools(self) -> list[NamespaceTool]:
        return [t for t in self.tools if isinstance(t, NamespaceTool)]

    def mcp_tools(self) -> list[McpTool]:
        return [t for t in self.tools if isinstance(t, McpTool)]

    def web_search_tool(self) -> WebSearchTool | None:
        return next((t for t in self.tools if isinstance(t, WebSearchTool)), None)

    def file_search_tool(self) -> FileSearchTool | None:
        return next((t for t in self.tools if isinstance(t, FileSearchTool)), None)

    def code_interpreter_tool(self) -> CodeInterpreterTool | None:
        return next((t for t in self.tools if isinstance(t, CodeInterpreterTool)), None)

    def builtin_tools(self) -> list[BuiltinTool]:
        """The built-in tools the model is offered (the tool loop adds them)."""
        return [t for t in self.tools if isinstance(t, BuiltinTool)]

    @property
    def logprobs(self) -> int | None:
        """Alternatives per token the engine must report (0: the sampled token only), or None
        when the output text's logprobs are not asked for."""
        return (self.top_logprobs or 0) if "message.output_text.logprobs" in self.include else None

    def offers_tools(self) -> bool:
        return self.tool_choice != "none" and bool(
            self.function_tools() or self.custom_tools() or any(n.functions for n in self.namespace_tools()) or self.builtin_tools()
        )


class CompactRequest(Lenient):
    """`POST /v1/responses/compact`: the conversation to compact (`input` and/or
    `previous_response_id`), answered with a `response.compaction` object."""

    # The schema says what `_something_to_compact` checks.
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "anyOf": [
                {"required": ["input"], "properties": {"input": {"type": ["string", "array"], "minLength": 1, "minItems": 1}}},
                _set("previous_response_id"),
            ]
        },
    )
    model: str = Field(min_length=1)
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None

    @model_validator(mode="after")
    def _something_to_compact(self) -> CompactRequest:
        if not self.input and self.previous_response_id is None:
            raise ValueError("give 'input' and/or 'previous_response_id': there is nothing to compact")
        return self


def parse_compact_request(body: bytes | dict[str, Any], limits: RequestLimits = DEFAULT_LIMITS) -> CompactRequest:
    return parse_body(body, CompactRequest, limits)


def parse_body(body: bytes | dict[str, Any], model: type[_Model], limits: RequestLimits = DEFAULT_LIMITS) -> _Model:
    """Bytes of an HTTP body (or its decoded JSON object) -> a validated `model`, or an
    `APIError` (400): strict JSON, then the request's shape within `limits`, then its fields."""
    data = body if isinstance(body, dict) else decode_json(body)
    if not isinstance(data, dict):
        raise invalid_request("The request body must be a JSON object.", code="invalid_type")
    check_shape(data, limits)
    try:
        return model.model_validate(_with_valid_items(data))
    except ValidationError as exc:
        raise from_validation_error(exc) from None


# Input items are validated a slice at a time, each slice about this many values: pydantic
# holds the GIL while it validates, and a request rendered in a worker thread must leave the
# event loop its turns (one validation of 10,000 items held it ~0.2 s).
_SLICE_VALUES = 2_000
_INPUT_ITEMS: TypeAdapter[list[InputItem]] = TypeAdapter(list[InputItem])


def _with_valid_items(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with its `input` items validated (a slice at a time), when there are many."""
    items = data.get("input")
    if not isinstance(items, list) or len(items) <= _SLICE_VALUES // 8:
        return data
    validated: list[Any] = []
    start = 0
    while start < len(items):
        end, values = start, 0
        while end < len(items) and values < _SLICE_VALUES:
            item = items[end]
            values += 1 + (sum(len(v) for v in item.values() if isinstance(v, list)) if isinstance(item, dict) else 0)
            end += 1
        try:
            validated += _INPUT_ITEMS.validate_python(items[start:end])
        except ValidationError as exc:
            raise from_validation_error(exc, at=("input", start)) from None
        start = end
    return {**data, "input": validated}


def parse_request(body: bytes | dict[str, Any], limits: RequestLimits = DEFAULT_LIMITS) -> ResponsesRequest:
    """Bytes of the HTTP body (or the fields of a WebSocket `response.create`) -> a validated
    request, or an `APIError` (400)."""
    request = parse_body(body, ResponsesRequest, limits)
    _check_combinations(request)
    request.check_consistency()
    return request


def _check_combinations(request: ResponsesRequest) -> None:
    """Parameters that are valid alone but not together (the OpenAI API's rules)."""
    if request.background and not request.store:
        raise invalid_request(
            "Background responses must be stored: 'background': true requires 'store': true.",
            param="background",
        )
    if request.conversation is not None and request.previous_response_id is not None:
        raise invalid_request(
            "Mutually exclusive parameters: Ensure you are only providing one of: 'previous_response_id' or 'conversation'.",
            param="conversation",
            code="mutually_exclusive_parameters",
        )

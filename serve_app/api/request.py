"""The `POST /v1/responses` request as the `openai` SDK, the Agents SDK and Codex send it.

Pydantic models validate the subset of the Responses API this server implements. Unknown
top-level and item fields are ignored (Codex sends `client_metadata`, items carry `status`
and ids...), hosted tool types this server does not run (`file_search`, ...) are accepted
and simply not offered to the model. The built-in tools (`web_search`, `code_interpreter`)
are parsed here; whether the server runs them is its configuration's (tools/builtin/).
Everything else that is wrong is a 400.
"""

from __future__ import annotations

import collections
import re
from typing import Annotated, Any, Literal, TypeVar

import jsonschema
from openai.types.responses import ResponseIncludable
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    SecretStr,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from serve_app.api.errors import from_validation_error, invalid_request
from serve_app.api.json_schema import check_schema, strict_problem
from serve_app.api.limits import DEFAULT_LIMITS, RequestLimits, check_shape, decode_json
from serve_app.api.service_tier import ServiceTier

_Model = TypeVar("_Model", bound=BaseModel)
FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_\-]{1,64}$"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


# --- content parts ---------------------------------------------------------------------


class TextPart(_Lenient):
    """`input_text` / `output_text` (assistant history); both carry plain text."""

    type: Literal["input_text", "output_text"]
    text: str


class RefusalPart(_Lenient):
    type: Literal["refusal"]
    refusal: str


def _part_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind in ("input_text", "output_text"):
        return "part:text"
    return "part:refusal" if kind == "refusal" else None


ContentPart = Annotated[
    Annotated[TextPart, Tag("part:text")] | Annotated[RefusalPart, Tag("part:refusal")],
    Discriminator(
        _part_tag,
        custom_error_type="invalid_value",
        custom_error_message=(
            "content parts must be of type 'input_text', 'output_text' or 'refusal' "
            "(images, files and audio are not supported by this server)"
        ),
    ),
]


def parts_text(content: str | list[ContentPart]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.text if isinstance(p, TextPart) else p.refusal for p in content)


# --- input items -------------------------------------------------------------------------


class MessageItem(_Lenient):
    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]
    # An assistant message's part in its turn (Codex sends it back): a preamble before tool
    # calls (`commentary`) or the answer (`final_answer`); harmony renders it on that channel.
    phase: Literal["commentary", "final_answer"] | None = None

    @model_validator(mode="after")
    def _phase_is_the_assistants(self) -> MessageItem:
        if self.phase is not None and self.role != "assistant":
            raise ValueError(f"'phase' is for assistant messages; this message's role is '{self.role}'")
        return self

    @property
    def text(self) -> str:
        return parts_text(self.content)


class FunctionCallItem(_Lenient):
    type: Literal["function_call"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    namespace: str | None = None
    arguments: str


class FunctionCallOutputItem(_Lenient):
    type: Literal["function_call_output"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]

    @property
    def text(self) -> str:
        return parts_text(self.output)


class SummaryText(_Lenient):
    type: Literal["summary_text"] = "summary_text"
    text: str


class ReasoningText(_Lenient):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(_Lenient):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None

    @property
    def text(self) -> str:
        """The raw reasoning if it was sent back, else its summary."""
        if self.content:
            return "".join(part.text for part in self.content)
        return "\n\n".join(part.text for part in self.summary)


# --- items of server-side tools, sent back as history (serve_app/families/hosted.py renders them) ---


class McpListedTool(_Lenient):
    name: str
    input_schema: Any = None
    description: str | None = None
    annotations: Any = None


class McpListToolsItem(_Lenient):
    """The tools an MCP server listed: while one for a label is in the conversation, that
    server is not asked again."""

    type: Literal["mcp_list_tools"]
    id: str | None = None
    server_label: str
    tools: list[McpListedTool] = Field(default_factory=list)
    error: str | None = None


class McpCallItem(_Lenient):
    type: Literal["mcp_call"]
    id: str | None = None
    server_label: str
    name: str
    arguments: str
    output: str | None = None
    # The SDK's tagged union (openai 3.x) or a plain message (2.x): the model reads its text.
    error: str | dict[str, Any] | None = None
    approval_request_id: str | None = None
    status: str | None = None


class McpApprovalRequestItem(_Lenient):
    type: Literal["mcp_approval_request"]
    id: str = Field(min_length=1)
    server_label: str
    name: str
    arguments: str


class McpApprovalResponseItem(_Lenient):
    type: Literal["mcp_approval_response"]
    id: str | None = None
    approval_request_id: str = Field(min_length=1)
    approve: bool
    reason: str | None = None


class WebSearchCallItem(_Lenient):
    """A `web_search_call` (the browser tool); its action as the SDK types it."""

    type: Literal["web_search_call"]
    id: str | None = None
    status: str | None = None
    action: dict[str, Any] | None = None
    # What the model read of the call, within the response that made it (the item does not
    # carry it; no client can set it): the tool loop's next prompt shows it.
    _model_text: str | None = PrivateAttr(default=None)


class CodeInterpreterCallItem(_Lenient):
    """A `code_interpreter_call` (the python tool): its code and, when included, its outputs."""

    type: Literal["code_interpreter_call"]
    id: str | None = None
    code: str | None = None
    container_id: str | None = None
    outputs: list[dict[str, Any]] | None = None
    status: str | None = None
    _model_text: str | None = PrivateAttr(default=None)  # as for WebSearchCallItem


HOSTED_ITEM_TYPES = (
    "mcp_list_tools",
    "mcp_call",
    "mcp_approval_request",
    "mcp_approval_response",
    "web_search_call",
    "code_interpreter_call",
)


class ItemReference(_Lenient):
    """An earlier item by its id (the Vercel AI SDK sends reasoning back so when `store` is on):
    resolved from the caller's stored responses before anything is rendered."""

    type: Literal["item_reference"] = "item_reference"
    id: str = Field(min_length=1, max_length=256)


def _item_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        if "type" in value:
            return f"item:{value['type']}"
        # EasyInputMessage has no `type`, nor has an item reference (an `id` without a `role`).
        return "item:item_reference" if "id" in value and "role" not in value else "item:message"
    return f"item:{getattr(value, 'type', None)}"


# An item a request's `input` may hold.
InputItem = Annotated[
    Annotated[MessageItem, Tag("item:message")]
    | Annotated[FunctionCallItem, Tag("item:function_call")]
    | Annotated[FunctionCallOutputItem, Tag("item:function_call_output")]
    | Annotated[ReasoningItem, Tag("item:reasoning")]
    | Annotated[McpListToolsItem, Tag("item:mcp_list_tools")]
    | Annotated[McpCallItem, Tag("item:mcp_call")]
    | Annotated[McpApprovalRequestItem, Tag("item:mcp_approval_request")]
    | Annotated[McpApprovalResponseItem, Tag("item:mcp_approval_response")]
    | Annotated[WebSearchCallItem, Tag("item:web_search_call")]
    | Annotated[CodeInterpreterCallItem, Tag("item:code_interpreter_call")]
    | Annotated[ItemReference, Tag("item:item_reference")],
    Discriminator(
        _item_tag,
        custom_error_type="invalid_value",
        custom_error_message=(
            "input items must be of type 'message', 'function_call', 'function_call_output', 'reasoning', "
            + ", ".join(f"'{kind}'" for kind in HOSTED_ITEM_TYPES)
            + ", 'item_reference'"
        ),
    ),
]
# An item as stored (a response's input, a conversation's items): never a reference.
StoredInputItem = Annotated[
    Annotated[MessageItem, Tag("item:message")]
    | Annotated[FunctionCallItem, Tag("item:function_call")]
    | Annotated[FunctionCallOutputItem, Tag("item:function_call_output")]
    | Annotated[ReasoningItem, Tag("item:reasoning")]
    | Annotated[McpListToolsItem, Tag("item:mcp_list_tools")]
    | Annotated[McpCallItem, Tag("item:mcp_call")]
    | Annotated[McpApprovalRequestItem, Tag("item:mcp_approval_request")]
    | Annotated[McpApprovalResponseItem, Tag("item:mcp_approval_response")]
    | Annotated[WebSearchCallItem, Tag("item:web_search_call")]
    | Annotated[CodeInterpreterCallItem, Tag("item:code_interpreter_call")],
    Discriminator(
        _item_tag,
        custom_error_type="invalid_value",
        custom_error_message=(
            "input items must be of type 'message', 'function_call', 'function_call_output', 'reasoning', "
            + ", ".join(f"'{kind}'" for kind in HOSTED_ITEM_TYPES)
        ),
    ),
]
# An item of a conversation's history, as the families render it.
HistoryItem = (
    MessageItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | ReasoningItem
    | McpListToolsItem
    | McpCallItem
    | McpApprovalRequestItem
    | McpApprovalResponseItem
    | WebSearchCallItem
    | CodeInterpreterCallItem
)


# --- tools ---------------------------------------------------------------------------------


class FunctionTool(_Lenient):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _valid_schema(cls, parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        if parameters is None:
            return None
        try:
            jsonschema.validators.validator_for(parameters).check_schema(parameters)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"not a valid JSON schema: {exc.message}") from None
        if parameters.get("type", "object") != "object":
            raise ValueError("function parameters must be a JSON schema of type 'object'")
        return parameters


class HostedTool(BaseModel):
    """A tool type this server does not execute (web_search, file_search, ...): not offered."""

    model_config = ConfigDict(extra="allow")
    type: str


class McpToolFilter(_Lenient):
    """Tools of an MCP server picked by name and/or by their `readOnlyHint` annotation."""

    tool_names: list[str] | None = None
    read_only: bool | None = None

    def matches(self, name: str, read_only_hint: bool | None) -> bool:
        if self.tool_names is not None and name not in self.tool_names:
            return False
        return self.read_only is None or bool(read_only_hint) == self.read_only

    @property
    def empty(self) -> bool:
        return self.tool_names is None and self.read_only is None


class McpApprovalFilter(_Lenient):
    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}")
_HEADER_VALUE = re.compile(r"[\x20-\x7e]{0,8192}")
# Headers that say where a request goes, how it is framed or who sent it, and the MCP
# protocol's own: the connection's and the MCP client's to set, never a request's. A `Host`
# of the request's choosing would reach another virtual host behind an allowed address.
_CONNECTION_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "expect",
        "proxy-authorization",
        "proxy-connection",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-forwarded-port",
        "x-real-ip",
        "content-type",
        "accept",
        "last-event-id",
    }
)


class McpTool(_Lenient):
    """A remote MCP server whose tools the server runs inside the response
    (serve_app/tools/mcp_client.py). `headers` and `authorization` are secrets: sent to
    that server only, never stored, logged or echoed (pydantic's `SecretStr` hides them from
    every dump and repr)."""

    type: Literal["mcp"]
    server_label: str = Field(pattern=FUNCTION_NAME_PATTERN)
    server_url: str | None = None
    connector_id: str | None = None
    tunnel_id: str | None = None
    headers: dict[str, SecretStr] | None = None
    authorization: SecretStr | None = None
    allowed_tools: list[str] | McpToolFilter | None = None
    # Unset: OpenAI's default, every call needs the client's approval.
    require_approval: Literal["always", "never"] | McpApprovalFilter | None = None
    server_description: str | None = None

    @model_validator(mode="after")
    def _served_by_url(self) -> McpTool:
        if self.connector_id is not None or self.tunnel_id is not None:
            raise ValueError("MCP connectors and tunnels are not supported by this server: give a server_url")
        if not self.server_url:
            raise ValueError("an MCP tool needs a server_url")
        # Checked here, where the message can say which header without showing its value: an
        # HTTP client's own error would quote it.
        for name, value in {**(self.headers or {}), **({"authorization": self.authorization} if self.authorization else {})}.items():
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError("an MCP header name must be an HTTP token (letters, digits and !#$%&'*+-.^_`|~)")
            if name.lower() in _CONNECTION_HEADERS or name.lower().startswith("mcp-"):
                raise ValueError(f"the MCP header {name!r} is set by the server's MCP client, not by a request")
            if not _HEADER_VALUE.fullmatch(value.get_secret_value()):
                raise ValueError(f"the value of MCP header {name!r} must be visible ASCII characters and spaces (it is not shown here)")
        return self

    def allows(self, name: str, read_only_hint: bool | None) -> bool:
        """Whether the request lets the model use this server's tool `name`."""
        allowed = self.allowed_tools
        if allowed is None:
            return True
        if isinstance(allowed, list):
            return name in allowed
        return allowed.matches(name, read_only_hint)

    def needs_approval(self, name: str, read_only_hint: bool | None) -> bool:
        policy = self.require_approval
        if policy == "never":
            return False
        if policy is None or policy == "always":
            return True
        if policy.never is not None and not policy.never.empty and policy.never.matches(name, read_only_hint):
            return False
        if policy.always is not None and not policy.always.empty:
            if policy.always.matches(name, read_only_hint):
                return True
            if policy.never is None:  # only `always` given: it names the tools that need approval
                return False
        return True  # named by neither: approval, the safe default

    def secret_headers(self) -> dict[str, str]:
        """The HTTP headers for this server: `headers`, and `authorization` as a bearer token."""
        headers = {name: value.get_secret_value() for name, value in (self.headers or {}).items()}
        if self.authorization is not None:
            headers["Authorization"] = f"Bearer {self.authorization.get_secret_value()}"
        return headers

    def echo(self) -> dict[str, Any]:
        """The tool as a response shows it: without its secrets."""
        return self.model_dump(exclude_none=True, exclude={"headers", "authorization"})


class WebSearchFilters(_Lenient):
    allowed_domains: list[Annotated[str, Field(min_length=1, max_length=253)]] | None = Field(None, max_length=100)


WEB_SEARCH_TYPES = ("web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11")


class WebSearchTool(_Lenient):
    """`web_search` (and `web_search_preview`, and their dated names): gpt-oss's browser.
    `filters.allowed_domains` bounds every page it shows; `search_context_size` and
    `user_location` are accepted and not used."""

    type: Literal["web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11"]
    filters: WebSearchFilters | None = None

    @property
    def allowed_domains(self) -> list[str] | None:
        return self.filters.allowed_domains if self.filters is not None else None


CONTAINER_ID_MAX_CHARS = 256


class AutoContainer(_Lenient):
    """`container: {"type": "auto"}`: a new container for the response, made at its first call."""

    type: Literal["auto"]
    file_ids: list[str] | None = None
    memory_limit: str | None = None  # accepted; the server's limits apply

    @field_validator("file_ids")
    @classmethod
    def _no_files(cls, file_ids: list[str] | None) -> list[str] | None:
        if file_ids:
            raise ValueError("file_ids are not supported: this server has no Files API (the code can write files in /mnt/data)")
        return file_ids


class CodeInterpreterTool(_Lenient):
    """`code_interpreter`: gpt-oss's python tool, in a container of the caller's (a
    container id to reuse one, or `{"type": "auto"}`)."""

    type: Literal["code_interpreter"]
    container: Annotated[str, Field(min_length=1, max_length=CONTAINER_ID_MAX_CHARS)] | AutoContainer = Field(
        default_factory=lambda: AutoContainer(type="auto")
    )


class BuiltinTool(_Lenient):
    """A built-in tool as the model is offered it: the tool loop adds it to the request it
    renders (serve_app/tools/builtin/); no client sends it (no `type` leads here).
    Harmony models see it in the system message as the namespace gpt-oss was trained on,
    with its `functions` (the browser's search, open, find; none for python, which takes
    the message as its code). Chat-template models are offered its functions as
    `NAME.FUNCTION`, or, without functions, the tool itself as a function of `parameters`
    (python's `{"code": ...}`)."""

    type: Literal["builtin"] = "builtin"
    name: str
    description: str
    functions: list[FunctionTool] = Field(default_factory=list)
    parameters: dict[str, Any] | None = None


def _tool_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind in ("function", "namespace", "mcp", "code_interpreter"):
        return f"tool:{kind}"
    if kind in WEB_SEARCH_TYPES:
        return "tool:web_search"
    if isinstance(value, BuiltinTool):  # added by the tool loop, never parsed from a request
        return "tool:builtin"
    return "tool:hosted" if isinstance(kind, str) else None


_TOOL_TAG = Discriminator(_tool_tag, custom_error_type="missing_tool_type", custom_error_message="every tool needs a string 'type'")


class NamespaceTool(_Lenient):
    """A group of functions (Codex sends these); the model calls them as `NAME.function`."""

    type: Literal["namespace"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str = ""
    tools: list[Annotated[Annotated[FunctionTool, Tag("tool:function")] | Annotated[HostedTool, Tag("tool:hosted")], _TOOL_TAG]] = Field(
        default_factory=list
    )

    @property
    def functions(self) -> list[FunctionTool]:
        return [tool for tool in self.tools if isinstance(tool, FunctionTool)]


Tool = Annotated[
    Annotated[FunctionTool, Tag("tool:function")]
    | Annotated[NamespaceTool, Tag("tool:namespace")]
    | Annotated[McpTool, Tag("tool:mcp")]
    | Annotated[WebSearchTool, Tag("tool:web_search")]
    | Annotated[CodeInterpreterTool, Tag("tool:code_interpreter")]
    | Annotated[BuiltinTool, Tag("tool:builtin")]
    | Annotated[HostedTool, Tag("tool:hosted")],
    _TOOL_TAG,
]


class NamedFunctionChoice(_Lenient):
    type: Literal["function"]
    name: str


class McpToolChoice(_Lenient):
    """Call a tool of the MCP server `server_label`: `name`, or any of its tools."""

    type: Literal["mcp"]
    server_label: str
    name: str | None = None


class AllowedToolRef(_Lenient):
    type: str
    name: str | None = None

    @model_validator(mode="after")
    def _named_function(self) -> AllowedToolRef:
        if self.type == "function" and not self.name:
            raise ValueError("a function in allowed_tools needs a 'name'")
        return self


class AllowedToolsChoice(_Lenient):
    """Only these tools may be called; `required`: one of them must be."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[AllowedToolRef] = Field(min_length=1)


def _choice_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind in ("function", "allowed_tools", "mcp"):
        return f"choice:{kind}"
    return "choice:hosted" if isinstance(kind, str) else None


# A hosted tool type (`web_search`, ...) is accepted and never enforced (it is not offered).
ToolChoiceObject = Annotated[
    Annotated[NamedFunctionChoice, Tag("choice:function")]
    | Annotated[AllowedToolsChoice, Tag("choice:allowed_tools")]
    | Annotated[McpToolChoice, Tag("choice:mcp")]
    | Annotated[HostedTool, Tag("choice:hosted")],
    Discriminator(_choice_tag, custom_error_type="invalid_value", custom_error_message="a tool_choice object needs a string 'type'"),
]


class ReasoningConfig(_Lenient):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class TextFormat(_Lenient):
    type: Literal["text"] = "text"


class JSONSchemaFormat(_Lenient):
    """Structured outputs: the answer is JSON valid against `schema` (enforced by the engine's
    grammar). `strict: true` also makes OpenAI's strict-mode rules apply to the schema."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["json_schema"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    schema_: dict[str, Any] = Field(alias="schema")
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


class JSONObjectFormat(_Lenient):
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


class TextConfig(_Lenient):
    format: AnyTextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # echoed (no engine knob); "medium" when unset


# The API's sampling defaults: what a request that sets none runs with, and what its
# response reports (OpenAI writes the values it used, never null).
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0


# --- the request -------------------------------------------------------------------------


class ConversationRef(_Lenient):
    id: str = Field(min_length=1)


class ResponsesRequest(_Lenient):
    model: str = Field(min_length=1)
    input: str | list[InputItem]
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

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[Any]) -> str | list[Any]:
        if not value:
            raise ValueError("input must not be empty")
        return value

    @model_validator(mode="after")
    def _consistent_tools(self) -> ResponsesRequest:
        names = collections.Counter(f.name for f in self.function_tools())
        names.update(f"{ns.name}.{f.name}" for ns in self.namespace_tools() for f in ns.functions)
        duplicates = [name for name, count in names.items() if count > 1]
        if duplicates:
            raise ValueError(f"duplicate function tool names: {sorted(duplicates)}")
        # An MCP server's tools are offered as a namespace named by its label.
        labels = collections.Counter(tool.server_label for tool in self.mcp_tools())
        taken = {namespace.name for namespace in self.namespace_tools()} | {"functions"}
        if clash := sorted(label for label, count in labels.items() if count > 1 or label in taken):
            raise ValueError(f"MCP server_label must be unique and differ from namespace tool names and 'functions': {clash}")
        # The built-in tools are called as `browser.FUNCTION` and `python`: those names are theirs.
        builtin = collections.Counter(
            tool.type.startswith("web_search") for tool in self.tools if isinstance(tool, WebSearchTool | CodeInterpreterTool)
        )
        if any(count > 1 for count in builtin.values()):
            raise ValueError("at most one web_search tool and one code_interpreter tool")
        reserved = ({"browser"} if self.web_search_tool() else set()) | ({"python"} if self.code_interpreter_tool() else set())
        names_used = {f.name for f in self.function_tools()} | set(labels) | {namespace.name for namespace in self.namespace_tools()}
        if clash := sorted(reserved & names_used):
            raise ValueError(f"the built-in tools web_search and code_interpreter are called as 'browser' and 'python': {clash} is taken")
        return self

    def check_consistency(self) -> None:
        """What the fields only mean together (400s that name the field)."""
        names = {f.name for f in self.function_tools()}
        names |= {f"{ns.name}.{f.name}" for ns in self.namespace_tools() for f in ns.functions}
        choice = self.tool_choice
        if isinstance(choice, NamedFunctionChoice) and choice.name not in names:
            raise invalid_request(f"tool_choice names function '{choice.name}', which is not in tools.", param="tool_choice")
        if isinstance(choice, AllowedToolsChoice):
            for index, tool in enumerate(choice.tools):
                if tool.type == "function" and tool.name not in names:
                    raise invalid_request(
                        f"tool_choice.tools[{index}] names function '{tool.name}', which is not in tools.",
                        param=f"tool_choice.tools[{index}].name",
                    )
        if isinstance(choice, McpToolChoice) and choice.server_label not in {tool.server_label for tool in self.mcp_tools()}:
            raise invalid_request(
                f"tool_choice names MCP server '{choice.server_label}', which is not in tools.", param="tool_choice.server_label"
            )
        if choice == "required" and not names and not self.mcp_tools():
            raise invalid_request("tool_choice 'required' needs at least one function tool in tools.", param="tool_choice")
        fmt = self.text.format if self.text else None
        if isinstance(fmt, JSONObjectFormat):
            texts = [self.instructions or ""] + [getattr(item, "text", "") for item in self.input_items()]
            if not any("json" in text.lower() for text in texts):
                raise invalid_request(
                    "'input' must contain the word 'json' in some form to use 'text.format' of type 'json_object'.",
                    param="input",
                )

    # -- views used by rendering --

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

    def namespace_tools(self) -> list[NamespaceTool]:
        return [t for t in self.tools if isinstance(t, NamespaceTool)]

    def mcp_tools(self) -> list[McpTool]:
        return [t for t in self.tools if isinstance(t, McpTool)]

    def web_search_tool(self) -> WebSearchTool | None:
        return next((t for t in self.tools if isinstance(t, WebSearchTool)), None)

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
            self.function_tools() or any(n.functions for n in self.namespace_tools()) or self.builtin_tools()
        )


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

"""Tools and tool choice as clients send them: functions, custom (free-text) tools,
namespaces, remote MCP servers, the built-in web_search, code_interpreter and file_search, and hosted
types this server does not run."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

import jsonschema
from openai.types.responses import Response as OpenAIResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from serve_app.api.filters import ComparisonFilter, CompoundFilter, check_filter
from serve_app.api.items import FUNCTION_NAME_PATTERN, Lenient
from serve_app.api.json_schema import OBJECT_SCHEMA_FIELD

# --- tools ---------------------------------------------------------------------------------


class FunctionTool(Lenient):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, json_schema_extra=OBJECT_SCHEMA_FIELD)
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


# What a custom tool's grammar may hold, in characters (OpenAI's limit is not published; a
# grammar is compiled by the engine for every request that offers the tool).
MAX_GRAMMAR_CHARS = 32 * 1024


class CustomTextFormat(Lenient):
    type: Literal["text"]


class CustomGrammarFormat(Lenient):
    """The call's input must match `definition`: a Lark grammar or a regular expression
    (Rust `regex` syntax, as the engine's structured outputs take it)."""

    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: str = Field(min_length=1, max_length=MAX_GRAMMAR_CHARS)


class CustomTool(Lenient):
    """`type: "custom"`: a tool the model calls with free text (its `input`), not JSON;
    `format` may bound that text by a grammar. Called as `custom_tool_call` items, answered
    with `custom_tool_call_output`."""

    type: Literal["custom"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    format: Annotated[CustomTextFormat | CustomGrammarFormat, Field(discriminator="type")] | None = None

    @property
    def grammar(self) -> CustomGrammarFormat | None:
        return self.format if isinstance(self.format, CustomGrammarFormat) else None


class HostedTool(BaseModel):
    """A tool type this server does not execute (image_generation, computer_use_preview, ...): left out
    of the response and named in its `x-unavailable-tools` header, so a type is a name (what
    OpenAI's types are), never arbitrary text."""

    model_config = ConfigDict(extra="allow")
    # The schema leaves out the types of the other tools (`_tool_tag` sends them there).
    type: str = Field(pattern=r"^[a-z][a-z0-9_.-]{0,63}$", json_schema_extra=lambda schema: schema.update(not_types(TOOL_TYPES)))


def _hosted_choice_types() -> tuple[str, ...]:
    """The hosted tool types a `tool_choice` may name: those the SDK's `Response` can echo
    (a choice of another type could not be written into the response: a 400, not a 500)."""
    kinds: list[str] = []
    for member in get_args(OpenAIResponse.model_fields["tool_choice"].annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            fields = member.model_fields
            if {name for name, field in fields.items() if field.is_required()} == {"type"}:
                kinds += get_args(fields["type"].annotation)
    return tuple(kind for kind in kinds if kind not in CHOICE_TYPES)


class HostedChoice(HostedTool):
    """A `tool_choice` of a hosted tool type (`{"type": "file_search"}`): a call of that tool
    when the server runs it (file_search, web_search, code_interpreter); another type is
    accepted and not enforced (its tool is left out of the response)."""

    type: str = Field(json_schema_extra=lambda schema: schema.update(enum=list(HOSTED_CHOICE_TYPES)))

    @field_validator("type")
    @classmethod
    def _known(cls, kind: str) -> str:
        if kind not in HOSTED_CHOICE_TYPES:
            raise ValueError(f"a tool_choice type must be one of {', '.join(repr(kind) for kind in (*CHOICE_TYPES, *HOSTED_CHOICE_TYPES))}")
        return kind


class McpToolFilter(Lenient):
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


class McpApprovalFilter(Lenient):
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


def _any_case(name: str) -> str:
    return "".join(f"[{char.lower()}{char.upper()}]" if char.isalpha() else char for char in name)


# What `_served_by_url` checks, as JSON Schema (/openapi.json).
_HEADER_VALUE_SCHEMA: Any = {"type": "string", "pattern": "^[ -~]{0,8192}$"}
_MCP_SCHEMA: Any = {
    "required": ["server_url"],
    "properties": {
        "server_url": {"type": "string", "minLength": 1},
        "connector_id": {"type": "null"},
        "tunnel_id": {"type": "null"},
        "headers": {
            "anyOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "propertyNames": {
                        "pattern": "^" + _HEADER_NAME.pattern + "$",
                        "not": {
                            "pattern": "^("
                            + "|".join(_any_case(name) for name in sorted(_CONNECTION_HEADERS))
                            + "|"
                            + _any_case("mcp-")
                            + ".*)$"
                        },
                    },
                    "additionalProperties": _HEADER_VALUE_SCHEMA,
                },
            ]
        },
        "authorization": {"anyOf": [{"type": "null"}, _HEADER_VALUE_SCHEMA]},
    },
}


class McpTool(Lenient):
    """A remote MCP server whose tools the server runs inside the response
    (serve_app/tools/mcp_client.py). `headers` and `authorization` are secrets: sent to
    that server only, never stored, logged or echoed (pydantic's `SecretStr` hides them from
    every dump and repr)."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"allOf": [_MCP_SCHEMA]})
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


class WebSearchFilters(Lenient):
    allowed_domains: list[Annotated[str, Field(min_length=1, max_length=253)]] | None = Field(None, max_length=100)


WEB_SEARCH_TYPES = ("web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11")
SERVER_TOOL_TYPES = ("file_search", "code_interpreter", *WEB_SEARCH_TYPES)  # the hosted tools this server runs


def server_tool_kind(kind: str) -> str:
    """A hosted tool type as the tool that runs it: the web_search names are one tool."""
    return "web_search" if kind in WEB_SEARCH_TYPES else kind


class WebSearchTool(Lenient):
    """`web_search` (and `web_search_preview`, and their dated names): gpt-oss's browser.
    `filters.allowed_domains` bounds every page it shows; `search_context_size` and
    `user_location` are accepted and not used."""

    type: Literal["web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11"]
    filters: WebSearchFilters | None = None

    @property
    def allowed_domains(self) -> list[str] | None:
        return self.filters.allowed_domains if self.filters is not None else None


class HybridSearch(Lenient):
    # The schema says what `FileSearchRanking._weights` checks: not both 0.
    model_config = ConfigDict(
        extra="ignore", json_schema_extra={"not": {"properties": {"embedding_weight": {"const": 0}, "text_weight": {"const": 0}}}}
    )
    embedding_weight: float = Field(ge=0)
    text_weight: float = Field(ge=0)


class FileSearchRanking(Lenient):
    """`ranking_options`: `ranker` (`auto`, `default-2024-11-15`, `none`: all one hybrid
    ranking here), `score_threshold` (0-1), `hybrid_search` weights of the two rankings."""

    ranker: Literal["auto", "default-2024-11-15", "none"] | None = None
    score_threshold: float | None = Field(None, ge=0, le=1)
    hybrid_search: HybridSearch | None = None

    @model_validator(mode="after")
    def _weights(self) -> FileSearchRanking:
        if self.hybrid_search is not None and self.hybrid_search.embedding_weight + self.hybrid_search.text_weight <= 0:
            raise ValueError("hybrid_search weights must not both be 0")
        return self


MAX_VECTOR_STORES_PER_SEARCH = 16


class FileSearchTool(Lenient):
    """`file_search`: a search of the caller's vector stores (docs/file-search.md)."""

    type: Literal["file_search"]
    vector_store_ids: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        min_length=1, max_length=MAX_VECTOR_STORES_PER_SEARCH
    )
    max_num_results: int | None = Field(None, ge=1, le=50)
    ranking_options: FileSearchRanking | None = None
    filters: ComparisonFilter | CompoundFilter | None = None

    @field_validator("filters")
    @classmethod
    def _bounded(cls, value: ComparisonFilter | CompoundFilter | None) -> ComparisonFilter | CompoundFilter | None:
        return check_filter(value) if value is not None else None


CONTAINER_ID_MAX_CHARS = 256


class AutoContainer(Lenient):
    """`container: {"type": "auto"}`: a new container for the response, made at its first call."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={"allOf": [{"properties": {"file_ids": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}}}]},
    )

    type: Literal["auto"]
    file_ids: list[str] | None = None
    memory_limit: str | None = None  # accepted; the server's limits apply

    @field_validator("file_ids")
    @classmethod
    def _no_files(cls, file_ids: list[str] | None) -> list[str] | None:
        if file_ids:
            raise ValueError(
                "file_ids are not supported: uploaded files are not copied into the python container (the code can write files in /mnt/data)"
            )
        return file_ids


class CodeInterpreterTool(Lenient):
    """`code_interpreter`: gpt-oss's python tool, in a container of the caller's (a
    container id to reuse one, or `{"type": "auto"}`)."""

    type: Literal["code_interpreter"]
    container: Annotated[str, Field(min_length=1, max_length=CONTAINER_ID_MAX_CHARS)] | AutoContainer = Field(
        default_factory=lambda: AutoContainer(type="auto")
    )


class BuiltinTool(Lenient):
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
    serves: str  # the request's tool it runs (`server_tool_kind`): what a hosted `tool_choice` names
    functions: list[FunctionTool] = Field(default_factory=list)
    parameters: dict[str, Any] | None = None
    text_argument: str | None = None  # harmony: the call's message is this argument's text (python's code), not JSON


# The tool types `_tool_tag` and `_choice_tag` send to a model of their own (not `HostedTool`).
TOOL_TYPES: tuple[str, ...] = ("function", "custom", "namespace", "mcp", "code_interpreter", "file_search", *WEB_SEARCH_TYPES)
CHOICE_TYPES = ("function", "custom", "allowed_tools", "mcp")
HOSTED_CHOICE_TYPES: tuple[str, ...] = _hosted_choice_types()


def not_types(types: tuple[str, ...]) -> dict[str, Any]:
    return {"not": {"enum": list(types)}}


def _tool_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind in TOOL_TYPES and kind not in WEB_SEARCH_TYPES:
        return f"tool:{kind}"
    if kind in WEB_SEARCH_TYPES:
        return "tool:web_search"
    if isinstance(value, BuiltinTool):  # added by the tool loop, never parsed from a request
        return "tool:builtin"
    return "tool:hosted" if isinstance(kind, str) else None


_TOOL_TAG = Discriminator(_tool_tag, custom_error_type="missing_tool_type", custom_error_message="every tool needs a string 'type'")


class NamespaceTool(Lenient):
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
    | Annotated[CustomTool, Tag("tool:custom")]
    | Annotated[NamespaceTool, Tag("tool:namespace")]
    | Annotated[McpTool, Tag("tool:mcp")]
    | Annotated[WebSearchTool, Tag("tool:web_search")]
    | Annotated[CodeInterpreterTool, Tag("tool:code_interpreter")]
    | Annotated[FileSearchTool, Tag("tool:file_search")]
    | SkipJsonSchema[Annotated[BuiltinTool, Tag("tool:builtin")]]  # the tool loop's, never a client's
    | Annotated[HostedTool, Tag("tool:hosted")],
    _TOOL_TAG,
]


class NamedFunctionChoice(Lenient):
    type: Literal["function"]
    name: str


class NamedCustomChoice(Lenient):
    """Call the custom tool `name`."""

    type: Literal["custom"]
    name: str


class McpToolChoice(Lenient):
    """Call a tool of the MCP server `server_label`: `name`, or any of its tools."""

    type: Literal["mcp"]
    server_label: str
    name: str | None = None


class AllowedToolRef(Lenient):
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "anyOf": [
                {"properties": {"type": {"not": {"enum": ["function", "custom"]}}}},
                {"required": ["name"], "properties": {"name": {"type": "string", "minLength": 1}}},
            ]
        },
    )
    type: str
    name: str | None = None

    @model_validator(mode="after")
    def _named_function(self) -> AllowedToolRef:
        if self.type in ("function", "custom") and not self.name:
            raise ValueError(f"a {self.type} tool in allowed_tools needs a 'name'")
        return self


class AllowedToolsChoice(Lenient):
    """Only these tools may be called; `required`: one of them must be."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[AllowedToolRef] = Field(min_length=1)


def _choice_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind in ("function", "custom", "allowed_tools", "mcp"):
        return f"choice:{kind}"
    return "choice:hosted" if isinstance(kind, str) else None


ToolChoiceObject = Annotated[
    Annotated[NamedFunctionChoice, Tag("choice:function")]
    | Annotated[NamedCustomChoice, Tag("choice:custom")]
    | Annotated[AllowedToolsChoice, Tag("choice:allowed_tools")]
    | Annotated[McpToolChoice, Tag("choice:mcp")]
    | Annotated[HostedChoice, Tag("choice:hosted")],
    Discriminator(_choice_tag, custom_error_type="invalid_value", custom_error_message="a tool_choice object needs a string 'type'"),
]

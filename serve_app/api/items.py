"""Input items and their content parts, as clients send them (and as a conversation's history
holds them); `item_reference`s are resolved by the state layer before anything is rendered."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, cast

from openai.types.responses import ResponseCodeInterpreterToolCall, ResponseFileSearchToolCall, ResponseFunctionWebSearch
from openai.types.responses.response_file_search_tool_call import Result as FileSearchResult
from openai.types.responses.response_output_item import McpCall
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from serve_app.api.limits import IMAGE_URL_FIELD

FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_\-]{1,64}$"
# The name of what an earlier call called (a function, a namespace, an MCP server or tool):
# rendered into a harmony header (`to=NAMESPACE.NAME`), where a space or other punctuation
# would break it. What a tool may be named (OpenAI's function names, MCP's tool names).
CalledName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_.\-]{1,128}$")]


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


# --- content parts ---------------------------------------------------------------------


class TextPart(Lenient):
    """`input_text` / `output_text` (assistant history); both carry plain text."""

    type: Literal["input_text", "output_text"]
    text: str


class RefusalPart(Lenient):
    type: Literal["refusal"]
    refusal: str


def _given(field: str) -> dict[str, Any]:
    """A JSON Schema saying that an object has `field`, not null (one branch of a `oneOf`)."""
    return {"type": "object", "required": [field], "properties": {field: {"not": {"type": "null"}}}}


class FilePart(Lenient):
    """`input_file`: a document for the model, by exactly one of `file_id` (the Files API),
    `file_data` (base64, a data URL or bare) or `file_url` (fetched under the egress policy).
    The runtime reads it into text before anything is rendered (runtime/files.py sets
    `_text`); the families render that text as the user's own words."""

    # The schema says what `_one_source` checks.
    model_config = ConfigDict(extra="ignore", json_schema_extra={"oneOf": [_given("file_id"), _given("file_data"), _given("file_url")]})
    type: Literal["input_file"]
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None
    _text: str | None = PrivateAttr(default=None)
    _name: str | None = PrivateAttr(default=None)  # an uploaded file's own name, when read
    # A vision model's images of a PDF's first pages, in a user message: runtime/files.py draws
    # them (`_pages`, opaque here), runtime/images.py picks how many the prompt shows (`_shown`:
    # placeholders after the file's text) and what the model is told of them (`_caption`).
    _pages: Any = PrivateAttr(default=None)
    _shown: int = PrivateAttr(default=0)
    _caption: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _one_source(self) -> FilePart:
        given = [name for name in ("file_id", "file_data", "file_url") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "an 'input_file' part needs exactly one of 'file_id', 'file_data' or 'file_url'"
                + (f" (it has {', '.join(given)})" if given else "")
            )
        return self

    @property
    def name(self) -> str:
        return self._name or self.filename or self.file_id or (self.file_url or "").rsplit("/", 1)[-1] or "file"

    @property
    def text(self) -> str:
        """The file as the model reads it: its name, then its text (read by the runtime), and
        for a vision model a line on its page images (which follow it)."""
        body = self._text if self._text is not None else "(not read)"
        caption = f"\n{self._caption}" if self._caption else ""
        return f"[file: {self.name}]\n{body}\n[end of file: {self.name}]{caption}"

    @property
    def page_images(self) -> int:
        """Images of its pages the prompt shows after its text (a vision model's, of a PDF)."""
        return self._shown


class ImagePart(Lenient):
    """`input_image`: an image by URL (https, or a base64 `data:` URL) or by `file_id`, kept as
    the client sent it; read (fetched, decoded, bounded) by `serve_app/runtime/images.py` for
    vision models only."""

    # The schema says what `_one_source` checks.
    model_config = ConfigDict(extra="ignore", json_schema_extra={"oneOf": [_given("image_url"), _given("file_id")]})
    type: Literal["input_image"]
    image_url: str | None = Field(default=None, json_schema_extra=IMAGE_URL_FIELD)
    file_id: str | None = None
    detail: Literal["low", "high", "auto"] = "auto"

    @model_validator(mode="after")
    def _one_source(self) -> ImagePart:
        if (self.image_url is None) == (self.file_id is None):
            raise ValueError("an input_image needs exactly one of 'image_url' and 'file_id'")
        return self


def _part_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind in ("input_text", "output_text"):
        return "part:text"
    if kind == "input_file":
        return "part:file"
    if kind == "input_image":
        return "part:image"
    return "part:refusal" if kind == "refusal" else None


ContentPart = Annotated[
    Annotated[TextPart, Tag("part:text")]
    | Annotated[RefusalPart, Tag("part:refusal")]
    | Annotated[FilePart, Tag("part:file")]
    | Annotated[ImagePart, Tag("part:image")],
    Discriminator(
        _part_tag,
        custom_error_type="invalid_value",
        custom_error_message=(
            "content parts must be of type 'input_text', 'output_text', 'input_image', 'input_file' or 'refusal' "
            "(audio is not supported by this server)"
        ),
    ),
]


# A tool's output (`function_call_output`, `custom_tool_call_output`): text and files, no images.
ToolOutputPart = Annotated[
    Annotated[TextPart, Tag("part:text")] | Annotated[RefusalPart, Tag("part:refusal")] | Annotated[FilePart, Tag("part:file")],
    Discriminator(
        _part_tag,
        custom_error_type="invalid_value",
        custom_error_message=(
            "tool output parts must be of type 'input_text', 'output_text', 'input_file' or 'refusal' "
            "(images and audio in tool outputs are not supported by this server)"
        ),
    ),
]


def parts_text(content: str | Sequence[ContentPart | ToolOutputPart]) -> str:
    """The parts as one text (an image has none); a file stands apart from the text around it
    (a blank line)."""
    if isinstance(content, str):
        return content
    pieces: list[str] = []
    after_file = False
    for part in content:
        if isinstance(part, ImagePart):
            continue
        is_file = isinstance(part, FilePart)
        if pieces and (is_file or after_file):
            pieces.append("\n\n")
        pieces.append(part.text if isinstance(part, TextPart | FilePart) else part.refusal)
        after_file = is_file
    return "".join(pieces)


def file_parts(content: str | Sequence[ContentPart | ToolOutputPart]) -> list[FilePart]:
    return [] if isinstance(content, str) else [part for part in content if isinstance(part, FilePart)]


def shows_images(content: str | Sequence[ContentPart]) -> bool:
    """Whether a content holds images: an image part, or a file shown with its page images."""
    if isinstance(content, str):
        return False
    return any(isinstance(part, ImagePart) or (isinstance(part, FilePart) and part.page_images) for part in content)


def image_parts(content: str | Sequence[ContentPart]) -> list[tuple[int, ImagePart]]:
    """The image parts of a content, with their index in it."""
    if isinstance(content, str):
        return []
    return [(index, part) for index, part in enumerate(content) if isinstance(part, ImagePart)]


# --- input items -------------------------------------------------------------------------


class MessageItem(Lenient):
    # The schema says what `_phase_is_the_assistants` checks.
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "anyOf": [
                {"not": {"required": ["phase"]}},
                {"properties": {"phase": {"type": "null"}}},
                {"properties": {"role": {"const": "assistant"}}},
            ]
        },
    )
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
        if self.role == "assistant" and (file_parts(self.content) or image_parts(self.content)):
            # (an assistant message is listed as the API's output message, which holds neither)
            raise ValueError("'input_file' and 'input_image' parts are for user, system and developer messages, not the assistant's")
        return self

    @property
    def text(self) -> str:
        return parts_text(self.content)


class FunctionCallItem(Lenient):
    type: Literal["function_call"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    name: CalledName
    namespace: CalledName | None = None
    arguments: str


class FunctionCallOutputItem(Lenient):
    type: Literal["function_call_output"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    output: str | list[ToolOutputPart]

    @property
    def text(self) -> str:
        return parts_text(self.output)


class CustomToolCallItem(Lenient):
    """A call of a custom tool: its `input` is the text the model wrote, not JSON."""

    type: Literal["custom_tool_call"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    name: CalledName
    namespace: CalledName | None = None
    input: str


class CustomToolCallOutputItem(Lenient):
    type: Literal["custom_tool_call_output"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    output: str | list[ToolOutputPart]

    @property
    def text(self) -> str:
        return parts_text(self.output)


class SummaryText(Lenient):
    type: Literal["summary_text"] = "summary_text"
    text: str


class ReasoningText(Lenient):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(Lenient):
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


class CompactionItem(Lenient):
    """What `POST /v1/responses/compact` (or `context_management`) made of a conversation:
    its summary, sealed for the tenant (`encrypted_content`). Opened before rendering
    (`runtime.compaction.open_compactions`): the last one stands for every item before it
    but the latest user messages (families render it as the summary)."""

    type: Literal["compaction"]
    id: str | None = None
    encrypted_content: str = Field(min_length=1)
    _summary: str | None = PrivateAttr(default=None)  # opened
    _keep_chars: int = PrivateAttr(default=0)  # the user messages before it that stay, in characters


# --- items of server-side tools, sent back as history (serve_app/families/hosted.py renders them) ---
# Their parts are kept and shown again as the SDK types them (state/responses.py), so they
# must be what the SDK's types take: a 400 naming the part, never a 500 when it is shown.

_WEB_SEARCH_ACTION: TypeAdapter[Any] = TypeAdapter(cast(Any, ResponseFunctionWebSearch.model_fields["action"].annotation))
_CODE_OUTPUT: TypeAdapter[Any] = TypeAdapter(cast(Any, ResponseCodeInterpreterToolCall.model_fields["outputs"].annotation))
_MCP_ERROR: TypeAdapter[Any] = TypeAdapter(cast(Any, McpCall.model_fields["error"].annotation))
_FILE_SEARCH_RESULTS: TypeAdapter[Any] = TypeAdapter(cast(Any, ResponseFileSearchToolCall.model_fields["results"].annotation))
_FILE_SEARCH_RESULT_SCHEMA: dict[str, Any] = FileSearchResult.model_json_schema()


def _as_the_sdk_types_it(adapter: TypeAdapter[Any], value: Any) -> Any:
    if value is not None:
        try:
            adapter.validate_python(value)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            raise ValueError(f"not as the API returned it ({error['msg']} at {'.'.join(map(str, error['loc']))})") from None
    return value


class McpListedTool(Lenient):
    name: str
    input_schema: Any = None
    description: str | None = None
    annotations: Any = None


class McpListToolsItem(Lenient):
    """The tools an MCP server listed: while one for a label is in the conversation, that
    server is not asked again."""

    type: Literal["mcp_list_tools"]
    id: str | None = None
    server_label: CalledName
    tools: list[McpListedTool] = Field(default_factory=list)
    error: str | None = None


class McpCallItem(Lenient):
    type: Literal["mcp_call"]
    id: str | None = None
    server_label: CalledName
    name: CalledName
    arguments: str
    output: str | None = None
    # The SDK's tagged union (openai 3.x) or a plain message (2.x): the model reads its text.
    error: str | dict[str, Any] | None = None
    approval_request_id: str | None = None
    status: Literal["in_progress", "completed", "incomplete", "calling", "failed"] | None = None

    @field_validator("error")
    @classmethod
    def _typed_error(cls, error: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        return error if isinstance(error, str) else _as_the_sdk_types_it(_MCP_ERROR, error)


class McpApprovalRequestItem(Lenient):
    type: Literal["mcp_approval_request"]
    id: str = Field(min_length=1)
    server_label: CalledName
    name: CalledName
    arguments: str


class McpApprovalResponseItem(Lenient):
    type: Literal["mcp_approval_response"]
    id: str | None = None
    approval_request_id: str = Field(min_length=1)
    approve: bool
    reason: str | None = None


class WebSearchCallItem(Lenient):
    """A `web_search_call` (the browser tool); its action as the SDK types it."""

    type: Literal["web_search_call"]
    id: str | None = None
    status: Literal["in_progress", "searching", "completed", "failed", "incomplete"] | None = None
    action: dict[str, Any] | None = None

    @field_validator("action")
    @classmethod
    def _typed_action(cls, action: dict[str, Any] | None) -> dict[str, Any] | None:
        return _as_the_sdk_types_it(_WEB_SEARCH_ACTION, action)  # type: ignore[no-any-return]

    # What the model read of the call, within the response that made it (the item does not
    # carry it; no client can set it): the tool loop's next prompt shows it.
    _model_text: str | None = PrivateAttr(default=None)


class CodeInterpreterCallItem(Lenient):
    """A `code_interpreter_call` (the python tool): its code and, when included, its outputs."""

    type: Literal["code_interpreter_call"]
    id: str | None = None
    code: str | None = None
    container_id: str | None = None
    outputs: list[dict[str, Any]] | None = None
    status: Literal["in_progress", "completed", "incomplete", "interpreting", "failed"] | None = None

    @field_validator("outputs")
    @classmethod
    def _typed_outputs(cls, outputs: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return _as_the_sdk_types_it(_CODE_OUTPUT, outputs)  # type: ignore[no-any-return]

    _model_text: str | None = PrivateAttr(default=None)  # as for WebSearchCallItem


class FileSearchCallItem(Lenient):
    """A `file_search_call` (the file_search tool): its queries and, when included, its results."""

    type: Literal["file_search_call"]
    id: str | None = None
    queries: list[str] | None = None
    status: Literal["in_progress", "searching", "completed", "incomplete", "failed"] | None = None
    # The SDK's result type, in /openapi.json too.
    results: list[dict[str, Any]] | None = Field(
        None, json_schema_extra={"anyOf": [{"type": "array", "items": _FILE_SEARCH_RESULT_SCHEMA}, {"type": "null"}]}
    )

    @field_validator("results")
    @classmethod
    def _typed_results(cls, results: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return _as_the_sdk_types_it(_FILE_SEARCH_RESULTS, results)  # type: ignore[no-any-return]

    _model_text: str | None = PrivateAttr(default=None)  # as for WebSearchCallItem


HOSTED_ITEM_TYPES = (
    "mcp_list_tools",
    "mcp_call",
    "mcp_approval_request",
    "mcp_approval_response",
    "web_search_call",
    "code_interpreter_call",
    "file_search_call",
)


class ItemReference(Lenient):
    """An earlier item by its id (the Vercel AI SDK sends reasoning back so when `store` is on):
    resolved from the caller's stored responses before anything is rendered."""

    # Without a `type`, an object with a `role` is a message (`_item_tag`), never a reference.
    model_config = ConfigDict(extra="ignore", json_schema_extra={"anyOf": [{"required": ["type"]}, {"not": {"required": ["role"]}}]})
    type: Literal["item_reference"] = "item_reference"
    id: str = Field(min_length=1, max_length=256)


def _item_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        if "type" in value:
            return f"item:{value['type']}"
        # EasyInputMessage has no `type`, nor has an item reference (an `id` without a `role`).
        return "item:item_reference" if "id" in value and "role" not in value else "item:message"
    return f"item:{getattr(value, 'type', None)}"


_STORED_ITEMS = (
    Annotated[MessageItem, Tag("item:message")]
    | Annotated[FunctionCallItem, Tag("item:function_call")]
    | Annotated[FunctionCallOutputItem, Tag("item:function_call_output")]
    | Annotated[CustomToolCallItem, Tag("item:custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("item:custom_tool_call_output")]
    | Annotated[ReasoningItem, Tag("item:reasoning")]
    | Annotated[CompactionItem, Tag("item:compaction")]
    | Annotated[McpListToolsItem, Tag("item:mcp_list_tools")]
    | Annotated[McpCallItem, Tag("item:mcp_call")]
    | Annotated[McpApprovalRequestItem, Tag("item:mcp_approval_request")]
    | Annotated[McpApprovalResponseItem, Tag("item:mcp_approval_response")]
    | Annotated[WebSearchCallItem, Tag("item:web_search_call")]
    | Annotated[CodeInterpreterCallItem, Tag("item:code_interpreter_call")]
    | Annotated[FileSearchCallItem, Tag("item:file_search_call")]
)
_ITEM_TYPES = (
    "'message', 'function_call', 'function_call_output', 'custom_tool_call', 'custom_tool_call_output', 'reasoning', 'compaction', "
    + ", ".join(f"'{kind}'" for kind in HOSTED_ITEM_TYPES)
)


def _items_discriminator(types: str) -> Discriminator:
    return Discriminator(_item_tag, custom_error_type="invalid_value", custom_error_message=f"input items must be of type {types}")


# An item as stored (a response's input, a conversation's items): never a reference.
StoredInputItem = Annotated[_STORED_ITEMS, _items_discriminator(_ITEM_TYPES)]
# An item a request's `input` may hold.
InputItem = Annotated[
    _STORED_ITEMS | Annotated[ItemReference, Tag("item:item_reference")], _items_discriminator(_ITEM_TYPES + ", 'item_reference'")
]
# An item of a conversation's history, as the families render it.
HistoryItem = (
    MessageItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | CustomToolCallItem
    | CustomToolCallOutputItem
    | ReasoningItem
    | CompactionItem
    | McpListToolsItem
    | McpCallItem
    | McpApprovalRequestItem
    | McpApprovalResponseItem
    | WebSearchCallItem
    | CodeInterpreterCallItem
    | FileSearchCallItem
)

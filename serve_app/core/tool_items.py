"""The items and events of server-side tool calls, one `CallKind` per item type.

`ResponseStream` owns the bookkeeping of every item (ids, indices, sequence numbers, the
order of events); a kind says only what its item and its own events look like, typed with
the `openai` SDK's models. A server-side call goes through these stages, each with the
kind's events:

    opened        output_item.added (arguments ""), then e.g. mcp_call.in_progress
    arguments     the kind's argument deltas as the model writes them, then their done event
    running       e.g. web_search_call.searching (the tool is called now)
    finished      e.g. mcp_call.completed / .failed, then output_item.done with the result

A kind that does not run (`mcp_approval_request`) is done when its arguments are: the
response hands it to the client. The built-in tools' kinds are here too: `web_search_call`
(the browser: its arguments are not streamed, its action comes from the browser's result)
and `code_interpreter_call` (python: the code streams as the model writes it, decoded from
`{"code": ...}` when the model writes its calls as JSON, as chat-template models do).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import regex
from openai.types.responses import (
    ResponseCodeInterpreterCallCodeDeltaEvent,
    ResponseCodeInterpreterCallCodeDoneEvent,
    ResponseCodeInterpreterCallCompletedEvent,
    ResponseCodeInterpreterCallInProgressEvent,
    ResponseCodeInterpreterCallInterpretingEvent,
    ResponseCodeInterpreterToolCall,
    ResponseFileSearchCallCompletedEvent,
    ResponseFileSearchCallInProgressEvent,
    ResponseFileSearchCallSearchingEvent,
    ResponseFileSearchToolCall,
    ResponseFunctionWebSearch,
    ResponseMcpCallArgumentsDeltaEvent,
    ResponseMcpCallArgumentsDoneEvent,
    ResponseMcpCallCompletedEvent,
    ResponseMcpCallFailedEvent,
    ResponseMcpCallInProgressEvent,
    ResponseMcpListToolsCompletedEvent,
    ResponseMcpListToolsFailedEvent,
    ResponseMcpListToolsInProgressEvent,
    ResponseStreamEvent,
    ResponseWebSearchCallCompletedEvent,
    ResponseWebSearchCallInProgressEvent,
    ResponseWebSearchCallSearchingEvent,
)
from openai.types.responses.response_output_item import (
    McpApprovalRequest,
    McpCall,
    McpListTools,
    McpListToolsTool,
)
from pydantic import BaseModel

ErrorType = Literal["mcp_protocol_error", "mcp_tool_execution_error", "http_error"]


@dataclass(frozen=True, slots=True)
class ToolError:
    """Why a call gave no output, in the SDK's terms (`McpToolCallError`): the server broke the
    protocol (or could not be reached), the tool reported an error, or HTTP failed."""

    type: ErrorType
    message: str
    code: int = 0  # JSON-RPC or HTTP status code; 0 when there is none

    def as_sdk(self) -> dict[str, Any]:
        if self.type == "mcp_tool_execution_error":
            return {"type": self.type, "content": [{"type": "text", "text": self.message}]}
        return {"type": self.type, "code": self.code, "message": self.message}


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What running a call gave: an output, or an error (the model reads either). A built-in
    tool's item does not carry what the model reads: `model_text` is that text, and `item`
    the kind's own fields of the finished item (a `web_search_call`'s action, ...)."""

    output: str | None = None
    error: ToolError | None = None
    model_text: str | None = None
    item: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def failed(cls, message: str, error_type: ErrorType = "mcp_tool_execution_error", code: int = 0) -> ToolOutcome:
        return cls(error=ToolError(error_type, message, code))


NOT_FINISHED = ToolOutcome()  # a call the response ended before it finished (item status incomplete)


@dataclass(slots=True)
class ServerCall:
    """A server-side call of this response: the stream's handle, the loop's work item."""

    item_id: str
    output_index: int
    kind: CallKind
    namespace: str | None  # MCP: the server label
    name: str
    arguments: str = ""
    approval_request_id: str | None = None
    json_arguments: bool = True  # the model wrote its arguments as JSON (else as they are: harmony's python code)
    code: StringArgument | None = None  # a python call's code, decoded as it streams


_Event = Callable[..., ResponseStreamEvent]


class CallKind(Protocol):
    """How one type of server-side call shows in a response."""

    item_type: str
    id_prefix: str
    runs: bool  # False: done when its arguments are (an approval request)
    delta_event: type[BaseModel] | None  # the argument delta event; None: arguments not streamed

    def added(self, call: ServerCall) -> Any: ...
    def streamed(self, call: ServerCall, arguments: str) -> str:
        """The text of the kind's delta events for these new `arguments` (MCP: themselves)."""
        ...

    def opened(self, call: ServerCall) -> list[ResponseStreamEvent]: ...
    def arguments_done(self, call: ServerCall) -> list[ResponseStreamEvent]: ...
    def running(self, call: ServerCall) -> list[ResponseStreamEvent]: ...
    def finished(self, call: ServerCall, outcome: ToolOutcome) -> tuple[list[ResponseStreamEvent], Any]: ...


def _at(call: ServerCall) -> dict[str, Any]:
    return {"item_id": call.item_id, "output_index": call.output_index, "sequence_number": 0}


class McpCallKind:
    """`mcp_call`: added → mcp_call.in_progress → mcp_call_arguments.delta* → .done →
    (the tool runs) → mcp_call.completed | .failed → output_item.done with output or error."""

    item_type = "mcp_call"
    id_prefix = "mcp"
    runs = True
    delta_event: type[BaseModel] | None = ResponseMcpCallArgumentsDeltaEvent

    def _item(self, call: ServerCall, status: Any, **result: Any) -> McpCall:
        assert call.namespace is not None  # an MCP call names its server
        return McpCall(
            id=call.item_id,
            type="mcp_call",
            server_label=call.namespace,
            name=call.name,
            arguments=call.arguments,
            approval_request_id=call.approval_request_id,
            status=status,
            **result,
        )

    def added(self, call: ServerCall) -> McpCall:
        return self._item(call, "in_progress")

    def streamed(self, call: ServerCall, arguments: str) -> str:
        return arguments

    def opened(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return [ResponseMcpCallInProgressEvent(type="response.mcp_call.in_progress", **_at(call))]

    def arguments_done(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return [ResponseMcpCallArgumentsDoneEvent(type="response.mcp_call_arguments.done", arguments=call.arguments, **_at(call))]

    def running(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return []

    def finished(self, call: ServerCall, outcome: ToolOutcome) -> tuple[list[ResponseStreamEvent], McpCall]:
        if outcome.error is not None:
            item = self._item(call, "failed", error=outcome.error.as_sdk())
            return [ResponseMcpCallFailedEvent(type="response.mcp_call.failed", **_at(call))], item
        if outcome.output is None:  # never finished: the response ended first
            return [], self._item(call, "incomplete")
        item = self._item(call, "completed", output=outcome.output)
        return [ResponseMcpCallCompletedEvent(type="response.mcp_call.completed", **_at(call))], item


class McpApprovalRequestKind:
    """`mcp_approval_request`: a call that waits for the client's approval. No events of its
    own (its arguments are not streamed); the response ends with it, nothing is run."""

    item_type = "mcp_approval_request"
    id_prefix = "mcpr"
    runs = False
    delta_event: type[BaseModel] | None = None

    def added(self, call: ServerCall) -> McpApprovalRequest:
        assert call.namespace is not None
        return McpApprovalRequest(
            id=call.item_id, type="mcp_approval_request", server_label=call.namespace, name=call.name, arguments=call.arguments
        )

    def streamed(self, call: ServerCall, arguments: str) -> str:
        return ""

    def opened(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return []

    def arguments_done(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return []

    def running(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return []

    def finished(self, call: ServerCall, outcome: ToolOutcome) -> tuple[list[ResponseStreamEvent], McpApprovalRequest]:
        return [], self.added(call)


MCP_CALL = McpCallKind()
MCP_APPROVAL_REQUEST = McpApprovalRequestKind()


@dataclass(slots=True)
class ServerTools:
    """Which calls of the model the server runs, as what kind of item. MCP servers are
    namespaces named by their label (`LABEL.TOOL`); a built-in tool may also be a single
    name (`python`). `needs_approval(namespace, name)`: the call waits for the client."""

    namespaces: dict[str, CallKind] = field(default_factory=dict)
    names: dict[str, CallKind] = field(default_factory=dict)
    needs_approval: Callable[[str | None, str], bool] = lambda namespace, name: False
    # The pages the browser showed in this response, by cursor (`citations.CitedPage`): the
    # answer's citation markers become annotations (None: no browser, markers stay text).
    citations: Mapping[int, Any] | None = None

    def kind_of(self, namespace: str | None, name: str) -> CallKind | None:
        """The kind of item a call of `namespace.name` is; None: a client-run function call."""
        kind = self.namespaces.get(namespace) if namespace is not None else self.names.get(name)
        if kind is not None and self.needs_approval(namespace, name):
            return MCP_APPROVAL_REQUEST
        return kind


# -- built-in tools ------------------------------------------------------------------------

_BROWSER_ACTIONS: dict[str, dict[str, Any]] = {
    "search": {"type": "search"},
    "open": {"type": "open_page"},
    "find": {"type": "find_in_page", "pattern": "", "url": ""},
}


def browser_action(name: str, arguments: str) -> dict[str, Any]:
    """A browser call's `web_search_call` action as far as its arguments tell (the browser's
    result tells the rest: a link's URL, the page searched)."""
    action = dict(_BROWSER_ACTIONS.get(name, _BROWSER_ACTIONS["search"]))
    try:
        given = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        given = {}
    if not isinstance(given, dict):
        given = {}
    if action["type"] == "search" and isinstance(given.get("query"), str):
        action["query"] = given["query"]
    elif action["type"] == "open_page" and isinstance(given.get("id"), str):
        action["url"] = given["id"]
    elif action["type"] == "find_in_page" and isinstance(given.get("pattern"), str):
        action["pattern"] = given["pattern"]
    return action


class WebSearchCallKind:
    """`web_search_call` (the browser's search, open and find): added → web_search_call.in_progress
    → (the browser is called) web_search_call.searching → .completed → output_item.done with
    the action the browser took. A call the browser refused or could not make ends `failed`
    (the SDK has no event for it); the model reads the browser's words either way."""

    item_type = "web_search_call"
    id_prefix = "ws"
    runs = True
    delta_event: type[BaseModel] | None = None

    def added(self, call: ServerCall) -> ResponseFunctionWebSearch:
        return ResponseFunctionWebSearch.model_validate(
            {
                "id": call.item_id,
                "type": "web_search_call",
                "status": "in_progress",
                "action": _BROWSER_ACTIONS.get(call.name, _BROWSER_ACTIONS["search"]),
            }
        )

    def streamed(self, call: ServerCall, arguments: str) -> str:
        return ""

    def opened(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return [ResponseWebSearchCallInProgressEvent(type="response.web_search_call.in_progress", **_at(call))]

    def arguments_done(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return []

    def running(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return [ResponseWebSearchCallSearchingEvent(type="response.web_search_call.searching", **_at(call))]

    def finished(self, call: ServerCall, outcome: ToolOutcome) -> tuple[list[ResponseStreamEvent], ResponseFunctionWebSearch]:
        action = outcome.item.get("action") or browser_action(call.name, call.arguments)
        status = "failed" if outcome.error is not None else "incomplete" if outcome.output is None else "completed"
        item = ResponseFunctionWebSearch.model_validate({"id": call.item_id, "type": "web_search_call", "status": status, "action": action})
        if status != "completed":
            return [], item
        return [ResponseWebSearchCallCompletedEvent(type="response.web_search_call.completed", **_at(call))], item


class CodeInterpreterCallKind:
    """`code_interpreter_call` (the python tool) of one response, in its container: added →
    code_interpreter_call.in_progress → _code.delta* → _code.done → (the code runs)
    .interpreting → .completed → output_item.done with the outputs (when the request
    includes them). A call that ran nothing (no such container, a limit, arguments that are
    no code) ends `failed` (the SDK has no event for it)."""

    item_type = "code_interpreter_call"
    id_prefix = "ci"
    runs = True
    delta_event: type[BaseModel] | None = ResponseCodeInterpreterCallCodeDeltaEvent

    def __init__(self, container_id: str) -> None:
        self.container_id = container_id

    def _item(self, call: ServerCall, status: str, **fields: Any) -> ResponseCodeInterpreterToolCall:
        code = call.code.text if call.code is not None else ""
        record = {"id": call.item_id, "type": "code_interpreter_call", "status": status, "code": code, "container_id": self.container_id}
        return ResponseCodeInterpreterToolCall.model_validate({**record, "outputs": None, **fields})

    def added(self, call: ServerCall) -> ResponseCodeInterpreterToolCall:
        return self._item(call, "in_progress")

    @staticmethod
    def _code(call: ServerCall) -> StringArgument:
        if call.code is None:
            call.code = StringArgument(call.json_arguments)
        return call.code

    def streamed(self, call: ServerCall, arguments: str) -> str:
        return self._code(call).feed(arguments)

    def opened(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return [ResponseCodeInterpreterCallInProgressEvent(type="response.code_interpreter_call.in_progress", **_at(call))]

    def arguments_done(self, call: ServerCall) -> list[ResponseStreamEvent]:
        code = self._code(call)
        events: list[ResponseStreamEvent] = []
        if rest := code.finish(call.arguments):  # what could not be decoded as it came
            events.append(
                ResponseCodeInterpreterCallCodeDeltaEvent(type="response.code_interpreter_call_code.delta", delta=rest, **_at(call))
            )
        done = ResponseCodeInterpreterCallCodeDoneEvent(type="response.code_interpreter_call_code.done", code=code.text, **_at(call))
        return [*events, done]

    def running(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return [ResponseCodeInterpreterCallInterpretingEvent(type="response.code_interpreter_call.interpreting", **_at(call))]

    def finished(self, call: ServerCall, outcome: ToolOutcome) -> tuple[list[ResponseStreamEvent], ResponseCodeInterpreterToolCall]:
        if outcome.error is not None:
            return [], self._item(call, "failed", **outcome.item)
        if outcome.output is None:
            return [], self._item(call, "incomplete")
        item = self._item(call, "completed", **outcome.item)
        return [ResponseCodeInterpreterCallCompletedEvent(type="response.code_interpreter_call.completed", **_at(call))], item


WEB_SEARCH_CALL = WebSearchCallKind()


def file_search_query(arguments: str) -> str | None:
    """The query of a file_search call's arguments (`{"query": "..."}`), or None."""
    try:
        given = json.loads(arguments) if arguments.strip() else None
    except ValueError:
        return None
    query = given.get("query") if isinstance(given, dict) else None
    return query if isinstance(query, str) else None


class FileSearchCallKind:
    """`file_search_call` (a search of the request's vector stores): added →
    file_search_call.in_progress → (the stores are searched) file_search_call.searching →
    .completed → output_item.done with its queries and, with `include:
    ["file_search_call.results"]`, its results. A search that could not run ends `failed`
    (the SDK has no event for it); the model reads why."""

    item_type = "file_search_call"
    id_prefix = "fs"
    runs = True
    delta_event: type[BaseModel] | None = None

    def _item(self, call: ServerCall, status: str, **fields: Any) -> ResponseFileSearchToolCall:
        query = file_search_query(call.arguments)
        record = {"id": call.item_id, "type": "file_search_call", "status": status, "queries": [query] if query is not None else []}
        return ResponseFileSearchToolCall.model_validate({**record, **fields})

    def added(self, call: ServerCall) -> ResponseFileSearchToolCall:
        return self._item(call, "in_progress")

    def streamed(self, call: ServerCall, arguments: str) -> str:
        return ""

    def opened(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return [ResponseFileSearchCallInProgressEvent(type="response.file_search_call.in_progress", **_at(call))]

    def arguments_done(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return []

    def running(self, call: ServerCall) -> list[ResponseStreamEvent]:
        return [ResponseFileSearchCallSearchingEvent(type="response.file_search_call.searching", **_at(call))]

    def finished(self, call: ServerCall, outcome: ToolOutcome) -> tuple[list[ResponseStreamEvent], ResponseFileSearchToolCall]:
        if outcome.error is not None:
            return [], self._item(call, "failed", **outcome.item)
        if outcome.output is None:
            return [], self._item(call, "incomplete")
        item = self._item(call, "completed", **outcome.item)
        return [ResponseFileSearchCallCompletedEvent(type="response.file_search_call.completed", **_at(call))], item


FILE_SEARCH_CALL = FileSearchCallKind()

_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_SURROGATE = regex.compile(r"[\ud800-\udfff]")
_HEX4 = regex.compile(r"[0-9a-fA-F]{4}")
_LOW_ESCAPE = regex.compile(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}")  # a low surrogate, escaped


class StringArgument:
    """One string argument of a call, as the arguments stream in: the arguments themselves (a
    harmony model writes python's code, or a custom tool's input, as the message), or the
    `key` string of a JSON object (`{"code": "..."}`: chat templates, harmony's
    `<|constrain|>json`), decoded as it comes. A JSON call of another shape is decoded at
    its end (`finish`); `error` says when it holds no such string. `feed` and `finish` return
    the text that is new, so any split of the arguments gives the same text; a lone
    surrogate escape becomes U+FFFD."""

    def __init__(self, json_arguments: bool, key: str = "code") -> None:
        self.text = ""
        self.error: str | None = None
        self._key = key
        # The start of `{"KEY": "` (whitespace anywhere JSON allows it).
        self._object_start = regex.compile(r"\s*\{\s*" + regex.escape(json.dumps(key)) + r'\s*:\s*"')
        self._state = "prefix" if json_arguments else "raw"  # prefix | string | closed | other | raw
        self._pending = ""  # undecided text: the object's start, or an unfinished escape

    def feed(self, text: str) -> str:
        if self._state == "raw":
            self.text += text
            return text
        if self._state in ("closed", "other"):
            return ""
        pending = self._pending + text
        self._pending = ""
        if self._state == "prefix":
            match = self._object_start.match(pending, partial=True)
            if match is None:
                self._state = "other"
                return ""
            if match.partial:
                self._pending = pending
                return ""
            self._state, pending = "string", pending[match.end() :]
        new = self._decode(pending)
        self.text += new
        return new

    def finish(self, arguments: str) -> str:
        """The end of the arguments (all of them): the text not returned yet."""
        if self._state == "raw":
            return ""
        if self._state in ("string", "closed"):  # streamed (an unterminated string: the model was cut off)
            rest = "\ufffd" if self._pending.startswith("\\u") and self._state == "string" and len(self._pending) >= 6 else ""
            self._pending = ""
            self.text += rest
            return rest
        try:
            value = json.loads(arguments)
        except ValueError:
            value = None
        text = value if isinstance(value, str) else value.get(self._key) if isinstance(value, dict) else None  # a JSON string: the text
        if not isinstance(text, str):
            self.error = f'The arguments must be a JSON object {{"{self._key}": "<text>"}}.'
            return ""
        text = str(_SURROGATE.sub("\ufffd", text))  # json.loads keeps a lone surrogate, which is no text
        self.text = text
        return text

    def _decode(self, text: str) -> str:
        out: list[str] = []
        i = 0
        while i < len(text):
            char = text[i]
            if char == '"':
                self._state = "closed"
                break
            if char != "\\":
                j = i
                while j < len(text) and text[j] not in '"\\':
                    j += 1
                out.append(text[i:j])
                i = j
                continue
            escape = text[i + 1 : i + 2]
            if not escape:
                self._pending = text[i:]
                break
            if escape != "u":
                out.append(_ESCAPES.get(escape, escape))
                i += 2
                continue
            if len(text) < i + 6:
                self._pending = text[i:]
                break
            if not _HEX4.fullmatch(text, i + 2, i + 6):
                out.append("\ufffd")
                i += 2
                continue
            unit = int(text[i + 2 : i + 6], 16)
            if 0xD800 <= unit < 0xDC00:  # a high surrogate: its low half follows, or it is alone
                low = text[i + 6 : i + 12]
                if len(low) < 6 and _LOW_ESCAPE.fullmatch(low, partial=True):
                    self._pending = text[i:]  # the low half may still come
                    break
                if _LOW_ESCAPE.fullmatch(low):
                    out.append(chr(0x10000 + ((unit - 0xD800) << 10) + (int(low[2:], 16) - 0xDC00)))
                    i += 12
                    continue
                out.append("\ufffd")
            else:
                out.append("\ufffd" if 0xDC00 <= unit < 0xE000 else chr(unit))
            i += 6
        return "".join(out)


# -- mcp_list_tools ------------------------------------------------------------------------


def listing_added(item_id: str, server_label: str) -> McpListTools:
    return McpListTools(id=item_id, type="mcp_list_tools", server_label=server_label, tools=[])


def listing_opened(item_id: str, output_index: int) -> list[ResponseStreamEvent]:
    at = {"item_id": item_id, "output_index": output_index, "sequence_number": 0}
    return [ResponseMcpListToolsInProgressEvent(type="response.mcp_list_tools.in_progress", **at)]


def listing_finished(
    item_id: str, output_index: int, server_label: str, tools: list[McpListToolsTool], error: str | None
) -> tuple[list[ResponseStreamEvent], McpListTools]:
    """`mcp_list_tools.completed` (or `.failed`, the item's `error` saying why) and the item."""
    at = {"item_id": item_id, "output_index": output_index, "sequence_number": 0}
    item = McpListTools(id=item_id, type="mcp_list_tools", server_label=server_label, tools=tools, error=error)
    if error is not None:
        return [ResponseMcpListToolsFailedEvent(type="response.mcp_list_tools.failed", **at)], item
    return [ResponseMcpListToolsCompletedEvent(type="response.mcp_list_tools.completed", **at)], item

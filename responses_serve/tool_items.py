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
response hands it to the client. Built-in tools add kinds here (web_search_call,
code_interpreter_call) and route calls to them with `ServerTools`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from openai.types.responses import (
    ResponseMcpCallArgumentsDeltaEvent,
    ResponseMcpCallArgumentsDoneEvent,
    ResponseMcpCallCompletedEvent,
    ResponseMcpCallFailedEvent,
    ResponseMcpCallInProgressEvent,
    ResponseMcpListToolsCompletedEvent,
    ResponseMcpListToolsFailedEvent,
    ResponseMcpListToolsInProgressEvent,
    ResponseStreamEvent,
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
    """What running a call gave: an output, or an error (the model reads either)."""

    output: str | None = None
    error: ToolError | None = None

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


_Event = Callable[..., ResponseStreamEvent]


class CallKind(Protocol):
    """How one type of server-side call shows in a response."""

    item_type: str
    id_prefix: str
    runs: bool  # False: done when its arguments are (an approval request)
    delta_event: type[BaseModel] | None  # the argument delta event; None: arguments not streamed

    def added(self, call: ServerCall) -> Any: ...
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

    def kind_of(self, namespace: str | None, name: str) -> CallKind | None:
        """The kind of item a call of `namespace.name` is; None: a client-run function call."""
        kind = self.namespaces.get(namespace) if namespace is not None else self.names.get(name)
        if kind is not None and self.needs_approval(namespace, name):
            return MCP_APPROVAL_REQUEST
        return kind


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

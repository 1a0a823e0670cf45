"""The remote MCP servers a request names (`{"type": "mcp", "server_label", "server_url", ...}`):
a `Toolset` of the tool loop.

- Listing: a server's tools are listed once per response, as an `mcp_list_tools` item, and
  not again while an `mcp_list_tools` item for its label is in the conversation (a failed
  listing does not count). A server that cannot be reached gives the item an `error`; the
  response goes on without its tools.
- Offer: the tools `allowed_tools` lets through, as a namespace named by the label (harmony:
  `LABEL.TOOL`; chat templates: functions `LABEL.TOOL`). A tool whose name or schema the
  model could not be given safely is left out (a name that is no function name, a schema too
  large or too deep). `tool_choice: {"type": "mcp", ...}` becomes the choice of that
  function (or of any of the server's), so its arguments follow the tool's input schema
  where the engine can enforce it (families/constraints.py).
- Approvals: a call needs the client's approval unless `require_approval` says otherwise
  (`never`, or a filter). It becomes an `mcp_approval_request` and the response ends; an
  `mcp_approval_response` in a later request's input that approves it runs the call then (as
  an `mcp_call` with its `approval_request_id`), once. A denied call is never sent.
- Calls: only to tools that were offered, with a JSON object of arguments; everything the
  server returns is text for the model, cut at `max_output_bytes`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import mcp_types
from openai.types.responses import ResponseStreamEvent
from openai.types.responses.response_output_item import McpListToolsTool
from pydantic import ValidationError

from serve_app.api.errors import invalid_request
from serve_app.api.items import (
    FUNCTION_NAME_PATTERN,
    HistoryItem,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    McpListedTool,
    McpListToolsItem,
)
from serve_app.api.request import ResponsesRequest
from serve_app.api.tools import (
    AllowedToolRef,
    AllowedToolsChoice,
    FunctionTool,
    McpTool,
    McpToolChoice,
    NamedFunctionChoice,
    NamespaceTool,
    Tool,
)
from serve_app.core.stream import ResponseStream
from serve_app.core.tool_items import MCP_CALL, ServerCall, ServerTools, ToolOutcome
from serve_app.tools.mcp_client import ConnectPolicy, McpConnection, McpLimits, McpUnavailable, result_text
from serve_app.tools.server_tools import CallReport, CallStatus, until

logger = logging.getLogger(__name__)

MAX_SCHEMA_BYTES = 64 * 1024  # an input schema larger than this is not offered
MAX_SCHEMA_DEPTH = 32  # nor one nested deeper (the prompt renderers recurse over it)
MAX_DESCRIPTION_CHARS = 8 * 1024  # a tool's description is cut here
# MCP servers one request may name: each is a connection and a listing of up to
# `max_output_bytes` held for the response (and kept in its history), all opened at once.
MAX_SERVERS = 16
_NAME = re.compile(FUNCTION_NAME_PATTERN)


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value, counting up to `limit` + 1 only."""
    stack, deepest = [(value, 1)], 0
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack += [(child, depth + 1) for child in children]
    return deepest


def offerable(tool: McpListedTool) -> FunctionTool | None:
    """The tool as a function the model can be given, or None (with a log line) if it cannot."""
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {"type": "object", "properties": {}}
    why = None
    if not _NAME.fullmatch(tool.name) or (not tool.name[0].isalpha() and tool.name[0] != "_"):
        why = "its name is not a function name"
    elif _depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH or len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        why = "its input schema is too large or too deep"
    else:
        try:
            return FunctionTool(
                type="function", name=tool.name, description=(tool.description or "")[:MAX_DESCRIPTION_CHARS], parameters=schema
            )
        except ValidationError:
            why = "its input schema is not a JSON schema of an object"
    logger.info("MCP tool %.100r not offered: %s", tool.name, why)
    return None


def _read_only(tool: McpListedTool) -> bool | None:
    annotations = tool.annotations if isinstance(tool.annotations, dict) else {}
    hint = annotations.get("readOnlyHint", annotations.get("read_only_hint"))
    return hint if isinstance(hint, bool) else None


def _listed(tool: Any) -> McpListToolsTool:
    """An MCP SDK tool as the `mcp_list_tools` item lists it."""
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations is not None else None
    return McpListToolsTool(name=tool.name, input_schema=tool.input_schema, description=tool.description, annotations=annotations)


class RemoteMcpFactory:
    """Makes the toolset of a request's MCP servers; one per application."""

    def __init__(self, policy: ConnectPolicy, limits: McpLimits, report: Callable[[CallReport], None] = lambda report: None) -> None:
        self.policy = policy
        self.limits = limits
        self.report = report  # each listing, as metrics count calls (kind mcp_list_tools)

    def check(self, request: ResponsesRequest) -> list[Tool]:
        """400 for an MCP server the request may not name: before any connection is made.
        Every MCP server a request may name is run: none is left out."""
        if len(servers := request.mcp_tools()) > MAX_SERVERS:
            raise invalid_request(
                f"A request may name at most {MAX_SERVERS} MCP servers; this one names {len(servers)}.",
                param="tools",
                code="array_above_max_length",
            )
        for index, tool in enumerate(request.tools):
            if isinstance(tool, McpTool):
                assert tool.server_url is not None  # the request model requires one
                try:
                    self.policy.check(tool.server_url)
                except ValueError as exc:
                    raise invalid_request(f"MCP server '{tool.server_label}': {exc}.", param=f"tools[{index}].server_url") from None
        return []

    def __call__(
        self, request: ResponsesRequest, history: list[HistoryItem], input_items: list[HistoryItem], tenant: str
    ) -> RemoteMcpServers | None:
        servers = request.mcp_tools()
        approved = approved_calls(history, input_items, {server.server_label for server in servers})
        if not servers:
            return None
        return RemoteMcpServers(servers, self.policy, self.limits, history, approved, self.report)


def approved_calls(history: list[HistoryItem], input_items: list[HistoryItem], labels: set[str]) -> list[McpApprovalRequestItem]:
    """The calls this request's input approves that have not run yet (each runs once); a 400
    for an approval of a request not in the conversation, or of a server not in tools."""
    requests = {item.id: item for item in history if isinstance(item, McpApprovalRequestItem)}
    ran = {item.approval_request_id for item in history if isinstance(item, McpCallItem) and item.approval_request_id}
    approved = []
    for index, item in enumerate(input_items):
        if not isinstance(item, McpApprovalResponseItem) or not item.approve or item.approval_request_id in ran:
            continue
        request = requests.get(item.approval_request_id)
        if request is None:
            raise invalid_request(
                f"No MCP approval request with id '{item.approval_request_id}' in this conversation.",
                param=f"input[{index}].approval_request_id",
            )
        if request.server_label not in labels:
            raise invalid_request(
                f"The approved call is to MCP server '{request.server_label}', which is not in tools: "
                "send the server's tool (with its headers) again to run it.",
                param=f"input[{index}]",
            )
        ran.add(request.id)
        approved.append(request)
    return approved


class RemoteMcpServers:
    """The request's MCP servers, for one response."""

    def __init__(
        self,
        servers: list[McpTool],
        policy: ConnectPolicy,
        limits: McpLimits,
        history: list[HistoryItem],
        approved: list[McpApprovalRequestItem],
        report: Callable[[CallReport], None] = lambda report: None,
    ) -> None:
        self.servers = {server.server_label: server for server in servers}
        self._report = report
        self.policy, self.limits = policy, limits
        self.listed: dict[str, list[McpListedTool]] = {}  # label -> its tools, from the conversation or listed now
        for item in history:
            if isinstance(item, McpListToolsItem) and item.error is None and item.server_label in self.servers:
                self.listed[item.server_label] = item.tools
        self.approved = approved  # run before the first generation
        self._offered: dict[str, tuple[list[McpListedTool], dict[str, tuple[FunctionTool, McpListedTool]]]] = {}
        self._connections: dict[str, McpConnection] = {}

    def _tools(self, label: str) -> dict[str, tuple[FunctionTool, McpListedTool]]:
        """The server's tools the model is offered: listed, allowed by the request, offerable
        (worked out once per listing: a schema's check is not free)."""
        listed = self.listed.get(label, [])
        cached = self._offered.get(label)
        if cached is not None and cached[0] is listed:
            return cached[1]
        server = self.servers[label]
        offered = {}
        for tool in listed:
            if server.allows(tool.name, _read_only(tool)) and (function := offerable(tool)) is not None:
                offered[tool.name] = (function, tool)
        self._offered[label] = (listed, offered)
        return offered

    def offer(self, request: ResponsesRequest) -> ResponsesRequest:
        namespaces = []
        for label, server in self.servers.items():
            functions = [function for function, _ in self._tools(label).values()]
            namespaces.append(NamespaceTool(type="namespace", name=label, description=server.server_description or "", tools=functions))
        choice = request.tool_choice
        if isinstance(choice, McpToolChoice) and choice.server_label in self.listed:  # else: once it is listed
            offered = self._tools(choice.server_label)
            if choice.name is not None:
                if choice.name not in offered:  # not listed (or not allowed): nothing to force
                    raise invalid_request(
                        f"tool_choice names tool '{choice.name}', which MCP server '{choice.server_label}' does not offer.",
                        param="tool_choice.name",
                    )
                choice = NamedFunctionChoice(type="function", name=f"{choice.server_label}.{choice.name}")
            elif offered:
                refs = [AllowedToolRef(type="function", name=f"{choice.server_label}.{name}") for name in offered]
                choice = AllowedToolsChoice(type="allowed_tools", mode="required", tools=refs)
            else:
                choice = "auto"  # the server has no tool: the model answers
        return request.model_copy(update={"tools": [*request.tools, *namespaces], "tool_choice": choice})

    def route(self, tools: ServerTools) -> None:
        previous = tools.needs_approval
        for label in self.servers:
            tools.namespaces[label] = MCP_CALL

        def needs_approval(namespace: str | None, name: str) -> bool:
            if namespace not in self.servers:
                return previous(namespace, name)
            listed = self._tools(namespace).get(name)
            return self.servers[namespace].needs_approval(name, _read_only(listed[1]) if listed else None)

        tools.needs_approval = needs_approval

    def prepares(self) -> bool:
        return bool(self.approved) or any(label not in self.listed for label in self.servers)

    async def prepare(self, stream: ResponseStream, deadline: float | None) -> AsyncIterator[list[ResponseStreamEvent]]:
        unlisted = [label for label in self.servers if label not in self.listed]
        if unlisted:
            items = {label: stream.open_tool_listing(label) for label in unlisted}
            yield stream.events()
            # Listed side by side; the items finish in order.
            started = time.perf_counter()
            ended: dict[str, float] = {}  # when each listing's own work ended
            reported: set[str] = set()

            def listing_ended(label: str, _: asyncio.Task[list[mcp_types.Tool]]) -> None:
                ended[label] = time.perf_counter()

            def report(label: str, status: CallStatus) -> None:  # metrics: each server's listing and its own time
                reported.add(label)
                self._report(CallReport(label, "mcp_list_tools", status, ended.get(label, time.perf_counter()) - started))

            listings = {label: asyncio.create_task(self._connection(label).list_tools()) for label in unlisted}
            for label, listing in listings.items():
                listing.add_done_callback(functools.partial(listing_ended, label))

            try:
                for label, listing in listings.items():
                    try:
                        async with until(deadline):
                            tools = await listing
                    except McpUnavailable as exc:
                        logger.info("MCP server %s: listing failed: %.300s", label, exc.error.message)  # the server's words, capped
                        report(label, "failed")
                        yield stream.finish_tool_listing(items[label], [], exc.error.message)
                        continue
                    listed = [_listed(tool) for tool in tools]
                    self.listed[label] = [McpListedTool.model_validate(tool.model_dump()) for tool in listed]
                    report(label, "completed")
                    yield stream.finish_tool_listing(items[label], listed)
            finally:
                for label, listing in listings.items():
                    listing.cancel()
                    if label not in reported:  # the response ended first
                        report(label, "cancelled")
        for request in self.approved:
            stream.add_server_call(MCP_CALL, request.server_label, request.name, request.arguments, approval_request_id=request.id)
            yield stream.events()

    def owns(self, call: ServerCall) -> bool:
        return call.kind is MCP_CALL and call.namespace in self.servers

    def label(self, call: ServerCall) -> str:
        return call.namespace or ""

    async def run(self, call: ServerCall) -> ToolOutcome:
        label = call.namespace
        assert label is not None  # MCP calls name their server
        if call.name not in self._tools(label):  # never a tool the request did not let the model see
            return ToolOutcome.failed(f"Not run: MCP server '{label}' offers no tool '{call.name}' to this response.")
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except ValueError as exc:
            return ToolOutcome.failed(f"Not run: the arguments are not JSON ({exc}).")
        if not isinstance(arguments, dict):
            return ToolOutcome.failed("Not run: the arguments are not a JSON object.")
        try:
            result = await self._connection(label).call_tool(call.name, arguments)
        except McpUnavailable as exc:
            return ToolOutcome(error=exc.error)
        text = result_text(result, self.limits.max_output_bytes)
        return ToolOutcome.failed(text) if result.is_error else ToolOutcome(output=text)

    def _connection(self, label: str) -> McpConnection:
        if label not in self._connections:
            server = self.servers[label]
            assert server.server_url is not None
            self._connections[label] = McpConnection(server.server_url, server.secret_headers(), self.policy, self.limits)
        return self._connections[label]

    async def aclose(self) -> None:
        for connection in self._connections.values():
            connection.close()

"""Server-side tools for one response: what the tool loop (serve_app/runtime/tool_loop.py)
offers the model, and runs when it calls them.

Each kind of server-side tool is a `Toolset` for the response: the request's remote MCP
servers (`remote_mcp.py`); the built-in tools (python, browser) plug in the same way. A
toolset adds its tools to the request the model is prompted with (`offer`), claims the
calls that are its own (`route`: a namespace such as an MCP server's label, or a name such
as `python`, and the kind of item each call is), may add items before the first generation
(`prepare`: an MCP server's tool listing, a call the client approved), and runs a call
(`run`, within its own timeouts). `ResponseTools` holds a response's toolsets and runs the
calls of a round: at most `max_calls` in a response (the model is told that further calls
were not run), side by side unless the request's `parallel_tool_calls` is false.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from openai.types.responses import ResponseStreamEvent

from serve_app.api.items import HistoryItem
from serve_app.api.request import ResponsesRequest
from serve_app.api.tools import HostedTool, Tool
from serve_app.core.stream import ResponseStream
from serve_app.core.tool_items import ServerCall, ServerTools, ToolOutcome

CallStatus = Literal["completed", "failed", "not_run", "cancelled"]


class StreamTooLong(Exception):
    """The response passed its maximum duration (`max_stream_duration_s`)."""


@contextlib.asynccontextmanager
async def until(deadline: float | None) -> AsyncIterator[None]:
    """The wait inside ends at `deadline` (the event loop's time; None: never) with
    `StreamTooLong`, the awaited work cancelled. Never around a `yield` of a generator: the
    timeout must not fall on the consumer's code."""
    if deadline is None:
        yield
        return
    try:
        async with asyncio.timeout_at(deadline):
            yield
    except TimeoutError:
        raise StreamTooLong from None


@dataclass(frozen=True, slots=True)
class CallReport:
    """One server-side call, reported when it ends (metrics, the tool loop's benchmark)."""

    label: str  # the MCP server label, or the built-in tool's name
    kind: str  # the item type: mcp_call, ...
    status: CallStatus
    seconds: float  # the tool's own time: from sending the call to its outcome


class Toolset(Protocol):
    """Server-side tools of one kind, for one response."""

    def offer(self, request: ResponsesRequest) -> ResponsesRequest:
        """`request` with these tools among the tools the model is offered."""
        ...

    def route(self, tools: ServerTools) -> None:
        """Claim this toolset's calls in `tools` (namespaces, names, approvals)."""
        ...

    def prepares(self) -> bool:
        """Whether `prepare` has work (if not, the first generation starts at once)."""
        ...

    def prepare(self, stream: ResponseStream, deadline: float | None) -> AsyncIterator[list[ResponseStreamEvent]]:
        """Items before the first generation; calls added to `stream` then are run next.
        Its waits end by `deadline` (`until`)."""
        ...

    def owns(self, call: ServerCall) -> bool: ...

    async def run(self, call: ServerCall) -> ToolOutcome: ...

    def label(self, call: ServerCall) -> str:
        """What metrics call the call's tool (an MCP server's label)."""
        ...

    async def aclose(self) -> None: ...


class NothingToPrepare:
    """A toolset's `prepares`/`prepare` when nothing comes before the first generation (the
    built-in tools: what they offer is known without asking a server)."""

    def prepares(self) -> bool:
        return False

    async def prepare(self, stream: ResponseStream, deadline: float | None) -> AsyncIterator[list[ResponseStreamEvent]]:
        return
        yield  # an async generator with nothing before the first generation


class ResponseTools:
    """The server-side tools of one response."""

    def __init__(
        self,
        toolsets: list[Toolset],
        *,
        max_calls: int,
        parallel: bool,
        report: Callable[[CallReport], None] = lambda report: None,
    ) -> None:
        self.toolsets = toolsets
        self.max_calls = max_calls
        self.parallel = parallel
        self.calls_run = 0
        self.reports: list[CallReport] = []  # this response's calls, in the order they ended
        self._report = report

    def offer(self, request: ResponsesRequest) -> ResponsesRequest:
        for toolset in self.toolsets:
            request = toolset.offer(request)
        return request

    def routing(self) -> ServerTools:
        tools = ServerTools()
        for toolset in self.toolsets:
            toolset.route(tools)
        return tools

    def prepares(self) -> bool:
        return any(toolset.prepares() for toolset in self.toolsets)

    async def prepare(self, stream: ResponseStream, deadline: float | None) -> AsyncIterator[list[ResponseStreamEvent]]:
        for toolset in self.toolsets:
            async for events in toolset.prepare(stream, deadline):
                yield events

    async def run_calls(self, stream: ResponseStream, deadline: float | None) -> AsyncIterator[list[ResponseStreamEvent]]:
        """Run the stream's waiting calls and hand in their outcomes as they come, all by
        `deadline` (`StreamTooLong`: the calls still running are cancelled)."""
        calls = stream.unfinished_calls
        runnable: list[ServerCall] = []
        for call in calls:
            if self.calls_run >= self.max_calls:
                yield stream.finish_call(call, not_run(self.max_calls))
                self._reported(call, "not_run", 0.0)
                continue
            self.calls_run += 1
            runnable.append(call)
        if self.parallel:
            tasks = [asyncio.create_task(self._run(stream, call)) for call in runnable]
            try:
                for done in asyncio.as_completed(tasks):
                    async with until(deadline):
                        events = await done
                    yield events
            finally:  # the response ended (client gone, cancelled, out of time): so do its calls
                for task in tasks:
                    task.cancel()
        else:
            for call in runnable:
                async with until(deadline):
                    events = await self._run(stream, call)
                yield events

    async def _run(self, stream: ResponseStream, call: ServerCall) -> list[ResponseStreamEvent]:
        toolset = next((toolset for toolset in self.toolsets if toolset.owns(call)), None)
        events = stream.run_call(call)
        started = time.perf_counter()
        if toolset is None:  # cannot happen: a call is a server's only if a toolset routed it
            outcome = ToolOutcome.failed("No server-side tool runs this call.")
        else:
            try:
                outcome = await toolset.run(call)
            except asyncio.CancelledError:
                self._reported(call, "cancelled", time.perf_counter() - started, toolset)
                raise
        self._reported(call, "failed" if outcome.error is not None else "completed", time.perf_counter() - started, toolset)
        return events + stream.finish_call(call, outcome)

    def _reported(self, call: ServerCall, status: CallStatus, seconds: float, toolset: Toolset | None = None) -> None:
        owner = toolset or next((t for t in self.toolsets if t.owns(call)), None)
        report = CallReport(owner.label(call) if owner else call.namespace or call.name, call.kind.item_type, status, seconds)
        self.reports.append(report)
        self._report(report)

    async def aclose(self) -> None:
        for toolset in self.toolsets:
            with contextlib.suppress(Exception):
                await toolset.aclose()


def not_run(max_calls: int) -> ToolOutcome:
    return ToolOutcome.failed(f"Not run: this response reached its limit of {max_calls} server-side tool calls (max_tool_calls).")


class ToolFactory(Protocol):
    """Makes a response's toolset of one kind from its request (None: the request has none);
    `tenant`: who asks (what the toolset keeps for later, e.g. a container, is the tenant's)."""

    def check(self, request: ResponsesRequest) -> list[Tool]:
        """A 400 (`APIError`) for a request whose tools of this kind cannot be served; else the
        request's tools of this kind that this server does not run and lets through (the
        config's `unconfigured: ignore`): they are left out of the response."""
        ...

    def __call__(
        self, request: ResponsesRequest, history: list[HistoryItem], input_items: list[HistoryItem], tenant: str
    ) -> Toolset | None: ...


class ServerToolRuntime:
    """What makes each response's server-side tools: one per application (`tools:` config)."""

    def __init__(self, factories: list[ToolFactory], *, max_calls: int, report: Callable[[CallReport], None] = lambda report: None) -> None:
        self.factories = factories
        self.max_calls = max_calls
        self.report = report

    def admit(self, request: ResponsesRequest) -> tuple[ResponsesRequest, list[str]]:
        """The request as this server serves it, and the types of the tools left out of it: the
        hosted tools it does not run (a built-in tool it is not configured for, `file_search`,
        ...) are not offered to the model nor listed in the response's `tools`, so a client
        can tell. 400s before any work is done (and before any connection is made)."""
        left_out = [tool for factory in self.factories for tool in factory.check(request)]
        left_out += [tool for tool in request.tools if isinstance(tool, HostedTool)]
        if not left_out:
            return request, []
        kept = [tool for tool in request.tools if not any(tool is out for out in left_out)]
        return request.model_copy(update={"tools": kept}), [tool.type for tool in left_out]

    def for_response(
        self, request: ResponsesRequest, history: list[HistoryItem], input_items: list[HistoryItem], tenant: str = ""
    ) -> ResponseTools | None:
        toolsets = [toolset for factory in self.factories if (toolset := factory(request, history, input_items, tenant)) is not None]
        if not toolsets:
            return None
        max_calls = self.max_calls if request.max_tool_calls is None else min(self.max_calls, request.max_tool_calls)
        return ResponseTools(toolsets, max_calls=max_calls, parallel=request.parallel_tool_calls, report=self.report)

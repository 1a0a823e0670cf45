"""`code_interpreter`: gpt-oss's python tool as a `Toolset` of the response.

- Offer: harmony models get gpt-oss's own `python` namespace in the system message (its
  description with the tool's timeout); chat-template models a function `python` of
  `{"code": string}`. Calls are `code_interpreter_call` items whose code streams.
- Containers belong to the tenant. `container: {"type": "auto"}` gives the response a new
  container, named when the response starts (its items carry the id from the first event)
  and made by the tool at the first call; its later calls keep its state. `container:
  "cntr_..."` continues one the tenant made in an earlier response, for the tool's TTL after
  its last use. Which containers a tenant has is kept in its own part of the store, so another
  tenant's id is not even sent to the tool (which checks the owner too): both answer
  `not_found` alike.
- An embedded tool's container lives in one replica: each call goes to the replica that
  holds it (the store keeps that too, for later responses). A lost replica loses its
  containers: a call then reports that the container is gone.
- Outputs: the model reads the tool's text (stdout and stderr, the last value, a traceback,
  the sandbox's notes); the item's `outputs` (logs, and each matplotlib figure as a PNG data
  URL) only with `include: ["code_interpreter_call.outputs"]`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from typing import Any

import mcp_types

from serve_app.api.request import ResponsesRequest
from serve_app.api.tools import BuiltinTool, CodeInterpreterTool
from serve_app.core.tool_items import CodeInterpreterCallKind, ServerCall, ServerTools, StringArgument, ToolError, ToolOutcome
from serve_app.core.utf8 import cap_text
from serve_app.state import StoreUnavailable
from serve_app.state.store import Store
from serve_app.tools.builtin.transport import ToolTransport, ToolUnavailable
from serve_app.tools.python.mcp_server import META_CONTAINER, META_CREATE, META_OWNER, META_STATUS, TOOL_NAME, tool_description
from serve_app.tools.server_tools import NothingToPrepare

logger = logging.getLogger(__name__)

INCLUDE_OUTPUTS = "code_interpreter_call.outputs"
CODE_PARAMETERS: dict[str, Any] = {  # python as a function, for chat templates
    "type": "object",
    "properties": {"code": {"type": "string", "description": "The Python code to run."}},
    "required": ["code"],
}
RAN = ("ok", "error", "timeout", "crashed")  # the code ran (an exception, a timeout: the text says)
MAX_TEXT_BYTES = 1024 * 1024  # of what the model reads of one call (the tool caps its own output lower)


def not_found(container_id: str) -> str:
    """What a call on a container the tenant does not have reads (the tool's own words)."""
    return f"no container {container_id}: it expired, was deleted or freed for others, or never existed"


class ContainerRecords:
    """The containers of one tenant (its `TenantStore`): id -> the replica holding it (None: a
    tool at a URL), kept for the tool's TTL after the last use."""

    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store, self.ttl_s = store, ttl_s

    @staticmethod
    def _key(container_id: str) -> str:
        return f"container:{container_id}"

    async def get(self, container_id: str) -> tuple[bool, str | None]:
        """(whether the tenant has it, the replica holding it)."""
        raw = await self.store.get(self._key(container_id))
        if raw is None:
            return False, None
        route = json.loads(raw).get("route")
        return True, route if isinstance(route, str) else None

    async def put(self, container_id: str, route: str | None) -> None:
        await self.store.put(self._key(container_id), json.dumps({"route": route}).encode(), ttl_s=self.ttl_s)

    async def delete(self, container_id: str) -> None:
        await self.store.delete(self._key(container_id))


class PythonTools(NothingToPrepare):
    """The python tool for one response."""

    def __init__(
        self,
        tool: CodeInterpreterTool,
        transport: ToolTransport,
        records: ContainerRecords,
        *,
        tenant: str,
        timeout_s: float,
        include_outputs: bool,
    ) -> None:
        self.transport, self.records, self.tenant = transport, records, tenant
        self.auto = not isinstance(tool.container, str)
        self.container_id = "cntr_" + secrets.token_hex(16) if self.auto else str(tool.container)
        self.kind = CodeInterpreterCallKind(self.container_id)
        self.description = tool_description(timeout_s)
        self.include_outputs = include_outputs
        self._made = False  # auto: the tool made the container (its later calls must find it)
        self._known = self.auto  # the tenant's container (auto: made for it)
        self._route: str | None = None  # the replica holding the container

    def offer(self, request: ResponsesRequest) -> ResponsesRequest:
        python = BuiltinTool(
            name=TOOL_NAME, description=self.description, serves="code_interpreter", parameters=CODE_PARAMETERS, text_argument="code"
        )
        return request.model_copy(update={"tools": [*request.tools, python]})

    def route(self, tools: ServerTools) -> None:
        tools.names[TOOL_NAME] = self.kind

    def owns(self, call: ServerCall) -> bool:
        return call.kind is self.kind

    def label(self, call: ServerCall) -> str:
        return TOOL_NAME

    async def run(self, call: ServerCall) -> ToolOutcome:
        code = call.code or StringArgument(call.json_arguments)
        if call.code is None:
            code.finish(call.arguments)
        if code.error is not None:
            return _failed(f"Not run: {code.error}")
        if not self._known:  # a container named by the request: the tenant's?
            try:
                self._known, self._route = await self.records.get(self.container_id)
            except StoreUnavailable as exc:
                return _failed(f"Not run: {exc.message}")
            if not self._known:
                return _failed(not_found(self.container_id))
        meta = {META_OWNER: self.tenant, META_CONTAINER: self.container_id, META_CREATE: self.auto and not self._made}
        try:
            reply = await self.transport.call(TOOL_NAME, {"code": code.text}, meta, self._route)
        except ToolUnavailable as exc:
            return _failed(f"The python tool could not be reached: {exc}")
        result = reply.result
        text = cap_text("\n".join(block.text for block in result.content if isinstance(block, mcp_types.TextContent)), MAX_TEXT_BYTES)
        status = (result.meta or {}).get(META_STATUS)
        if status not in RAN:
            if status == "not_found":  # expired, or its replica was lost: later calls say so too
                self._known, self._made, self._route = False, True, None
                with contextlib.suppress(StoreUnavailable):
                    await self.records.delete(self.container_id)
            return _failed(text or f"The python tool did not run the code ({status or 'no status'}).")
        self._made, self._route = True, reply.route
        try:
            await self.records.put(self.container_id, reply.route)  # the tenant's, for the TTL from now
        except StoreUnavailable as exc:
            logger.warning("container %s: not recorded for its tenant: %s", self.container_id, exc.message)
        item: dict[str, Any] = {}
        if self.include_outputs:
            images = [block for block in result.content if isinstance(block, mcp_types.ImageContent)]
            item["outputs"] = [{"type": "logs", "logs": text}] + [
                {"type": "image", "url": f"data:{image.mime_type};base64,{image.data}"} for image in images
            ]
        return ToolOutcome(output=text, model_text=text, item=item)

    async def aclose(self) -> None:
        await self.transport.aclose()


def _failed(text: str) -> ToolOutcome:
    """Nothing ran; the model reads why."""
    return ToolOutcome(error=ToolError("mcp_tool_execution_error", text), model_text=text)

"""The python tool as an MCP server (the official `mcp` SDK, streamable HTTP at /mcp).

One tool, `python`, whose input is exactly `{"code": string}`: the model writes only the code.
The container and its owner travel out of band in the call's `_meta`:
- request `_meta`: `responses_serve/owner` (the tenant; "" when absent) and, to continue a
  container, `responses_serve/container_id`; with `responses_serve/create: true` too, the
  container of that id is created if it does not exist (the caller chose the id: the tool loop
  names a response's container before its first call), and used if it exists and is the
  owner's. Without an id (what any MCP client sends) the code runs in a one-shot container,
  removed when the call ends: a plain client's calls hold no memory after them;
- result `_meta`: `responses_serve/container_id` (pass it back to keep the state; absent after
  a one-shot call) and
  `responses_serve/status`: ok, error (the code raised: the traceback is the output), timeout,
  crashed (the interpreter died and was restarted), or, when nothing ran, not_found, limit,
  busy, invalid, sandbox.
The result's content is the output as gpt-oss reads it (one text block), then one PNG image block
per matplotlib figure. `isError` is set when the sandbox stepped in or nothing ran (timeout,
crashed and the errors without a run), with the reason in the text; an exception raised by the
code is a normal result, as in a notebook.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import mcp.types as types
from mcp.server import Server
from openai_harmony import ToolNamespaceConfig

from serve_app.tools.asgi import ASGIApp
from serve_app.tools.python.containers import ContainerError, ContainerManager

TOOL_NAME = "python"
META_OWNER = "responses_serve/owner"
META_CONTAINER = "responses_serve/container_id"
META_STATUS = "responses_serve/status"
META_CREATE = "responses_serve/create"
INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"code": {"type": "string"}},
    "required": ["code"],
    "additionalProperties": False,
}


# What openai-harmony's python tool description says that differs on this server.
_HARMONY_FACTS = {
    "time out after 120.0 seconds": "time out after {timeout_s:g} seconds",
    "Internet access for this session is UNKNOWN. Depends on the cluster.": "Internet access for this session is disabled.",
}


def tool_description(timeout_s: float) -> str:
    """gpt-oss's own description of its python tool (openai-harmony's
    `ToolNamespaceConfig.python()`, what the model was trained on), with this server's facts:
    its timeout, and no internet."""
    text = ToolNamespaceConfig.python().description or ""
    for harmony, ours in _HARMONY_FACTS.items():
        text = text.replace(harmony, ours.format(timeout_s=timeout_s))
    return text


def python_tool(timeout_s: float) -> types.Tool:
    return types.Tool(name=TOOL_NAME, description=tool_description(timeout_s), input_schema=INPUT_SCHEMA)


async def call_python(manager: ContainerManager, params: types.CallToolRequestParams) -> types.CallToolResult:
    """One call of the tool, whatever carried it (this MCP server, a Serve deployment of the
    app, the app's own process)."""
    if params.name != TOOL_NAME:
        return _failure("invalid", f"unknown tool {params.name[:100]!r}: this server has one tool, {TOOL_NAME!r}")
    arguments = params.arguments or {}
    if set(arguments) != {"code"} or not isinstance(arguments["code"], str):
        return _failure("invalid", 'the arguments must be {"code": "<python code>"}')
    meta = dict(params.meta or {})
    owner, container, create = meta.get(META_OWNER, ""), meta.get(META_CONTAINER), meta.get(META_CREATE, False)
    if not isinstance(owner, str) or not isinstance(container, str | None) or not isinstance(create, bool):
        return _failure("invalid", f"{META_OWNER} and {META_CONTAINER} in _meta must be strings, {META_CREATE} a boolean")
    try:
        container_id, result = await manager.run(owner, container, arguments["code"], create=create)
    except ContainerError as error:
        return _failure(error.reason, str(error))
    content: list[types.ContentBlock] = [types.TextContent(type="text", text=result.text)]
    content += [types.ImageContent(type="image", data=image, mime_type="image/png") for image in result.images]
    reply: dict[str, Any] = {META_STATUS: result.status} | ({META_CONTAINER: container_id} if container_id is not None else {})
    return types.CallToolResult(content=content, is_error=result.status in ("timeout", "crashed"), _meta=reply)


def mcp_server(manager: ContainerManager) -> Server:
    tool = python_tool(manager.limits.timeout_s)

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await call_python(manager, params)

    return Server(
        "responses-serve-python",
        version=version("responses-serve"),
        instructions="A sandboxed, stateful Python interpreter (the gpt-oss python tool).",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _failure(reason: str, message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True, _meta={META_STATUS: reason})


def mcp_app(manager: ContainerManager, *, host: str = "127.0.0.1") -> ASGIApp:
    """The ASGI app serving the tool at /mcp. Stateless: every call carries what it needs in
    `_meta`, so no MCP session state is kept (the containers are the state)."""
    return mcp_server(manager).streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True, host=host)

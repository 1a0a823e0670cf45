"""How a built-in tool is reached: one MCP tool call, carried by whatever runs the tool.

- a Serve deployment of the app (`embedded`: deployments/tools.py): a tool's state
  (a python container, a response's browsing) lives in one replica, so each reply names the
  replica that answered (`route`), and a call on the same state goes back to it;
- a standalone MCP server at the configured URL (`McpTransport`, one connection per response).

Every transport answers with the MCP `CallToolResult` the tool gave, whatever carried it, so
the toolsets (python.py, browser.py) read one shape.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mcp_types

from serve_app.api.url_patterns import IPAddress, ip_literal
from serve_app.tools.egress import Resolver
from serve_app.tools.mcp_client import ConnectPolicy, ConnectRefused, McpConnection, McpLimits, McpUnavailable


@dataclass(frozen=True, slots=True)
class ToolReply:
    result: mcp_types.CallToolResult
    route: str | None = None  # the replica that answered: calls on the same state go there (None: anywhere)


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """One MCP tool call to an embedded tool's Serve deployment (`params`: the
    `CallToolRequestParams` as JSON); Serve's router reads `route` (deployments/tools.py). It lives
    apart from the router's module: defined beside the router, the arguments the router was
    given were not instances of it (as the engine router's `GenerationRequest` lives apart)."""

    params: dict[str, Any]
    route: str | None = None  # the replica holding the call's state: the call goes there


class ToolTransport(Protocol):
    """One response's way to a built-in tool."""

    async def call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any], route: str | None) -> ToolReply:
        """Call the tool's MCP tool `name`; `route`: where an earlier call on the same state went.
        Raises `ToolUnavailable` when the tool cannot be reached."""
        ...

    async def aclose(self) -> None: ...


TransportFactory = Callable[[], ToolTransport]  # a transport for each response


class ToolUnavailable(Exception):
    """The tool could not be reached (or broke the protocol); the message is for the model and client."""


class ConfiguredServer(ConnectPolicy):
    """The operator's tool server: its host and port are reached whatever the host resolves to
    (an in-cluster Service has a private address), and nothing else is."""

    def __init__(self, url: str, resolver: Resolver | None = None) -> None:
        super().__init__([], resolver)
        parts = urllib.parse.urlsplit(url)
        self.host = (parts.hostname or "").lower()
        self.port = parts.port or (443 if parts.scheme == "https" else 80)

    def check(self, url: str) -> Any:
        raise ValueError("only the configured tool server is reached")

    def check_redirect(self, url: str) -> None:
        """Any: the SDK follows a redirect within the origin only, and `address` reaches no other host."""

    async def address(self, host: str, port: int) -> str:
        if host.lower().strip("[]") != self.host.strip("[]") or port != self.port:
            raise ConnectRefused(f"'{host}:{port}' is not the configured tool server")
        if (literal := ip_literal(host)) is not None:
            return str(literal)
        addresses: Sequence[IPAddress] = await self.resolver(host, port)
        if not addresses:
            raise ConnectRefused(f"cannot resolve '{host}'")
        return str(addresses[0])


class McpTransport:
    """A standalone tool server (`responses-serve tool python|browser`) at `url`, over MCP's
    streamable HTTP with the official SDK's client; connected on the response's first call."""

    def __init__(self, url: str, limits: McpLimits, resolver: Resolver | None = None) -> None:
        self.url = url
        self._connection = McpConnection(url, {}, ConfiguredServer(url, resolver), limits)

    async def call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any], route: str | None) -> ToolReply:
        try:
            return ToolReply(await self._connection.call_tool(name, arguments, meta))
        except McpUnavailable as exc:
            raise ToolUnavailable(exc.error.message) from None

    async def aclose(self) -> None:
        self._connection.close()

"""Connections to MCP servers, with the official `mcp` SDK's client and this server's rules.

Every connection the SDK opens (the streamable HTTP POSTs and GET stream, SSE's stream and
message POSTs, a session's DELETE) goes through `GuardedTransport`: its host is resolved
here, every address it resolves to is checked (`ConnectPolicy.address`), and the socket is
opened to the checked address — so a name that resolves differently a moment later (DNS
rebinding) cannot lead anywhere else. Proxies from the environment are not used. The SDK
follows a redirect only within the endpoint's origin, so headers never leave it, and only
to a URL `allowed_urls` lets a request name (`GuardedTransport`). Every
operation has a timeout; a server's response body is capped in bytes.

The SDK's client holds anyio task groups that must be entered and left by one task, while a
response's calls come from the tool loop at different times: `McpConnection` keeps the
client in a task of its own for the response's lifetime; calls are made from the loop's task.
When the response is over, that task ends the session by itself: the response does not wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import ssl
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpcore2
import httpx2
import mcp_types
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from serve_app.api.url_patterns import IPAddress, TargetUrl, UrlPattern, ip_literal, parse_target
from serve_app.core.tool_items import ToolError
from serve_app.core.utf8 import cap_text
from serve_app.tools.egress import Resolver, refusal_reason, system_resolver

logger = logging.getLogger(__name__)

CLIENT_INFO = mcp_types.Implementation(name="responses-serve", version="0.1.0")
MAX_LIST_PAGES = 10  # tools/list pages followed (a server whose cursor never ends cannot hang a response)
MAX_TOOLS = 256  # tools of one server offered to the model
FRAMING_BYTES = 64 * 1024  # room for JSON-RPC framing around a tool's output in one message
IDLE_READ_TIMEOUT_S = 3600.0  # a server's event stream may be quiet between calls; the response ends it
CLOSE_TIMEOUT_S = 5.0  # ending a session (the SDK's DELETE) after the response is over
_LIVE: set[asyncio.Task[None]] = set()  # connections' tasks until they end


class ConnectRefused(Exception):
    """The policy refuses a connection; the message says why (it goes to the client)."""


class McpUnavailable(Exception):
    """An MCP operation failed; `error` says how, in the SDK's terms."""

    def __init__(self, error: ToolError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True, slots=True)
class McpLimits:
    connect_timeout_s: float = 10.0
    call_timeout_s: float = 60.0
    max_output_bytes: int = 1024 * 1024


class ConnectPolicy:
    """Which MCP servers a request may name (`allowed_urls`), and where their connections go.

    A URL must match an allowed pattern. Every address its host resolves to must be public,
    unless an allowed pattern names that address literally, and then only on that pattern's
    port (an operator's internal server: `http://10.0.0.5:8080/*` opens 10.0.0.5:8080, not
    10.0.0.5's other ports to a name that resolves there); loopback, link-local (cloud
    metadata), private, shared and reserved addresses are refused otherwise."""

    def __init__(self, allowed_urls: Iterable[str], resolver: Resolver | None = None, resolve_timeout_s: float = 5.0) -> None:
        self.patterns = [UrlPattern.parse(pattern) for pattern in allowed_urls]
        # (address, port) a pattern names literally; port None: any port.
        self.named_addresses = {(address, pattern.port) for pattern in self.patterns if (address := pattern.address) is not None}
        self.resolver: Resolver = resolver or system_resolver
        self.resolve_timeout_s = resolve_timeout_s

    def check(self, url: str) -> TargetUrl:
        """`url` if a request may name it (no name is resolved: that is done per connection);
        `ValueError` saying why not."""
        target = parse_target(url)
        if not any(pattern.matches(target) for pattern in self.patterns):
            if not self.patterns:
                raise ValueError("this server runs no MCP servers named by requests (an operator allows them with tools.mcp.allowed_urls)")
            raise ValueError("the URL is not one this server's allowed_urls let requests name")
        if (address := target.address) is not None:
            try:
                self._check_address(target.host, address, target.port)
            except ConnectRefused as exc:
                raise ValueError(str(exc)) from None
        return target

    def check_redirect(self, url: str) -> None:
        """Whether the client may follow a redirect to `url` (the SDK follows one within the
        origin only): to a URL a request may name; `ValueError` if not."""
        self.check(url)

    async def address(self, host: str, port: int) -> str:
        """The checked address to open a connection to `host` on; `ConnectRefused` if none."""
        literal = ip_literal(host)
        if literal is not None:
            addresses: Sequence[IPAddress] = [literal]
        else:
            try:
                async with asyncio.timeout(self.resolve_timeout_s):
                    addresses = await self.resolver(host, port)
            except (OSError, TimeoutError, UnicodeError) as exc:
                raise ConnectRefused(f"cannot resolve '{host}': {exc or type(exc).__name__}") from None
            if not addresses:
                raise ConnectRefused(f"cannot resolve '{host}'")
        for address in addresses:  # every one: a resolver's order is not ours to trust
            self._check_address(host, address, port)
        return str(addresses[0])

    def _check_address(self, host: str, address: IPAddress, port: int) -> None:
        if (address, port) in self.named_addresses or (address, None) in self.named_addresses:
            return
        if reason := refusal_reason(address):  # the egress policy's rules for what is not public
            raise ConnectRefused(f"'{host}' is {reason} ({address}), which no allowed_urls pattern names")


class _GuardedBackend(httpcore2.AsyncNetworkBackend):
    """Opens every TCP connection to an address the policy checked for the host."""

    def __init__(self, policy: ConnectPolicy) -> None:
        self._policy = policy
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(  # httpcore's interface
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> Any:
        try:
            address = await self._policy.address(host, port)
        except ConnectRefused as exc:
            raise httpcore2.ConnectError(str(exc)) from exc
        return await self._inner.connect_tcp(address, port, timeout=timeout, local_address=local_address, socket_options=socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:  # noqa: ASYNC109
        raise httpcore2.ConnectError("unix sockets are not used for MCP servers")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _CappedBody(httpx2.AsyncByteStream):
    def __init__(self, stream: httpx2.AsyncByteStream, max_bytes: int) -> None:
        self._stream, self._max_bytes = stream, max_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._stream:
            size += len(chunk)
            if size > self._max_bytes:
                raise httpx2.ReadError(f"the MCP server's response is larger than {self._max_bytes} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One client TLS context for every connection: loading the CA bundle takes ~50 ms of the
    event loop, too long to pay per response."""
    return httpx2.create_ssl_context(trust_env=False)


class GuardedTransport(httpx2.AsyncHTTPTransport):
    """httpx2's transport, with connections only to checked addresses (`_GuardedBackend`),
    no proxies from the environment, no redirect to a URL that `allowed_urls` does not let a
    request name (the SDK follows one within the origin, whatever its path), and a cap on
    each response body that is not an event stream (the SDK caps each event of those:
    `max_sse_event_size`)."""

    def __init__(self, policy: ConnectPolicy, max_response_bytes: int) -> None:
        super().__init__(verify=_ssl_context(), trust_env=False)
        self._pool = httpcore2.AsyncConnectionPool(ssl_context=_ssl_context(), max_connections=8, network_backend=_GuardedBackend(policy))
        self._policy = policy
        self._max_response_bytes = max_response_bytes

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        if response.has_redirect_location:
            location = request.url.join(response.headers["location"])
            try:
                self._policy.check_redirect(str(location))
            except ValueError as exc:
                await response.aclose()
                refused = ConnectRefused(f"the MCP server redirected to {str(location)[:200]}: {exc}")
                raise httpx2.ConnectError(str(refused), request=request) from refused
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            response.stream = _CappedBody(response.stream, self._max_response_bytes)
        return response


class McpConnection:
    """One MCP server, for one response: connected on first use (streamable HTTP, else SSE),
    closed with `aclose()`. Operations raise `McpUnavailable`."""

    def __init__(self, url: str, headers: dict[str, str], policy: ConnectPolicy, limits: McpLimits) -> None:
        self.url = url
        # What the logs name: a URL's user info, path and query may hold a key, as headers do.
        self.origin = _origin(url)
        _keep_urls_out_of_library_logs()
        self._headers = headers  # secrets: sent to this server only, never logged
        self._policy = policy
        self.limits = limits
        self._client: asyncio.Future[Client] | None = None
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _http_client(
        self, headers: dict[str, Any] | None = None, timeout: httpx2.Timeout | None = None, auth: Any = None
    ) -> httpx2.AsyncClient:
        limits = self.limits
        return httpx2.AsyncClient(
            headers={**(headers or {}), **self._headers},
            # Reads wait as long as a stream may be quiet: each operation has its own timeout.
            timeout=httpx2.Timeout(limits.connect_timeout_s, read=IDLE_READ_TIMEOUT_S),
            transport=GuardedTransport(self._policy, limits.max_output_bytes + FRAMING_BYTES),
            trust_env=False,
        )

    async def _connect(self) -> Client:
        if self._client is None:
            self._client = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._hold(self._client), name=f"mcp {self.origin}")
            _LIVE.add(self._task)  # asyncio holds tasks weakly: this one outlives the response
            self._task.add_done_callback(_LIVE.discard)
        return await asyncio.shield(self._client)

    async def _hold(self, connected: asyncio.Future[Client]) -> None:
        """The client's task: connect, hand the client over, wait for `aclose()`, end the
        session (at most `CLOSE_TIMEOUT_S`: a server slow to answer its end is left)."""
        limits = self.limits
        deadline = asyncio.get_running_loop().time() + limits.connect_timeout_s
        failure: ToolError | None = None
        for transport in ("streamable_http", "sse"):
            stack = contextlib.AsyncExitStack()
            try:
                async with asyncio.timeout_at(deadline):
                    if transport == "streamable_http":
                        http = await stack.enter_async_context(self._http_client())
                        streams = streamable_http_client(
                            self.url, http_client=http, max_sse_event_size=limits.max_output_bytes + FRAMING_BYTES
                        )
                    else:
                        streams = sse_client(
                            self.url,
                            timeout=limits.connect_timeout_s,
                            sse_read_timeout=IDLE_READ_TIMEOUT_S,
                            httpx_client_factory=self._http_client,
                        )
                    client = await stack.enter_async_context(Client(streams, client_info=CLIENT_INFO, cache=None))
                connected.set_result(client)
                await self._closing.wait()
                return
            except asyncio.CancelledError:
                if not connected.done():
                    connected.set_exception(
                        McpUnavailable(ToolError("mcp_protocol_error", "the connection was closed", mcp_types.CONNECTION_CLOSED))
                    )
                raise
            except BaseException as exc:  # the SDK raises exception groups of its task groups
                if connected.done():  # the connection broke after it was made: calls see it
                    logger.info("MCP server %s: connection ended: %s", self.origin, _describe(exc))
                    return
                failure = tool_error(exc, limits.connect_timeout_s)
                if not _protocol_failure(exc):  # unreachable, refused or slow: SSE would not do better
                    break
            finally:
                try:
                    async with asyncio.timeout(CLOSE_TIMEOUT_S):
                        await stack.aclose()
                except BaseException as exc:  # what ending it raised changes nothing now
                    logger.debug("MCP server %s: closing: %s", self.origin, _describe(exc))
        assert failure is not None
        connected.set_exception(McpUnavailable(failure))

    async def list_tools(self) -> list[mcp_types.Tool]:
        """The server's tools (at most `MAX_TOOLS`, at most `max_output_bytes` of them), within
        the connect timeout."""
        try:
            async with asyncio.timeout(self.limits.connect_timeout_s):
                client = await self._connect()
                tools: list[mcp_types.Tool] = []
                cursor: str | None = None
                size = 0  # the listing is kept in the response and every later turn's history
                for _ in range(MAX_LIST_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    for tool in page.tools:
                        size += len(tool.model_dump_json())
                        if size > self.limits.max_output_bytes or len(tools) >= MAX_TOOLS:
                            logger.info("MCP server %s: listing cut at %d tools", self.origin, len(tools))
                            return tools
                        tools.append(tool)
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except McpUnavailable:
            raise
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise McpUnavailable(tool_error(exc, self.limits.connect_timeout_s)) from None
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None) -> mcp_types.CallToolResult:
        """Call a tool, within the call timeout (connecting first if needed)."""
        try:
            async with asyncio.timeout(self.limits.call_timeout_s):
                client = await self._connect()
                # The request itself, not `Client.call_tool`: that validates a result against the
                # tool's output schema, a hostile server's schema (a regex that backtracks for
                # minutes would hold this event loop), after listing the tools again to find it.
                request = mcp_types.CallToolRequest(params=mcp_types.CallToolRequestParams(name=name, arguments=arguments, _meta=meta))
                return await client.session.send_request(request, mcp_types.CallToolResult)
        except McpUnavailable:
            raise
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise McpUnavailable(tool_error(exc, self.limits.call_timeout_s)) from None

    def close(self) -> None:
        """The response is over: the connection's task ends its session on its own (the
        response does not wait for a server to acknowledge that)."""
        self._closing.set()
        if self._client is not None and not self._client.done():
            assert self._task is not None
            self._task.cancel()  # still connecting: nobody will use it


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _protocol_failure(exc: BaseException) -> bool:
    """The server answered, but not as a streamable HTTP endpoint (an SSE-only server)."""
    return any(isinstance(leaf, (MCPError, httpx2.HTTPStatusError)) for leaf in _leaves(exc))


_URL = re.compile(r"""(?i)\b(?:https?|wss?)://[^\s'"<>]+""")


def _origin(url: str) -> str:
    """scheme://host[:port] of a URL, nothing else of it."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


class _UrlsToOrigins(logging.Filter):
    """Cuts every URL of a library's log record to its origin: httpx logs each request's
    whole URL, the mcp SDK the endpoint it connects to."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "://" in message:
            record.msg, record.args = _URL.sub(lambda match: _origin(match.group()), message), ()
        return True


# The loggers that name a request's server_url (a filter acts on its own logger's records only).
_URL_LOGGERS = ("httpx2", "mcp.client.streamable_http", "mcp.client.sse")


@functools.cache
def _keep_urls_out_of_library_logs() -> None:
    for name in _URL_LOGGERS:
        logging.getLogger(name).addFilter(_UrlsToOrigins())


def _describe(exc: BaseException) -> str:
    """An exception in words for the logs, with any URL in it cut to its origin (httpx names
    the whole URL it failed on)."""
    text = "; ".join(f"{type(leaf).__name__}: {leaf}" for leaf in _leaves(exc))
    return _URL.sub(lambda match: _origin(match.group()), text)[:500]


def tool_error(exc: BaseException, timeout_s: float) -> ToolError:
    """An exception of an MCP operation as the SDK's error kinds, in words for the client."""
    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, TimeoutError):
            return ToolError("mcp_protocol_error", f"The MCP server did not answer within {timeout_s:g} s.", mcp_types.REQUEST_TIMEOUT)
        if isinstance(leaf, httpx2.HTTPStatusError):
            status = leaf.response.status_code
            return ToolError("http_error", f"The MCP server answered HTTP {status}.", status)
        if isinstance(leaf, MCPError):
            return ToolError("mcp_protocol_error", f"The MCP server returned an error: {leaf.error.message}", leaf.code)
    for leaf in leaves:
        cause: BaseException | None = leaf
        while cause is not None:
            if isinstance(cause, ConnectRefused):
                return ToolError("mcp_protocol_error", f"Refused to connect: {cause}", mcp_types.CONNECTION_CLOSED)
            cause = cause.__cause__ or cause.__context__
        if isinstance(leaf, (httpx2.TransportError, OSError)):
            return ToolError("mcp_protocol_error", f"Could not reach the MCP server: {leaf}", mcp_types.CONNECTION_CLOSED)
    logger.info("MCP operation failed: %s", _describe(exc))
    return ToolError("mcp_protocol_error", "The MCP server could not be used (the connection failed).", mcp_types.CONNECTION_CLOSED)


def result_text(result: mcp_types.CallToolResult, max_bytes: int) -> str:
    """What a tool returned, as the text the model reads (and `mcp_call.output`): its text
    content, other content named, else its structured content as JSON; cut at `max_bytes`."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.EmbeddedResource) and isinstance(block.resource, mcp_types.TextResourceContents):
            parts.append(block.resource.text)
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource: {block.uri}]")
        else:
            parts.append(f"[{block.type} content: {getattr(block, 'mime_type', '') or 'not shown'}]")
    text = "\n".join(parts)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    return cap_text(text, max_bytes)

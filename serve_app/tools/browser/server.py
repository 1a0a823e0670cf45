"""The browser as an MCP server (official `mcp` SDK, streamable HTTP at `/mcp`).

Its tools are harmony's `browser` functions with harmony's own descriptions and parameter
schemas (`search`, `open`, `find`); its instructions are the namespace description gpt-oss
expects in its system message. State (the pages and cursors of one response) is kept per
browsing session, keyed by the call's `_meta["responses_serve/session_id"]` (the tool loop
passes one per response), else by the MCP transport session; a call with neither browses in
a session of its own. Sessions are bounded in number and expire after a time unused.

Each result's content is the text the model reads; its `_meta["responses_serve/browser"]`
carries what the tool loop needs: the `web_search_call` action, the sources (url, title),
the cursor shown, and every citable cursor of the session (`pages`), for turning the
answer's `【cursor†Lx-Ly】` into `url_citation` annotations. The request's
`filters.allowed_domains` comes in `_meta["responses_serve/allowed_domains"]` (never from
the model's arguments) and applies to search results and every page shown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import cachetools
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server

from serve_app.tools.asgi import ASGIApp
from serve_app.tools.browser import page
from serve_app.tools.browser.browser import Browser, BrowserSession, Outcome, memory_full
from serve_app.tools.browser.meta import ALLOWED_DOMAINS_META_KEY, RESULT_META_KEY, SESSION_META_KEY, cited_pages
from serve_app.tools.browser.page import ToolUsageError
from serve_app.tools.browser.policy import normalize_domains

__all__ = ["ALLOWED_DOMAINS_META_KEY", "RESULT_META_KEY", "SESSION_META_KEY", "call_browser", "cited_pages", "create_app"]

MAX_SESSION_ID_CHARS = 256
MAX_ALLOWED_DOMAINS = 100


NEW_SESSION_BYTES = 1024 * 1024  # the room a new session needs (about one page)


class SessionStore:
    """Browsing sessions by key: at most `max_sessions` (least recently used go first), each
    dropped `ttl_s` after its last call, and all their pages within `memory_budget_bytes`
    (None: no budget; the server's memory limit less what it needs besides, docs/tools-browser.md):
    a new session is refused while the budget has less than `NEW_SESSION_BYTES` left, and a
    page that does not fit is refused (the session's own oldest pages go first if that makes
    room), each a tool error the model reads."""

    def __init__(
        self,
        browser: Browser,
        max_sessions: int = 1024,
        ttl_s: float = 1800.0,
        timer: Callable[[], float] = time.monotonic,
        memory_budget_bytes: int | None = None,
    ) -> None:
        self._browser = browser
        self._sessions: cachetools.TTLCache[str, BrowserSession] = cachetools.TTLCache(maxsize=max_sessions, ttl=ttl_s, timer=timer)
        self.max_bytes = memory_budget_bytes if memory_budget_bytes is not None else 0
        self._budget = self if memory_budget_bytes is not None else None

    def __len__(self) -> int:
        return len(self._sessions)

    def room(self) -> int:
        """`MemoryBudget.room`: the budget less what the kept sessions' pages hold."""
        self._sessions.expire()
        return self.max_bytes - sum(session.bytes for session in self._sessions.values())

    def get(self, key: str | None) -> BrowserSession:
        """The session of `key` (None: one of its own, not kept), or `ToolUsageError` for a
        new one the memory budget has no room for."""
        session = self._sessions.get(key) if key is not None else None
        if session is None:
            if self._budget is not None and self.room() < NEW_SESSION_BYTES:
                raise memory_full(self._budget)
            session = BrowserSession(self._browser.limits, self._budget)
        if key is not None:
            self._sessions[key] = session  # set again: the time to live counts from this call
        return session


class BadCall(Exception):
    """A call whose `_meta` the server cannot use (the caller's mistake, not the model's)."""


def _session_key(meta: dict[str, Any], transport_id: str | None) -> str | None:
    key = meta.get(SESSION_META_KEY)
    if key is not None:
        if not isinstance(key, str) or not key or len(key) > MAX_SESSION_ID_CHARS:
            raise BadCall(f"_meta[{SESSION_META_KEY!r}] must be a string of 1 to {MAX_SESSION_ID_CHARS} characters")
        return "meta:" + key
    return "transport:" + transport_id if transport_id else None


def _transport_session(ctx: ServerRequestContext[Any, Any]) -> str | None:
    request = ctx.request
    return request.headers.get("mcp-session-id") if request is not None and hasattr(request, "headers") else None


def _allowed_domains(meta: dict[str, Any]) -> tuple[str, ...] | None:
    domains = meta.get(ALLOWED_DOMAINS_META_KEY)
    if domains is None:
        return None
    if (
        not isinstance(domains, list)
        or len(domains) > MAX_ALLOWED_DOMAINS
        or not all(isinstance(d, str) and len(d) <= 253 for d in domains)
    ):
        raise BadCall(f"_meta[{ALLOWED_DOMAINS_META_KEY!r}] must be a list of at most {MAX_ALLOWED_DOMAINS} domain names")
    try:
        return normalize_domains(domains)
    except UnicodeError:
        raise BadCall(f"_meta[{ALLOWED_DOMAINS_META_KEY!r}] holds a name that is not a domain") from None


def result_meta(outcome: Outcome, session: BrowserSession) -> dict[str, Any]:
    return {
        "action": outcome.action,
        "sources": [{"url": s.url, "title": s.title} for s in outcome.sources],
        "cursor": outcome.cursor,
        "truncated": outcome.truncated,
        "pages": {str(cursor): {"url": page.url, "title": page.title} for cursor, page in session.citable().items()},
    }


async def call(browser: Browser, session: BrowserSession, name: str, arguments: dict[str, Any], allowed: tuple[str, ...] | None) -> Outcome:
    """One browser function with the model's arguments (unknown ones, like `source`, ignored)."""
    if name == "search":
        return await browser.search(session, arguments.get("query"), arguments.get("topn", 10), allowed_domains=allowed)
    if name == "open":
        keys = ("id", "cursor", "loc", "num_lines")
        given = {key: arguments[key] for key in keys if key in arguments}
        return await browser.open(session, **given, view_source=arguments.get("view_source") is True, allowed_domains=allowed)
    return await browser.find(session, arguments.get("pattern"), arguments.get("cursor", -1), allowed_domains=allowed)


def mcp_tools() -> list[types.Tool]:
    """The browser's functions as MCP tools, with harmony's descriptions and parameters."""
    return [
        types.Tool(name=tool.name, description=tool.description, input_schema=tool.parameters or {"type": "object"})
        for tool in Browser.namespace().tools
    ]


async def call_browser(
    browser: Browser, sessions: SessionStore, params: types.CallToolRequestParams, transport_session: str | None = None
) -> types.CallToolResult:
    """One call of a browser function, whatever carried it (this MCP server, a Serve
    deployment of the app, the app's own process); `transport_session`: the MCP session's
    id, the session key of a call without one in its `_meta`."""

    def failed(message: str) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)

    if params.name not in _NAMES:
        return failed(f"Unknown function: {params.name[:100]}")
    meta = dict(params.meta or {})
    try:
        key, allowed = _session_key(meta, transport_session), _allowed_domains(meta)
    except BadCall as exc:
        return failed(str(exc))
    try:
        session = sessions.get(key)
    except ToolUsageError as exc:  # no room for a new session: the model reads why
        return failed(str(exc))
    async with session.lock:
        outcome = await call(browser, session, params.name, dict(params.arguments or {}), allowed)
        meta_out = result_meta(outcome, session)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=outcome.text)], is_error=outcome.is_error, _meta={RESULT_META_KEY: meta_out}
    )


_NAMES = frozenset(tool.name for tool in Browser.namespace().tools)


def create_server(browser: Browser, sessions: SessionStore) -> Server[Any]:
    namespace = Browser.namespace()
    tools = mcp_tools()

    async def list_tools(ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        return await call_browser(browser, sessions, params, _transport_session(ctx))

    return Server(
        "responses-serve-browser",
        instructions=namespace.description,
        get_tool_input_schema=lambda name: next((t.input_schema for t in tools if t.name == name), None),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def create_app(
    browser: Browser,
    *,
    host: str = "127.0.0.1",
    max_sessions: int = 1024,
    session_ttl_s: float = 1800.0,
    memory_budget_bytes: int | None = None,
) -> ASGIApp:
    """The ASGI app: the MCP endpoint at `/mcp` (run its lifespan: uvicorn does)."""
    page.warm_up()  # the view's tokenizer, loaded now rather than in the first call
    sessions = SessionStore(browser, max_sessions=max_sessions, ttl_s=session_ttl_s, memory_budget_bytes=memory_budget_bytes)
    server = create_server(browser, sessions)
    return server.streamable_http_app(streamable_http_path="/mcp", host=host, max_sessions=max_sessions, session_idle_timeout=session_ttl_s)

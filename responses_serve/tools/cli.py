"""`responses-serve tool ...`: the built-in tools as MCP servers of their own.

Until the main command mounts it, run it as `python -m responses_serve.tools browser ...`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Annotated

import typer

tool_app = typer.Typer(name="tool", help="Run a built-in tool as an MCP server (streamable HTTP at /mcp).", no_args_is_help=True)


@tool_app.callback()
def tools() -> None:
    """Each command serves one tool (a group even while it has one command)."""


class SearchBackendName(enum.StrEnum):
    searxng = "searxng"
    tavily = "tavily"


@tool_app.command()
def browser(
    search_url: Annotated[
        str | None, typer.Option(help="The search service: a SearXNG base URL (required for searxng); for tavily, its API base URL.")
    ] = None,
    search_backend: Annotated[
        SearchBackendName, typer.Option(help="searxng (self-hosted JSON API) or tavily (hosted).")
    ] = SearchBackendName.searxng,
    search_api_key_env: Annotated[
        str | None, typer.Option(help="The environment variable holding the hosted API's key (tavily: TAVILY_API_KEY).")
    ] = None,
    allow_hosts: Annotated[
        str, typer.Option(help="Comma-separated host names, IP addresses and networks (CIDR) the browser may open although not public.")
    ] = "",
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0 in a container).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8090,
    fetch_timeout_s: Annotated[float, typer.Option(help="Time for one page fetch, redirects and DNS included.")] = 15.0,
    max_page_bytes: Annotated[int, typer.Option(help="Bytes read of one page; the rest is not read.")] = 1024 * 1024,
    max_redirects: Annotated[int, typer.Option(help="Redirects followed for one page.")] = 5,
    search_timeout_s: Annotated[float, typer.Option(help="Time for one search request.")] = 15.0,
    max_search_results: Annotated[int, typer.Option(help="Results one search shows at most.")] = 20,
    view_tokens: Annotated[int, typer.Option(help="Tokens of page text in one view (gpt-oss's browser: 1024).")] = 1024,
    max_pages: Annotated[int, typer.Option(help="Pages (cursors) one browsing session may open.")] = 100,
    max_session_bytes: Annotated[int, typer.Option(help="Page text one session keeps (the oldest pages go first).")] = 32 * 1024 * 1024,
    max_sessions: Annotated[int, typer.Option(help="Browsing sessions kept (the least recently used go first).")] = 1024,
    session_ttl_s: Annotated[float, typer.Option(help="A session is dropped this long after its last call.")] = 1800.0,
) -> None:
    """gpt-oss's browser (`web_search`): search, open and find, under the fetch policy."""
    import uvicorn

    from responses_serve.tools.browser.backends import SearchBackend, SearxngBackend, TavilyBackend, api_key_from_env
    from responses_serve.tools.browser.browser import Browser, BrowserLimits
    from responses_serve.tools.browser.fetch import Fetcher, FetchLimits
    from responses_serve.tools.browser.policy import FetchPolicy, HostRules
    from responses_serve.tools.browser.server import create_app

    try:
        rules = HostRules(allow_hosts.split(","))
        backend: SearchBackend
        if search_backend is SearchBackendName.searxng:
            if not search_url:
                raise ValueError("--search-url is required with the searxng backend")
            backend = SearxngBackend(search_url, timeout_s=search_timeout_s)
        else:
            key = api_key_from_env(search_api_key_env or TavilyBackend.DEFAULT_KEY_ENV)
            backend = TavilyBackend(key, base_url=search_url or TavilyBackend.DEFAULT_URL, timeout_s=search_timeout_s)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None

    fetcher = Fetcher(FetchPolicy(rules), FetchLimits(max_bytes=max_page_bytes, timeout_s=fetch_timeout_s, max_redirects=max_redirects))
    limits = BrowserLimits(
        view_tokens=view_tokens, max_search_results=max_search_results, max_pages=max_pages, max_session_bytes=max_session_bytes
    )
    app = create_app(Browser(backend, fetcher, limits), host=host, max_sessions=max_sessions, session_ttl_s=session_ttl_s)
    logging.basicConfig(level=logging.INFO)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info"))
    try:
        asyncio.run(server.serve())
    finally:
        asyncio.run(backend.aclose())

"""`responses-serve tool ...`: the built-in tools as MCP servers of their own.

Mounted by the main command (serve_app/cli/); also `python -m serve_app.cli.tools browser|python ...`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Annotated, Any

import typer

from serve_app.config import ContainerLimits, SandboxLimits

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
    max_session_bytes: Annotated[int, typer.Option(help="Memory the pages one session keeps may hold (the oldest pages go first).")] = 32
    * 1024
    * 1024,
    max_sessions: Annotated[int, typer.Option(help="Browsing sessions kept (the least recently used go first).")] = 1024,
    session_ttl_s: Annotated[float, typer.Option(help="A session is dropped this long after its last call.")] = 1800.0,
    memory_budget_mb: Annotated[
        int, typer.Option(help="Memory the pages of all sessions may hold together: the server's memory limit less 1 GiB.")
    ] = 3072,
) -> None:
    """gpt-oss's browser (`web_search`): search, open and find, under the fetch policy."""
    import uvicorn
    from pydantic import ValidationError

    from serve_app.config import EmbeddedBrowserConfig, config_problems
    from serve_app.tools.browser.server import create_app
    from serve_app.tools.builtin.embedded import make_browser

    options = {
        "search_url": search_url,
        "search_backend": search_backend.value,
        "search_api_key_env": search_api_key_env,
        "allow_hosts": [host for host in allow_hosts.split(",") if host.strip()],
        "fetch_timeout_s": fetch_timeout_s,
        "max_page_bytes": max_page_bytes,
        "max_redirects": max_redirects,
        "search_timeout_s": search_timeout_s,
        "max_search_results": max_search_results,
        "view_tokens": view_tokens,
        "max_pages": max_pages,
        "max_session_bytes": max_session_bytes,
        "max_sessions": max_sessions,
        "session_ttl_s": session_ttl_s,
        "memory_budget_mb": memory_budget_mb,
    }
    try:
        config = EmbeddedBrowserConfig.model_validate(options)
        embedded = make_browser(config)
    except ValidationError as exc:
        problems = config_problems(exc, options)
        raise typer.BadParameter(
            "; ".join(f"--{path.replace('_', '-')}: {message}" if path else message for path, message in problems)
        ) from None
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    app = create_app(
        embedded.browser,
        host=host,
        max_sessions=max_sessions,
        session_ttl_s=session_ttl_s,
        memory_budget_bytes=config.memory_budget_bytes,
    )
    logging.basicConfig(level=logging.INFO)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info"))
    try:
        asyncio.run(server.serve())
    finally:
        asyncio.run(embedded.aclose())


def _default(name: str) -> Any:
    """The limit's default from its model, so the CLI and the models agree."""
    fields = {**SandboxLimits.model_fields, **ContainerLimits.model_fields}
    return fields[name].default


@tool_app.command("python")
def python(
    host: Annotated[str, typer.Option(help="address to listen on (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8080,
    timeout_s: Annotated[float, typer.Option(help="wall-clock seconds of one call")] = _default("timeout_s"),
    memory_mb: Annotated[int, typer.Option(help="MiB: address space of each process, and memory of all together")] = _default("memory_mb"),
    cpu_s: Annotated[int, typer.Option(help="CPU seconds of each sandbox process over its life")] = _default("cpu_s"),
    max_processes: Annotated[int, typer.Option(help="processes and threads of one sandbox")] = _default("max_processes"),
    max_open_files: Annotated[int, typer.Option(help="open files of each sandbox process")] = _default("max_open_files"),
    max_file_mb: Annotated[int, typer.Option(help="size of one written file, MiB")] = _default("max_file_mb"),
    disk_mb: Annotated[int, typer.Option(help="size of each tmpfs of a sandbox (/mnt/data, /tmp, /dev/shm), MiB")] = _default("disk_mb"),
    max_output_bytes: Annotated[int, typer.Option(help="output of one call returned; the rest is dropped")] = _default("max_output_bytes"),
    memory_budget_mb: Annotated[
        int, typer.Option(help="MiB the sandboxes hold together: memory_budget_mb // (memory_mb + 3 × disk_mb) containers")
    ] = _default("memory_budget_mb"),
    ttl_s: Annotated[float, typer.Option(help="seconds after its last use a container is removed")] = _default("ttl_s"),
    python_path: Annotated[str | None, typer.Option("--python", help="the Python the sandbox runs (default: this one)")] = None,
    sandbox_uid: Annotated[int, typer.Option(help="host uid of the sandboxes when the server runs as root")] = 65534,
    seccomp: Annotated[bool, typer.Option(help="load the seccomp filter (needs libseccomp)")] = True,
) -> None:
    """gpt-oss's python tool: a stateful, sandboxed interpreter per container, at http://HOST:PORT/mcp."""
    import uvicorn

    from serve_app.tools.python.containers import ContainerManager
    from serve_app.tools.python.mcp_server import mcp_app
    from serve_app.tools.python.sandbox import SandboxError, self_test

    limits = SandboxLimits(
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        cpu_s=cpu_s,
        max_processes=max_processes,
        max_open_files=max_open_files,
        max_file_mb=max_file_mb,
        disk_mb=disk_mb,
        max_output_bytes=max_output_bytes,
    )
    container_limits = ContainerLimits(memory_budget_mb=memory_budget_mb, ttl_s=ttl_s)
    logging.basicConfig(level=logging.INFO)

    async def serve() -> None:
        manager = await ContainerManager.create(limits, container_limits, python=python_path, seccomp=seccomp, sandbox_uid=sandbox_uid)
        await self_test(manager.runtime, limits)
        async with manager:
            server = uvicorn.Server(uvicorn.Config(mcp_app(manager, host=host), host=host, port=port, log_level="info"))
            await server.serve()

    try:
        asyncio.run(serve())
    except SandboxError as error:
        typer.echo(f"python tool: {error}", err=True)
        raise typer.Exit(1) from None


if __name__ == "__main__":  # python -m serve_app.cli.tools browser|python ...
    tool_app()

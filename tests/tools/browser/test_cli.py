"""`python -m serve_app.cli.tools browser ...` serves the browser over MCP; a hosted API's
key reaches the API and nothing else (not the output, not the logs)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from mcp import Client

from serve_app.tools.browser.server import RESULT_META_KEY, SESSION_META_KEY
from tests.support.servers import free_port
from tests.tools.browser.web import TAVILY_KEY, Web, running_web


@pytest.fixture(scope="module")
def web() -> Iterator[Web]:
    with running_web() as web:
        yield web


@contextmanager
def browser_process(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    command = [sys.executable, "-m", "serve_app.cli.tools", "browser", "--port", str(port), *args]
    process = subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the browser server did not start:\n" + (process.stdout.read() if process.stdout else "")) from None
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.slow
def test_the_command_serves_search_and_open(web: Web) -> None:
    web.results = [{"url": web.url("/pages/channels"), "title": "Channels", "content": "three"}]

    async def go(url: str):
        async with Client(url) as client:
            meta = {SESSION_META_KEY: "cli"}
            await client.call_tool("search", {"query": "channels"}, meta=meta)
            return await client.call_tool("open", {"id": 0}, meta=meta)

    with browser_process("--search-url", web.base, "--allow-hosts", "127.0.0.1") as (url, _):
        opened = asyncio.run(go(url))
    assert not opened.is_error, opened.content[0].text
    assert opened.content[0].text.startswith(f"[1] Channels ({web.url('/pages/channels')})")
    assert opened.meta[RESULT_META_KEY]["pages"]["1"]["title"] == "Channels"


@pytest.mark.slow
def test_the_tavily_key_comes_from_the_environment_and_is_never_printed(web: Web) -> None:
    web.results = [{"url": "https://a.example/", "title": "A", "content": "a"}]

    async def go(url: str):
        async with Client(url) as client:
            return await client.call_tool("search", {"query": "a"})

    args = ("--search-backend", "tavily", "--search-url", web.url("/tavily"), "--search-api-key-env", "MY_SEARCH_KEY")
    with browser_process(*args, env={"MY_SEARCH_KEY": TAVILY_KEY}) as (url, process):
        found = asyncio.run(go(url))
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert not found.is_error
    assert found.meta[RESULT_META_KEY]["sources"] == [{"url": "https://a.example/", "title": "A"}]
    assert TAVILY_KEY not in output
    assert "Uvicorn running" in output

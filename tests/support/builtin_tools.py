"""The built-in tools for the tests: standalone tool servers (`responses-serve tool python|browser`,
real processes with a real sandbox) on loopback, and the small web the browser reads
(tests/tools/browser/web.py: pages and a SearXNG-shaped search API)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.servers import free_port
from tests.tools.browser.web import Web

# Small limits: attacks end quickly, through the same code paths as the defaults.
PYTHON_OPTIONS = ["--timeout-s", "20", "--max-output-bytes", "4096", "--memory-mb", "768", "--ttl-s", "120"]
PYTHON_OPTIONS += ["--memory-budget-mb", str(64 * (768 + 3 * 128))]  # 64 containers: each auto response makes one


@contextmanager
def tool_server(kind: str, *options: str) -> Iterator[str]:
    """A `responses-serve tool KIND` server on a free loopback port; yields its MCP URL."""
    port = free_port()
    argv = [sys.executable, "-m", "serve_app.cli.tools", kind, "--port", str(port), *options]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"the {kind} tool server exited"
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, f"the {kind} tool server did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def browser_options(web: Web) -> list[str]:
    """The browser searching the test web's SearXNG-shaped API, allowed to open its pages."""
    return ["--search-url", web.base, "--allow-hosts", "127.0.0.1"]


def article_results(web: Web) -> list[dict]:
    return [
        {"url": web.url("/pages/article"), "title": "Harmony, explained", "content": "Harmony is the response format of gpt-oss."},
        {"url": web.url("/pages/channels"), "title": "Channels", "content": "Three channels."},
    ]

"""One python tool server (a real process, a real sandbox) shared by the tests of this folder."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest
from mcp import Client, types

from serve_app.tools.python.mcp_server import META_CONTAINER, META_CREATE, META_OWNER, META_STATUS
from tests.support.servers import free_port

# Small limits, so that attacks end quickly: the same code paths as the defaults. The timeout
# is the default's: a loaded machine is slow to import matplotlib in a fresh sandbox.
SERVER_OPTIONS = {
    "--timeout-s": "30",
    "--disk-mb": "16",
    "--max-file-mb": "8",
    "--max-output-bytes": "4096",
    "--max-processes": "24",
    "--memory-mb": "768",
    "--memory-budget-mb": str(48 * (768 + 3 * 16)),  # 48 containers of the limits above
    "--ttl-s": "30",
}
SECRET_NAME = "RESPONSES_SERVE_TEST_SECRET"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@dataclass
class ToolServer:
    url: str
    process: subprocess.Popen[bytes]
    secret: str
    options: dict[str, str]

    def sandbox_pids(self) -> set[int]:
        """The processes of every sandbox the server runs (its descendants)."""
        return {child.pid for child in psutil.Process(self.process.pid).children(recursive=True)}


def start_server(secret: str, options: dict[str, str]) -> ToolServer:
    port = free_port()
    argv = [sys.executable, "-m", "serve_app.cli.tools", "python", "--port", str(port)]
    argv += [item for pair in options.items() for item in pair]
    process = subprocess.Popen(argv, env={**os.environ, SECRET_NAME: secret}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        assert process.poll() is None, "the tool server exited"
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    return ToolServer(f"http://127.0.0.1:{port}/mcp", process, secret, options)


def stop_server(server: ToolServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest.fixture(scope="package")
def tool_server() -> Iterator[ToolServer]:
    server = start_server("s3cr3t-" + secrets.token_hex(8), SERVER_OPTIONS)
    yield server
    stop_server(server)


@pytest.fixture(scope="package")
def impatient_server() -> Iterator[ToolServer]:
    """A server with a 3 s timeout, for the code that never ends."""
    server = start_server("s3cr3t-" + secrets.token_hex(8), SERVER_OPTIONS | {"--timeout-s": "3"})
    yield server
    stop_server(server)


async def call(
    url: str, code: str, *, owner: str = "attacker", container: str | None = None, one_shot: bool = False
) -> types.CallToolResult:
    """A call on `container`; without one, on a new container (named here, as the app's tool
    loop names a response's), or with `one_shot` in a container that ends with the call."""
    meta: dict[str, object] = {META_OWNER: owner}
    if container is not None:
        meta[META_CONTAINER] = container
    elif not one_shot:
        meta |= {META_CONTAINER: "cntr_" + secrets.token_hex(16), META_CREATE: True}
    async with Client(url) as client:
        return await client.call_tool("python", {"code": code}, meta=meta)


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def status(result: types.CallToolResult) -> str:
    assert result.meta is not None
    return result.meta[META_STATUS]


def container_of(result: types.CallToolResult) -> str:
    assert result.meta is not None
    return result.meta[META_CONTAINER]


async def assert_still_serving(url: str, container: str | None = None, owner: str = "attacker") -> None:
    """After an attack: the server answers the next call, exactly."""
    result = await call(url, "print(6 * 7)", container=container, owner=owner, one_shot=container is None)
    assert (text(result), status(result), result.is_error) == ("42\n", "ok", False)

"""Capacity by memory: a plain MCP client (the official SDK's, no `_meta`) calls `python` a
hundred times in a row on a server with room for one container, since a call that names no
container runs in one that ends with it; and the containers the python tool's pod may hold fit
its memory limit (k8s/tools/python.yaml)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from mcp import Client

from serve_app.config.tools import SERVER_RESERVE_MB, ContainerLimits, SandboxLimits
from serve_app.tools.python.mcp_server import META_CONTAINER
from tests.k8s.manifests import TOOLS, of_kind
from tests.tools.python.conftest import SERVER_OPTIONS, ToolServer, start_server, status, stop_server, text

ONE_CONTAINER_MB = 768 + 3 * 16  # SERVER_OPTIONS' memory_mb and disk_mb


@pytest.fixture(scope="module")
def one_container_server() -> Iterator[ToolServer]:
    server = start_server("unused", SERVER_OPTIONS | {"--memory-budget-mb": str(ONE_CONTAINER_MB)})
    yield server
    stop_server(server)


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_plain_mcp_client_calls_a_hundred_times_in_a_row(one_container_server: ToolServer):
    async with Client(one_container_server.url) as client:
        for n in range(100):
            result = await client.call_tool("python", {"code": f"print(globals().get('previous'), {n})\nprevious = {n}"})
            assert (text(result), status(result), result.is_error) == (f"None {n}\n", "ok", False)
            assert result.meta is not None
            assert META_CONTAINER not in result.meta  # nothing to continue: the container ended with the call
    assert one_container_server.sandbox_pids() == set()


def _mib(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * (1024 if unit == "Gi" else 1)


def test_the_python_tool_pods_containers_fit_its_memory_limit():
    (deployment,) = of_kind(TOOLS["python"], "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    limit = _mib(container["resources"]["limits"]["memory"])
    command = container["command"]
    options = dict(zip(command[3::2], command[4::2], strict=True))  # responses-serve tool python --flag value ...
    budget = int(options.get("--memory-budget-mb", ContainerLimits().memory_budget_mb))
    sandbox = SandboxLimits(
        memory_mb=int(options.get("--memory-mb", SandboxLimits().memory_mb)), disk_mb=int(options.get("--disk-mb", SandboxLimits().disk_mb))
    )
    held = ContainerLimits(memory_budget_mb=budget).max_containers(sandbox)
    assert held >= 1
    # Every container at its limits (processes and three full tmpfs) and the server's own share
    # stay within the pod's limit.
    assert held * (sandbox.memory_mb + 3 * sandbox.disk_mb) + SERVER_RESERVE_MB <= limit
    assert budget + SERVER_RESERVE_MB <= limit

"""How the app reaches a built-in tool at a configured `url`: that host and port only,
whatever the host resolves to (an in-cluster Service has a private address)."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from serve_app.tools.builtin.transport import ConfiguredServer
from serve_app.tools.mcp_client import ConnectRefused


async def _cluster_ip(host: str, port: int) -> list:
    return [ipaddress.ip_address("10.0.0.7")]  # private, as a Service's cluster IP is


def address(url: str, host: str, port: int) -> str:
    return asyncio.run(ConfiguredServer(url, _cluster_ip).address(host, port))


def test_the_configured_server_is_reached_at_its_private_address():
    assert address("http://python-tool:8080/mcp", "python-tool", 8080) == "10.0.0.7"
    assert address("http://127.0.0.1:9/mcp", "127.0.0.1", 9) == "127.0.0.1"  # a literal address is its own
    assert address("https://browser-tool/mcp", "browser-tool", 443) == "10.0.0.7"  # the scheme's port


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("http://python-tool:8080/mcp", "python-tool", 22),  # another port of the same host: SSH, Redis, ...
        ("http://python-tool:8080/mcp", "python-tool", 6379),
        ("http://python-tool:8080/mcp", "169.254.169.254", 80),  # cloud metadata
        ("http://python-tool:8080/mcp", "other-service", 8080),  # another Service
        ("http://python-tool:8080/mcp", "10.0.0.7", 8080),  # the tool's own address, by number
        ("https://browser-tool/mcp", "browser-tool", 80),
    ],
)
def test_nothing_else_is_reached(url, host, port):
    """Where a redirect or a reply could point: refused before any connection."""
    with pytest.raises(ConnectRefused):
        address(url, host, port)

"""An operator's literal internal MCP server in `allowed_urls` opens that address on that port
only: a name under another allowed pattern that resolves there cannot reach its other ports
(the SSH, Redis or Ray dashboard of the same machine)."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from serve_app.tools.mcp_client import ConnectPolicy, ConnectRefused


async def _to_internal(host: str, port: int) -> list:
    return [ipaddress.ip_address("10.0.0.5")]


@pytest.mark.parametrize("port", [22, 6379, 8265, 80, 8081])
def test_a_name_resolving_to_a_named_address_reaches_only_the_named_port(port):
    policy = ConnectPolicy(["http://10.0.0.5:8080/*", "http://*.tenant-names.example:*/*"], _to_internal)
    policy.check(f"http://attacker.tenant-names.example:{port}/mcp")  # the URL itself is allowed
    with pytest.raises(ConnectRefused, match="private"):
        asyncio.run(policy.address("attacker.tenant-names.example", port))
    with pytest.raises(ValueError, match="not one this server's allowed_urls"):
        policy.check(f"http://10.0.0.5:{port}/mcp")  # nor by the address itself
    assert asyncio.run(policy.address("attacker.tenant-names.example", 8080)) == "10.0.0.5"


def test_a_named_address_with_any_port_opens_every_port():
    policy = ConnectPolicy(["http://10.0.0.5:*/*", "http://*.tenant-names.example:*/*"], _to_internal)
    assert asyncio.run(policy.address("attacker.tenant-names.example", 22)) == "10.0.0.5"
    assert policy.check("http://10.0.0.5:22/mcp").port == 22

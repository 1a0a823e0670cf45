"""The egress policy's address rules, one place for every outbound connection the server
makes for a request (the browser's fetches, MCP servers, the built-in tools at a URL, files'
and a vision model's images' URLs): which addresses are not public, and the machine's
resolver bounded in time. Each caller checks every address a name resolves to and connects to the
address it checked (no second lookup for a rebinding attacker to answer differently)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence

from serve_app.api.url_patterns import IPAddress

Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]

METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address)
    for address in (
        "169.254.169.254",  # AWS, GCP, Azure, Oracle, DigitalOcean, OpenStack
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.170.23",  # AWS EKS pod identity
        "fd00:ec2::254",  # AWS over IPv6
        "fd00:ec2::23",
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud
        "168.63.129.16",  # Azure's WireServer (a public address: refused by this list alone)
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT (RFC 6598)


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def is_metadata(address: IPAddress) -> bool:
    """A cloud metadata address, also when embedded in an IPv6 one (IPv4-mapped, NAT64, ...)."""
    embedded = _embedded_ipv4(address)
    return address in METADATA_ADDRESSES or (embedded is not None and embedded in METADATA_ADDRESSES)


def refusal_reason(address: IPAddress) -> str | None:
    """Why `address` is not a public address, or None if it is one."""
    embedded = _embedded_ipv4(address)
    if embedded is not None and (reason := refusal_reason(embedded)):
        return reason
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    for reason, test in (
        ("a loopback address", address.is_loopback),
        ("an unspecified address", address.is_unspecified),
        ("a link-local address", address.is_link_local),
        ("a multicast address", address.is_multicast),
        ("a private address", address.is_private),
        ("a shared (CGNAT) address", address in _SHARED),
        ("a reserved address", address.is_reserved),
    ):
        if test:
            return reason
    return None if address.is_global else "not a public address"


async def system_resolver(host: str, port: int, timeout_s: float = 5.0) -> list[IPAddress]:
    """The machine's resolver (getaddrinfo), bounded in time."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout_s):
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(info[4][0]) for info in infos]

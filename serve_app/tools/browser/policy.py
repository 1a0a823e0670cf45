"""Which URLs the browser may fetch: checked on the resolved address, before connecting.

A URL the model picks (or a page redirects to) is hostile. It is refused unless:
- its scheme is http or https, it has a host, no user name or password, and a numeric host
  is a canonical IP address (no `2130706433`, `0x7f.1`, `127.1` spellings that resolvers
  read as loopback);
- its host is in the request's `allowed_domains` (a domain allows its subdomains), if any;
- every address the host resolves to is public: not loopback, link-local, private (RFC 1918,
  ULA), shared (CGNAT), multicast, unspecified or reserved, also when embedded in an IPv6
  address (IPv4-mapped, NAT64, 6to4, Teredo); unless the operator allows the host by name or
  the address by network (`--allow-hosts`). Cloud metadata addresses are allowed only when
  listed exactly, never by a network that contains them.
The check yields the address to connect to, so the connection goes where the check looked
(no second DNS lookup for a rebinding attacker to answer differently).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import httpx

from serve_app.api.url_patterns import IPAddress, ip_literal
from serve_app.tools.egress import Resolver, is_metadata, refusal_reason, system_resolver

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_URL_CHARS = 4096


class FetchRefused(Exception):
    """The URL may not be fetched; the message says why (it is shown to the model)."""


@dataclass(frozen=True)
class Target:
    """A checked URL and the address to connect to for it."""

    url: str
    scheme: str
    host: str  # ASCII, lower case, IPv6 without brackets
    port: int
    address: IPAddress

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def _strip_dot(host: str) -> str:
    return host[:-1] if host.endswith(".") else host


class HostRules:
    """`--allow-hosts`: host names (exact), IP addresses and networks (CIDR) the browser may reach."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        self.names: set[str] = set()
        self.addresses: set[IPAddress] = set()
        self.networks: list[IPNetwork] = []
        for raw in entries:
            entry = raw.strip().lower()
            if not entry:
                continue
            try:
                if "/" in entry:
                    self.networks.append(ipaddress.ip_network(entry, strict=False))
                else:
                    self.addresses.add(ipaddress.ip_address(entry.strip("[]")))
                continue
            except ValueError:
                pass
            name = _strip_dot(entry)
            if not name or any(c in name for c in "/@:?#* "):
                raise ValueError(f"--allow-hosts: not a host name, address or network: {raw!r}")
            self.names.add(name.encode("idna").decode("ascii"))

    def allows_name(self, host: str) -> bool:
        return _strip_dot(host) in self.names

    def allows_address(self, address: IPAddress) -> bool:
        if address in self.addresses:
            return True
        if is_metadata(address):  # only by exact listing
            return False
        return any(address in network for network in self.networks)


def normalize_domains(domains: Iterable[str] | None) -> tuple[str, ...] | None:
    """A request's `filters.allowed_domains` as bare lower-case ASCII host names (None: no filter)."""
    if domains is None:
        return None
    out: list[str] = []
    for raw in domains:
        entry = raw.strip().lower()
        if "://" in entry:
            entry = entry.split("://", 1)[1]
        entry = _strip_dot(entry.split("/", 1)[0].split(":", 1)[0]).lstrip("*.")
        if entry:
            out.append(entry.encode("idna").decode("ascii"))
    return tuple(out)


def domain_allowed(host: str, allowed_domains: tuple[str, ...] | None) -> bool:
    if allowed_domains is None:
        return True
    host = _strip_dot(host.lower())
    return any(host == domain or host.endswith("." + domain) for domain in allowed_domains)


def parse_url(url: str) -> httpx.URL:
    """The URL, if its shape may be fetched at all (before any name is resolved)."""
    if len(url) > MAX_URL_CHARS:
        raise FetchRefused(f"URL longer than {MAX_URL_CHARS} characters")
    if any(ord(char) < 0x21 or char == "\x7f" for char in url):
        raise FetchRefused("URL contains whitespace or control characters")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise FetchRefused(f"not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise FetchRefused("only http and https URLs can be opened")
    if parsed.userinfo:
        raise FetchRefused("URLs with a user name or password are not opened")
    host = parsed.raw_host.decode("ascii").lower()
    if not host:
        raise FetchRefused("URL has no host")
    if "%" in host:
        raise FetchRefused("IPv6 zone identifiers are not allowed")
    last_label = _strip_dot(host).rsplit(".", 1)[-1]
    if ":" not in host and (last_label.isdigit() or last_label.startswith("0x")):
        address = ip_literal(_strip_dot(host))
        if address is None or str(address) != _strip_dot(host):
            raise FetchRefused(f"`{host}` is not a canonical IP address")
    return parsed


class FetchPolicy:
    """Decides, for each URL, whether and where the browser may connect."""

    def __init__(self, allow_hosts: HostRules | None = None, resolver: Resolver | None = None) -> None:
        self.allow_hosts = allow_hosts or HostRules()
        self.resolver: Resolver = resolver or system_resolver

    async def check(self, url: str, allowed_domains: tuple[str, ...] | None = None) -> Target:
        """The target to connect to for `url`, or `FetchRefused`."""
        parsed = parse_url(url)
        host = parsed.raw_host.decode("ascii").lower()
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        if not domain_allowed(host, allowed_domains):
            raise FetchRefused(f"`{host}` is not in the allowed domains of this request")
        literal = ip_literal(_strip_dot(host))
        if literal is not None:
            addresses: Sequence[IPAddress] = [literal]
        else:
            try:
                addresses = await self.resolver(host, port)
            except (OSError, TimeoutError, UnicodeError) as exc:
                raise FetchRefused(f"cannot resolve `{host}`: {exc or type(exc).__name__}") from None
            if not addresses:
                raise FetchRefused(f"cannot resolve `{host}`")
        named = literal is None and self.allow_hosts.allows_name(host)
        for address in addresses:
            if self.allow_hosts.allows_address(address):
                continue
            if named and not is_metadata(address):
                continue
            if reason := refusal_reason(address):
                raise FetchRefused(f"`{host}` resolves to {reason} ({address}), which this browser does not open")
        return Target(url=str(parsed), scheme=parsed.scheme, host=host, port=port, address=addresses[0])

"""URLs a request names for the server to connect to, and the patterns an operator allows.

A request's MCP `server_url` is hostile: the server connects to it with the request's own
headers. It is taken only in a plain shape (http or https, a host, no user name or password,
no `..` path segments, a numeric host only as a canonical IP address: no `127.1`,
`2130706433` or `0x7f.1`, which resolvers read as loopback) and only when a pattern of
`tools.mcp.allowed_urls` matches it part by part:

    https://mcp.example.com/*        that host, port 443, any path
    https://*.example.com/mcp        any subdomain, that path
    http://127.0.0.1:*/*             that address, any port (a literal address also allows
                                     connecting to it when it is loopback or private)

`*` in a host matches within the host only (never `/`, `@` or `:`), a port is a number or
`*` (none: the scheme's default), a path is a glob over the path (the query is not matched).
Where the host's name resolves to is checked when the server connects (tools/mcp_client.py).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_CHARS = 2048
_DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST_CHARS = re.compile(r"[a-z0-9.*\-_\[\]:]+")


@dataclass(frozen=True, slots=True)
class TargetUrl:
    """A URL in the shape the server connects to."""

    url: str
    scheme: str
    host: str  # lower case, ASCII (IDNA), IPv6 without brackets, no trailing dot
    port: int
    path: str

    @property
    def address(self) -> IPAddress | None:
        """The host as an IP address, when it is one."""
        return ip_literal(self.host)


def parse_target(url: str) -> TargetUrl:
    """`url` in the shape the server connects to; `ValueError` saying why it is not one."""
    if len(url) > MAX_URL_CHARS:
        raise ValueError(f"the URL is longer than {MAX_URL_CHARS} characters")
    if any(ord(char) < 0x21 or char == "\x7f" for char in url):
        raise ValueError("the URL contains whitespace or control characters")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ValueError("only http and https URLs are allowed")
    if "@" in parts.netloc:
        raise ValueError("a URL with a user name or password is not allowed: send credentials in headers or authorization")
    host = _host(parts.hostname or "")
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError:
        raise ValueError("the URL's port is not a number") from None
    path = parts.path or "/"
    if any(segment in (".", "..") for segment in path.split("/")) or "%2e" in path.lower():
        raise ValueError("a URL path with '.' or '..' segments is not allowed")
    return TargetUrl(url, scheme, host, port, path)


def _host(raw: str) -> str:
    host = raw.lower().rstrip(".")
    if not host:
        raise ValueError("the URL has no host")
    if "%" in host:
        raise ValueError("IPv6 zone identifiers are not allowed")
    try:
        host = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        raise ValueError("the URL's host is not a valid name") from None
    last = host.rsplit(".", 1)[-1]
    if ":" not in host and (last.isdigit() or last.startswith("0x")):
        address = ip_literal(host)
        if address is None or str(address) != host:
            raise ValueError(f"'{host}' is not a canonical IP address")
    return host


def ip_literal(host: str) -> IPAddress | None:
    """The IP address a URL's host spells (brackets around IPv6 allowed), or None for a name."""
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class UrlPattern:
    """One entry of `allowed_urls`."""

    text: str
    scheme: str
    host: str  # a glob over the host
    port: int | None  # None: any port
    path: str  # a glob over the path

    @classmethod
    def parse(cls, text: str) -> UrlPattern:
        scheme, separator, rest = text.partition("://")
        scheme = scheme.lower()
        if not separator or scheme not in _DEFAULT_PORTS:
            raise ValueError(f"{text!r}: a pattern starts with http:// or https://")
        authority, slash, path = rest.partition("/")
        if "@" in authority:
            raise ValueError(f"{text!r}: a pattern has no user name or password")
        if authority.startswith("["):  # [IPv6]:port
            host, _, port_text = authority[1:].partition("]")
            port_text = port_text.removeprefix(":")
        else:
            host, _, port_text = authority.partition(":")
        host = host.lower().rstrip(".")
        if not host or not _HOST_CHARS.fullmatch(host):
            raise ValueError(f"{text!r}: not a host (or a glob of hosts)")
        if port_text == "*":
            port = None
        elif port_text:
            if not port_text.isdigit():
                raise ValueError(f"{text!r}: a port is a number or '*'")
            port = int(port_text)
        else:
            port = _DEFAULT_PORTS[scheme]
        return cls(text, scheme, host, port, "/" + path if slash else "/*")

    def matches(self, target: TargetUrl) -> bool:
        return (
            target.scheme == self.scheme
            and fnmatchcase(target.host, self.host)
            and (self.port is None or target.port == self.port)
            and fnmatchcase(target.path, self.path)
        )

    @property
    def address(self) -> IPAddress | None:
        """The address this pattern names literally (no glob in its host), if it is one."""
        return ip_literal(self.host)

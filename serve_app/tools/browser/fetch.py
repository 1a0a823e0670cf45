"""Fetching a page under the fetch policy: pinned connections, checked redirects, caps.

The browser's pages (`fetch`) and what a request names by URL (`fetch_bytes`: `input_file`'s
`file_url`, `input_image`'s `image_url`) are fetched by this one code, each caller with its
own byte bound (`FetchLimits`) and accepted types. Each hop of a fetch is checked by
`FetchPolicy.check`, which returns the address to connect to; the request goes to that
address while carrying the URL's host in `Host` and, for https, in the TLS server name (so
the certificate is verified for the host, not the address). No connection pool outlives a
hop, and the environment's proxies are not used: nothing else resolves the name again.
Redirects are followed here, each one checked like the first URL. A fetch is bounded in
time (all hops, DNS included), in bytes read (decoded; the rest of a longer page is not
read, a longer file or image is refused), and to the content types its caller takes.
"""

from __future__ import annotations

import asyncio
import codecs
import re
import ssl
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urljoin

import certifi
import httpx

from serve_app.tools.browser.extract import HTML_TYPES, PAGE_TYPES
from serve_app.tools.browser.policy import FetchPolicy, Target, parse_url

T = TypeVar("T")

USER_AGENT = "responses-serve-browser/0.1 (+https://github.com/openai/gpt-oss)"
_PAGE_ACCEPT = "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.1"
_REDIRECTS = {301, 302, 303, 307, 308}
# zlib window bits per Content-Encoding (0: not compressed).
_WBITS = {"identity": 0, "": 0, "gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_META_CHARSET_RE = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)


class FetchError(Exception):
    """The page could not be fetched; the message says why (it is shown to the model)."""


@dataclass(frozen=True)
class FetchLimits:
    max_bytes: int = 1024 * 1024
    timeout_s: float = 15.0
    connect_timeout_s: float = 5.0
    max_redirects: int = 5


@dataclass(frozen=True)
class RawDocument:
    url: str  # after redirects
    content_type: str  # the Content-Type header as sent
    data: bytes

    @property
    def media_type(self) -> str:
        return media_type_of(self.content_type)


def media_type_of(content_type: str) -> str:
    """The media type of a Content-Type header, lower case, without its parameters."""
    return content_type.split(";", 1)[0].strip().lower()


@dataclass(frozen=True)
class Document:
    url: str  # after redirects
    content_type: str
    text: str
    truncated: bool  # longer than `max_bytes`: only the start was read


def _charset(content_type_header: str, body: bytes) -> str:
    for part in content_type_header.split(";")[1:]:
        key, _, value = part.partition("=")
        if key.strip().lower() == "charset":
            return _known_codec(value.strip().strip("\"'"))
    if match := _META_CHARSET_RE.search(body[:4096]):
        return _known_codec(match.group(1).decode("ascii", "replace"))
    return "utf-8"


def _known_codec(name: str) -> str:
    try:
        return codecs.lookup(name).name
    except LookupError:
        return "utf-8"


class Fetcher:
    def __init__(
        self,
        policy: FetchPolicy,
        limits: FetchLimits | None = None,
        *,
        user_agent: str = USER_AGENT,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.policy = policy
        self.limits = limits or FetchLimits()
        self.user_agent = user_agent
        self._ssl = ssl_context or ssl.create_default_context(cafile=certifi.where())

    async def fetch(self, url: str, allowed_domains: tuple[str, ...] | None = None, *, any_text: bool = False) -> Document:
        """The document at `url`; `FetchRefused` or `FetchError` otherwise. `any_text`: any text/* type (view source)."""

        async def read(target: Target, response: httpx.Response) -> Document:
            return await self._read(target, response, any_text)

        return await self._bounded(self._follow(url, allowed_domains, read, _PAGE_ACCEPT))

    async def fetch_bytes(self, url: str, media_types: frozenset[str] | None = None) -> RawDocument:
        """The bytes at `url` (a file for a model: `input_file`'s `file_url`, `input_image`'s
        `image_url`), under the same policy, redirects, time bound and decoding as a page, read
        whole: more than `max_bytes` is a `FetchError`, not cut. `media_types`: the only types
        taken (asked for in `Accept`; another is a `FetchError` before its body is read);
        None: any (`*/*`)."""

        async def read(target: Target, response: httpx.Response) -> RawDocument:
            content_type = response.headers.get("content-type", "")
            if media_types is not None and media_type_of(content_type) not in media_types:
                shown = media_type_of(content_type) or "none"
                raise FetchError(f"content of type `{shown}` is not one of {', '.join(sorted(media_types))}")
            body, truncated = await self._body(response)
            if truncated:
                raise FetchError(f"the content is larger than {self.limits.max_bytes} bytes")
            return RawDocument(url=target.url, content_type=content_type, data=body)

        accept = ", ".join(sorted(media_types)) if media_types is not None else "*/*"
        return await self._bounded(self._follow(url, None, read, accept))

    async def _bounded(self, fetching: Awaitable[T]) -> T:
        """`fetching` within the fetch's time limit, its transport's errors as `FetchError`s."""
        try:
            async with asyncio.timeout(self.limits.timeout_s):
                return await fetching
        except TimeoutError:
            raise FetchError(f"timed out after {self.limits.timeout_s:g} s") from None
        except httpx.HTTPError as exc:  # connection refused or reset, TLS verification, bad HTTP
            raise FetchError(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None

    async def _follow(
        self,
        url: str,
        allowed_domains: tuple[str, ...] | None,
        read: Callable[[Target, httpx.Response], Awaitable[T]],
        accept: str,
    ) -> T:
        for _hop in range(self.limits.max_redirects + 1):
            target = await self.policy.check(url, allowed_domains)
            async with self._client() as client:
                response = await client.send(self._request(client, target, accept), stream=True)
                try:
                    location = response.headers.get("location")
                    if response.status_code in _REDIRECTS and location:
                        url = urljoin(target.url, location.strip())
                        continue
                    if response.status_code >= 400:
                        raise FetchError(f"HTTP {response.status_code} {response.reason_phrase}".rstrip())
                    return await read(target, response)
                finally:
                    await response.aclose()
        raise FetchError(f"more than {self.limits.max_redirects} redirects")

    def _client(self) -> httpx.AsyncClient:
        timeout = httpx.Timeout(self.limits.timeout_s, connect=self.limits.connect_timeout_s)
        transport = httpx.AsyncHTTPTransport(verify=self._ssl, retries=0)
        return httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False, follow_redirects=False)

    def _request(self, client: httpx.AsyncClient, target: Target, accept: str) -> httpx.Request:
        parsed = parse_url(target.url)
        pinned = httpx.URL(scheme=target.scheme, host=str(target.address), port=target.port, raw_path=parsed.raw_path)
        headers = {
            "Host": target.host_header,
            "User-Agent": self.user_agent,
            "Accept": accept,
            "Accept-Encoding": "identity",
        }
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        return client.build_request("GET", pinned, headers=headers, extensions=extensions)

    async def _read(self, target: Target, response: httpx.Response, any_text: bool) -> Document:
        header = response.headers.get("content-type", "text/html")
        content_type = header.split(";", 1)[0].strip().lower() or "text/html"
        if not (content_type in PAGE_TYPES or (any_text and content_type.startswith("text/"))):
            raise FetchError(f"cannot show content of type `{content_type}`")
        body, truncated = await self._body(response)
        charset = _charset(header, body if content_type in HTML_TYPES else b"")
        return Document(url=target.url, content_type=content_type, text=body.decode(charset, errors="replace"), truncated=truncated)

    async def _body(self, response: httpx.Response) -> tuple[bytes, bool]:
        """At most `max_bytes` of the decoded body, and whether there was more.

        Compressed bodies are inflated here, never to more than the bytes still wanted (httpx
        inflates each chunk whole: a compression bomb's 64 KiB chunk into 64 MiB at once).
        """
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in _WBITS:
            raise FetchError(f"cannot read content encoded as `{encoding}`")
        inflater = zlib.decompressobj(_WBITS[encoding]) if _WBITS[encoding] else None
        chunks: list[bytes] = []
        wanted = self.limits.max_bytes
        async for raw in response.aiter_raw():
            data = raw
            if inflater is not None:
                try:
                    data = inflater.decompress(raw, wanted + 1)  # one byte more tells that there is more
                except zlib.error as exc:
                    raise FetchError(f"the page's {encoding} encoding is corrupt: {exc}") from None
            if len(data) > wanted or (inflater is not None and inflater.unconsumed_tail):
                chunks.append(data[:wanted])
                return b"".join(chunks), True
            chunks.append(data)
            wanted -= len(data)
        return b"".join(chunks), False

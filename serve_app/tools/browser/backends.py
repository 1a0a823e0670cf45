"""Search backends: SearXNG (self-hosted, the default) and Tavily (hosted), one interface.

The backend's URL is the operator's (configuration, not model input), so it is reached
directly, without the fetch policy: a SearXNG inside the cluster is the usual set-up. Its
answers are still hostile input: bounded in size and time, and only http(s) results with a
host are kept. A hosted API's key is read from an environment variable named by an option;
it is sent in a header only and scrubbed from any error text before that text goes anywhere.
"""

from __future__ import annotations

import json
import os
from typing import Any, Protocol

import httpx

from serve_app.tools.browser.page import SearchResult, maybe_truncate
from serve_app.tools.browser.policy import MAX_URL_CHARS

MAX_RESPONSE_BYTES = 4 * 1024 * 1024
TITLE_MAX_CHARS = 300
SNIPPET_MAX_CHARS = 1000


class BackendError(Exception):
    """The search failed; the message says why (it is shown to the model)."""


class SearchBackend(Protocol):
    source: str  # what the tool description calls the source (`sources=...`)

    async def search(self, query: str, count: int) -> list[SearchResult]: ...

    async def aclose(self) -> None: ...


def _results(items: Any, snippet_key: str, count: int) -> list[SearchResult]:
    if not isinstance(items, list):
        raise BackendError("the search service answered without a result list")
    results: list[SearchResult] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        url, title, snippet = item.get("url"), item.get("title"), item.get(snippet_key)
        if not isinstance(url, str) or len(url) > MAX_URL_CHARS:
            continue
        try:
            if not url.startswith(("http://", "https://")) or not httpx.URL(url).host:
                continue
        except (httpx.InvalidURL, ValueError):
            continue
        results.append(
            SearchResult(
                url=url,
                title=title[:TITLE_MAX_CHARS] if isinstance(title, str) else "",
                snippet=snippet[:SNIPPET_MAX_CHARS] if isinstance(snippet, str) else "",
            )
        )
        if len(results) == count:
            break
    return results


class _HTTPBackend:
    def __init__(self, base_url: str, timeout_s: float, secret: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._secret = secret
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), trust_env=False, follow_redirects=False)

    async def aclose(self) -> None:
        await self._client.aclose()

    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    async def _json(self, request: httpx.Request) -> Any:
        try:
            response = await self._client.send(request, stream=True)
            try:
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_RESPONSE_BYTES:
                        raise BackendError(f"the search service answered more than {MAX_RESPONSE_BYTES} bytes")
            finally:
                await response.aclose()
        except httpx.HTTPError as exc:
            raise BackendError(self._scrub(f"cannot reach the search service: {type(exc).__name__}: {exc}")) from None
        if response.status_code != 200:
            detail = maybe_truncate(bytes(body).decode("utf-8", "replace"), 300)
            raise BackendError(self._scrub(f"the search service answered HTTP {response.status_code}: {detail}"))
        try:
            return json.loads(body)
        except ValueError:
            raise BackendError("the search service answered something other than JSON") from None


class SearxngBackend(_HTTPBackend):
    """A SearXNG instance's JSON API (`format=json` must be enabled in its settings)."""

    source = "web"

    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        super().__init__(base_url, timeout_s)

    async def search(self, query: str, count: int) -> list[SearchResult]:
        request = self._client.build_request("GET", f"{self.base_url}/search", params={"q": query, "format": "json"})
        data = await self._json(request)
        return _results(data.get("results") if isinstance(data, dict) else None, "content", count)


class TavilyBackend(_HTTPBackend):
    """Tavily's search API (`POST /search`, bearer key)."""

    source = "web"
    DEFAULT_URL = "https://api.tavily.com"
    DEFAULT_KEY_ENV = "TAVILY_API_KEY"

    def __init__(self, api_key: str, base_url: str = DEFAULT_URL, timeout_s: float = 15.0) -> None:
        super().__init__(base_url, timeout_s, secret=api_key)

    async def search(self, query: str, count: int) -> list[SearchResult]:
        request = self._client.build_request(
            "POST",
            f"{self.base_url}/search",
            json={"query": query, "max_results": count},
            headers={"Authorization": f"Bearer {self._secret}"},
        )
        data = await self._json(request)
        return _results(data.get("results") if isinstance(data, dict) else None, "content", count)


def api_key_from_env(variable: str) -> str:
    """The key in `variable`; the error names the variable, never a value."""
    key = os.environ.get(variable, "").strip()
    if not key:
        raise ValueError(f"the search API key is read from ${variable}, which is not set")
    return key

"""gpt-oss's browser: `search`, `open` and `find` over the pages of one session.

A session is what one response browsed: a stack of pages whose positions are the cursors the
model sees (`[3] Title (url)`) and cites (`【3†L10-L15】`). Every call pushes the page it shows
(opening a link, scrolling, searching, finding), so cursors only grow. A session is bounded
in pages and in bytes (the oldest pages' text is dropped first; their cursors stay citable).
Each call returns the text the model reads and what the tool loop needs to build the
`web_search_call` item and the answer's citations; errors are text for the model too.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from openai_harmony import ToolNamespaceConfig

from serve_app.core.citations import CitedPage
from serve_app.tools.browser.backends import BackendError, SearchBackend
from serve_app.tools.browser.extract import HTML_TYPES, html_page, text_page
from serve_app.tools.browser.fetch import Document, Fetcher, FetchError
from serve_app.tools.browser.page import Page, ToolUsageError, find_in_page, maybe_truncate, render, search_results_page
from serve_app.tools.browser.policy import FetchRefused, domain_allowed

MAX_QUERY_CHARS = 2000


@dataclass(frozen=True)
class BrowserLimits:
    view_tokens: int = 1024  # tokens of page text in one view, as gpt-oss's browser
    max_search_results: int = 20
    max_pages: int = 100  # cursors per session
    max_session_bytes: int = 32 * 1024 * 1024  # text kept per session


@dataclass
class Outcome:
    """One call's result: the text the model reads, and what the tool loop records."""

    text: str
    action: dict[str, Any]  # the `web_search_call` action (openai's ActionSearch / ActionOpenPage / ActionFind)
    sources: list[CitedPage] = field(default_factory=list)  # search results, or the page shown
    cursor: int | None = None  # the cursor of the page shown (None: an error)
    is_error: bool = False
    truncated: bool = False  # the page was longer than the fetch limit: only its start was read


class MemoryBudget(Protocol):
    """What all sessions' pages may still take of the server's memory."""

    max_bytes: int

    def room(self) -> int:
        """Bytes left: the budget less what every kept session's pages hold (`Page.size`)."""
        ...


def memory_full(budget: MemoryBudget) -> ToolUsageError:
    return ToolUsageError(
        f"The browser's memory is full: its sessions hold as many pages as it may keep ({budget.max_bytes} bytes, "
        "memory_budget_mb). Answer with what you have, or try the browser again later."
    )


class BrowserSession:
    """The pages one response has seen, by cursor, bounded in count and bytes, and within the
    server's `budget` for all sessions together (None: none)."""

    def __init__(self, limits: BrowserLimits, budget: MemoryBudget | None = None) -> None:
        self.limits = limits
        self.budget = budget
        self.lock = asyncio.Lock()  # one call at a time: cursors follow the calls' order
        self._stack: list[Page | None] = []
        self._citable: dict[int, CitedPage] = {}
        self._by_url: dict[str, Page] = {}
        self._kept: OrderedDict[int, tuple[Page, int]] = OrderedDict()  # id(page) -> (page, size), oldest first
        self._bytes = 0

    @property
    def bytes(self) -> int:
        """What its kept pages hold (`Page.size`)."""
        return self._bytes

    @property
    def current(self) -> int:
        return len(self._stack) - 1

    def citable(self) -> dict[int, CitedPage]:
        """Cursor -> the page a citation of it names."""
        return dict(self._citable)

    def page(self, cursor: int = -1) -> Page:
        if not self._stack:
            raise ToolUsageError("No pages to access!")
        index = self.current if cursor == -1 else cursor
        if not 0 <= index <= self.current:
            raise ToolUsageError(f"Cursor `{cursor}` is out of range. Available cursor indices: [0 - {self.current}].")
        page = self._stack[index]
        if page is None:
            raise ToolUsageError(f"Cursor `{cursor}` is no longer available: open its page again.")
        return page

    def cached(self, url: str) -> Page | None:
        return self._by_url.get(url)

    def push(self, page: Page) -> int:
        if len(self._stack) >= self.limits.max_pages:
            raise ToolUsageError(f"This browsing session has reached its limit of {self.limits.max_pages} pages.")
        self._keep(page)
        self._stack.append(page)
        if page.cite is not None:
            self._citable[self.current] = page.cite
        if page.url and page.snippets is None:
            self._by_url[page.url] = page
        return self.current

    def pop(self) -> None:
        self._citable.pop(self.current, None)
        self._stack.pop()

    def _keep(self, page: Page) -> None:
        if id(page) in self._kept:
            self._kept.move_to_end(id(page))
            return
        size = page.size()
        short = 0  # what this session's older pages must give up for the page to fit the budget
        if self.budget is not None:
            short = size - self.budget.room()
            if short > self._bytes:  # not even all of them would do: the others' sessions hold the rest
                raise memory_full(self.budget)
        self._kept[id(page)] = (page, size)
        self._bytes += size
        freed = 0
        while (self._bytes > self.limits.max_session_bytes or freed < short) and len(self._kept) > 1:
            _, (old, old_size) = self._kept.popitem(last=False)
            self._bytes -= old_size
            freed += old_size
            self._stack = [None if kept is old else kept for kept in self._stack]
            if self._by_url.get(old.url) is old:
                del self._by_url[old.url]


def _int(value: Any, name: str) -> int:
    """An integer argument; JSON numbers may arrive as floats (harmony's schemas say `number`)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ToolUsageError(f"`{name}` should be an integer, not `{value!r}`")
    return int(value)


class Browser:
    def __init__(self, backend: SearchBackend, fetcher: Fetcher, limits: BrowserLimits | None = None) -> None:
        self.backend = backend
        self.fetcher = fetcher
        self.limits = limits or BrowserLimits()

    @staticmethod
    def namespace() -> ToolNamespaceConfig:
        """The `browser` namespace as gpt-oss was trained on it (descriptions and parameters)."""
        return ToolNamespaceConfig.browser()

    def _show(
        self, session: BrowserSession, page: Page, allowed_domains: tuple[str, ...] | None, loc: int = 0, num_lines: int = -1
    ) -> tuple[int, str]:
        if page.url and not domain_allowed(_host(page.url), allowed_domains):
            raise ToolUsageError(f"`{_host(page.url)}` is not in the allowed domains of this request")
        cursor = session.push(page)
        try:
            return cursor, render(page, cursor, loc=loc, num_lines=num_lines, view_tokens=self.limits.view_tokens)
        except ToolUsageError:
            session.pop()
            raise

    async def search(self, session: BrowserSession, query: Any, topn: Any = 10, allowed_domains: tuple[str, ...] | None = None) -> Outcome:
        action: dict[str, Any] = {"type": "search", "query": query if isinstance(query, str) else "", "sources": []}
        try:
            if not isinstance(query, str) or not query.strip():
                raise ToolUsageError("`query` should be a non-empty string")
            if len(query) > MAX_QUERY_CHARS:
                raise ToolUsageError(f"`query` is longer than {MAX_QUERY_CHARS} characters")
            count = min(max(_int(topn, "topn"), 1), self.limits.max_search_results)
            try:
                results = await self.backend.search(query, self.limits.max_search_results if allowed_domains else count)
            except BackendError as exc:
                raise BackendError(f"Error during search for `{maybe_truncate(query)}`: {exc}") from None
            results = [r for r in results if domain_allowed(_host(r.url), allowed_domains)][:count]
            action["sources"] = [{"type": "url", "url": r.url} for r in results]
            cursor, text = self._show(session, search_results_page(query, results), allowed_domains)
        except (ToolUsageError, BackendError) as exc:
            return Outcome(text=str(exc), action=action, is_error=True)
        return Outcome(text=text, action=action, sources=[CitedPage(url=r.url, title=r.title) for r in results], cursor=cursor)

    async def open(
        self,
        session: BrowserSession,
        id: Any = -1,  # the model's parameter name: a link id or a URL
        cursor: Any = -1,
        loc: Any = -1,
        num_lines: Any = -1,
        view_source: Any = False,
        allowed_domains: tuple[str, ...] | None = None,
    ) -> Outcome:
        action: dict[str, Any] = {"type": "open_page", "url": id if isinstance(id, str) else None}
        truncated = False
        try:
            cursor, loc, num_lines = _int(cursor, "cursor"), _int(loc, "loc"), _int(num_lines, "num_lines")
            snippet = None
            if isinstance(id, str):
                url, current, stay = id, None, False
            else:
                link = _int(id, "id")
                current = session.page(cursor)
                if link >= 0:
                    if str(link) not in current.links:
                        raise ToolUsageError(f"Invalid link id `{link}`.")
                    url = current.links[str(link)]
                    snippet = (current.snippets or {}).get(str(link))
                    stay = False
                else:  # no link: scroll the page (or view its source)
                    url, stay = current.url, not view_source
                    if view_source and not url:
                        raise ToolUsageError("Cannot view the source of a search results page.")
            action["url"] = url
            if stay:
                assert current is not None
                page = current
            elif view_source:
                document = await self._fetch(url, allowed_domains, any_text=True)
                page, truncated = text_page(document.text, document.url, title=f"view-source:{document.url}"), document.truncated
            elif not isinstance(id, str) and (cached := session.cached(url)) is not None:  # a link to a page seen before
                page = cached
            else:  # a URL the model names is fetched again (a refresh), as in gpt-oss's browser
                document = await self._fetch(url, allowed_domains)
                page, truncated = await _to_page(document), document.truncated
            if loc < 0:  # a find match opens a few lines above the match, as in gpt-oss's browser
                loc = 0 if snippet is None else snippet.line - 4 if snippet.line > 4 else snippet.line
            shown, text = self._show(session, page, allowed_domains, loc=loc, num_lines=num_lines)
        except (ToolUsageError, FetchRefused, FetchError) as exc:
            return Outcome(text=str(exc), action=action, is_error=True)
        sources = [page.cite] if page.cite else []
        return Outcome(text=text, action=action, sources=sources, cursor=shown, truncated=truncated)

    async def find(
        self, session: BrowserSession, pattern: Any, cursor: Any = -1, allowed_domains: tuple[str, ...] | None = None
    ) -> Outcome:
        action: dict[str, Any] = {"type": "find_in_page", "pattern": pattern if isinstance(pattern, str) else "", "url": ""}
        try:
            if not isinstance(pattern, str) or not pattern:
                raise ToolUsageError("`pattern` should be a non-empty string")
            if len(pattern) > MAX_QUERY_CHARS:
                raise ToolUsageError(f"`pattern` is longer than {MAX_QUERY_CHARS} characters")
            page = session.page(_int(cursor, "cursor"))
            action["url"] = page.cite.url if page.cite else page.url
            if page.snippets is not None:
                raise ToolUsageError("Cannot run `find` on search results page or find results page")
            shown, text = self._show(session, find_in_page(pattern, page), allowed_domains)
        except ToolUsageError as exc:
            return Outcome(text=str(exc), action=action, is_error=True)
        return Outcome(text=text, action=action, sources=[page.cite] if page.cite else [], cursor=shown)

    async def _fetch(self, url: str, allowed_domains: tuple[str, ...] | None, any_text: bool = False) -> Document:
        try:
            return await self.fetcher.fetch(url, allowed_domains, any_text=any_text)
        except (FetchRefused, FetchError) as exc:
            raise type(exc)(f"Error fetching URL `{maybe_truncate(url)}`: {exc}") from None


async def _to_page(document: Document) -> Page:
    if document.content_type in HTML_TYPES:
        return await asyncio.to_thread(html_page, document.text, document.url)  # CPU-bound: off the event loop
    return text_page(document.text, document.url)


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()

"""What travels beside a browser call: the `_meta` keys of its requests and results, and the
citable pages a result lists (what the tool loop needs of the browser, without loading it)."""

from __future__ import annotations

from typing import Any

from serve_app.core.citations import CitedPage

SESSION_META_KEY = "responses_serve/session_id"
ALLOWED_DOMAINS_META_KEY = "responses_serve/allowed_domains"
RESULT_META_KEY = "responses_serve/browser"


def cited_pages(meta: Any) -> dict[int, CitedPage]:
    """The cursor -> page map of a result's `_meta` (the loop's input to `CitationStream`);
    entries of the wrong shape are left out."""
    browser_meta = meta.get(RESULT_META_KEY) if isinstance(meta, dict) else None
    pages = browser_meta.get("pages") if isinstance(browser_meta, dict) else None
    if not isinstance(pages, dict):
        return {}
    out: dict[int, CitedPage] = {}
    for cursor, entry in pages.items():
        if isinstance(cursor, str) and cursor.isdigit() and len(cursor) <= 9 and isinstance(entry, dict):
            url, title = entry.get("url"), entry.get("title")
            if isinstance(url, str) and isinstance(title, str):
                out[int(cursor)] = CitedPage(url=url, title=title)
    return out

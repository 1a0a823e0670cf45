"""A fetched document → a `Page`: the main text of HTML (trafilatura), links numbered.

trafilatura finds the main content and gives it as a small XML tree (`head`, `p`, `list`,
`table`, `ref`, `graphic`, ...); this module writes that tree as the browser's text: headings
as `#`, list items as `  * `, images as `[Image N: alt]`, links as `【id†text†domain】`
(gpt-oss's page format). Links come from `ref` elements only, so no text on a page can pass
for a link, and only http(s) links are numbered.
"""

from __future__ import annotations

import html
import re
from urllib.parse import urlsplit

import trafilatura
from lxml import etree
from trafilatura.settings import Document

from serve_app.core.citations import CitedPage
from serve_app.tools.browser.page import Page, clean_text, domain_of, link_marker, merge_whitespace

HTML_TYPES = ("text/html", "application/xhtml+xml")
TEXT_TYPES = ("text/plain", "text/markdown")
PAGE_TYPES = HTML_TYPES + TEXT_TYPES

_TITLE_RE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)
_BLANK_LINE_RE = re.compile(r"^[ \t]+$", re.MULTILINE)
_EXTRA_NEWLINES_RE = re.compile(r"\n(\s*\n)+")
_BLOCKS = {"head", "p", "list", "table", "quote", "code", "graphic", "div", "lb"}


class _Writer:
    """Writes trafilatura's XML body as page text, numbering links as it goes."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.links: dict[str, str] = {}
        self._ids: dict[str, str] = {}
        self._images = 0

    def blocks(self, element: etree._Element, depth: int = 0) -> list[str]:
        out: list[str] = []
        for child in element:
            tag = child.tag
            if tag == "head":
                level = int(child.get("rend", "h2")[1:] or 2) if str(child.get("rend", "")).startswith("h") else 2
                out.append("#" * max(1, min(level, 6)) + " " + self.inline(child).strip())
            elif tag == "list":
                out.append(self.list_items(child, depth))
            elif tag == "table":
                rows = [" ".join(self.inline(cell).strip() for cell in row) for row in child.iter("row")]
                out.append("\n".join(row for row in rows if row))
            elif tag in ("quote", "code"):
                out.append(clean_text("".join(child.itertext())).strip("\n"))
            elif tag == "graphic":
                out.append(self.image(child))
            elif tag in ("p", "div") or len(child) == 0:
                out.append(self.inline(child).strip())
            else:
                out.extend(self.blocks(child, depth))
        return [block for block in out if block.strip()]

    def list_items(self, element: etree._Element, depth: int) -> str:
        indent = "  " * (depth + 1)
        ordered = element.get("rend") == "ol"
        lines: list[str] = []
        for number, item in enumerate(element.findall("item"), start=1):
            nested = [child for child in item if child.tag == "list"]
            for child in nested:
                item.remove(child)
            bullet = f"{number}." if ordered else "*"
            lines.append(f"{indent}{bullet} {self.inline(item).strip()}")
            lines.extend(self.list_items(child, depth + 1) for child in nested)
        return "\n".join(lines)

    def image(self, element: etree._Element) -> str:
        name = element.get("alt") or element.get("title")
        text = f"[Image {self._images}: {clean_text(merge_whitespace(name))}]" if name else f"[Image {self._images}]"
        self._images += 1
        return text

    def inline(self, element: etree._Element) -> str:
        parts = [merge_whitespace(clean_text(element.text or ""))]
        for child in element:
            if child.tag == "ref":
                parts.append(self.link(child))
            elif child.tag == "lb":
                parts.append("\n")
            elif child.tag == "graphic":
                parts.append(self.image(child))
            else:
                parts.append(self.inline(child))
            parts.append(merge_whitespace(clean_text(child.tail or "")))
        return "".join(parts)

    def link(self, element: etree._Element) -> str:
        text = merge_whitespace(clean_text("".join(element.itertext()))).strip()
        target = (element.get("target") or "").strip()
        if not text or urlsplit(target).scheme not in ("http", "https") or not domain_of(target):
            return text
        link_id = self._ids.get(target)
        if link_id is None:
            link_id = self._ids[target] = str(len(self.links))
            self.links[link_id] = target
        return link_marker(link_id, text, target, self.url)


def _title(document: str, fallback: str | None, url: str) -> str:
    match = _TITLE_RE.search(document[:65536])
    title = merge_whitespace(html.unescape(match.group(1))).strip() if match else ""
    return clean_text(title or fallback or domain_of(url))


def _tidy(text: str) -> str:
    return _EXTRA_NEWLINES_RE.sub("\n\n", _BLANK_LINE_RE.sub("", text)).strip("\n")


def html_page(document: str, url: str) -> Page:
    """The page for an HTML document fetched from `url` (CPU-bound: run it off the event loop)."""
    extracted = trafilatura.bare_extraction(
        document,
        url=url,
        include_links=True,
        include_images=True,
        include_tables=True,
        include_comments=False,
        favor_recall=True,
        with_metadata=True,
    )
    writer = _Writer(url)
    if isinstance(extracted, Document) and extracted.body is not None:
        body = "\n\n".join(writer.blocks(extracted.body))
        title = _title(document, extracted.title, url)
    else:
        body, title = "", _title(document, None, url)
    return _page(url, title, body, writer.links)


def text_page(text: str, url: str, title: str | None = None) -> Page:
    """The page for a plain-text document, or for the source of any page (`view_source`)."""
    return _page(url, clean_text(title or domain_of(url)), clean_text(text), {})


def _page(url: str, title: str, body: str, links: dict[str, str]) -> Page:
    # The page's own URL first, as gpt-oss's browser shows it.
    return Page(url=url, title=title, text=f"\nURL: {url}\n" + _tidy(body), links=links, cite=CitedPage(url=url, title=title))

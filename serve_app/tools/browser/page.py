"""Pages as gpt-oss's browser shows them (the format of openai/gpt-oss `simple_browser`).

A page is text with numbered links: a link reads `【{id}†{text}】` (same domain as the page)
or `【{id}†{text}†{domain}】`. A view of a page is

    [{cursor}] {title} ({url})
    **viewing lines [{first} - {last}] of {total - 1}**

    L{first}: ...

with lines wrapped at 80 characters and, unless the caller asks for a number of lines, as
many lines as fit in `view_tokens` tokens. Search results and `find` results are pages too.
Text from the web never contains the `【`/`】` brackets (they become `〖`/`〗`), so a page
cannot forge a link or a citation.
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
import textwrap
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

import tiktoken
import tiktoken.load

from serve_app.core.citations import CitedPage

WRAP_WIDTH = 80
FIND_MAX_RESULTS = 50
FIND_SHOW_LINES = 4
TRUNCATE_CHARS = 1024

_SPECIAL_CHARS = {"【": "〖", "】": "〗", "◼": "◾", "\u200b": ""}
_SPECIAL_RE = re.compile("|".join(map(re.escape, _SPECIAL_CHARS)))
_SMP_RE = re.compile(r"[\U00010000-\U0001FFFF]")
_WHITESPACE_RE = re.compile(r"\s+")
# Link markers (whole, cut at the start or at the end of a line) for `find`, which shows text without them.
_LINK_RE = re.compile(r"【\d+†(?P<content>[^†】]+)(?:†[^†】]+)?】")
_PARTIAL_START_RE = re.compile(r"^[^【】]*】")
_PARTIAL_END_RE = re.compile(r"【\d*(?:†(?P<content>[^†】]*)(?:†[^†】]*)?)?$")


class ToolUsageError(Exception):
    """The model used the browser wrongly; the message is what it reads."""


_REFERENCE_BYTES = 8  # a list's or dict's reference to each string


@dataclass(frozen=True)
class Snippet:
    """Where a link of a `find` results page points into its page."""

    line: int


@dataclass
class Page:
    url: str
    title: str
    text: str
    links: dict[str, str] = field(default_factory=dict)  # link id -> URL
    snippets: dict[str, Snippet] | None = None  # set on `find` results pages
    cite: CitedPage | None = None  # what a citation of this page's cursor names (None: not citable)

    @functools.cached_property
    def lines(self) -> list[str]:
        return wrap_lines(self.text)

    def size(self) -> int:
        """The bytes of memory the page holds as CPython stores it: its text, the lines it is
        shown in (a text of many short lines holds far more than its characters: `"漢\n"`
        repeated took 42 bytes a character), its links, url and title."""
        strings = itertools.chain((self.text, self.url, self.title), self.lines, self.links.keys(), self.links.values())
        return sum(sys.getsizeof(string) + _REFERENCE_BYTES for string in strings) + sys.getsizeof(self.links)


def clean_text(text: str) -> str:
    """Web text as the model may read it: no link brackets, no characters outside the BMP."""
    return _SPECIAL_RE.sub(lambda m: _SPECIAL_CHARS[m.group(0)], _SMP_RE.sub("", text))


def merge_whitespace(text: str) -> str:
    return _WHITESPACE_RE.sub(" ", text.replace("\n", " "))


def domain_of(url: str) -> str:
    netloc = urlsplit(url).netloc
    return netloc or urlsplit("http://" + url).netloc


def maybe_truncate(text: str, num_chars: int = TRUNCATE_CHARS) -> str:
    return text if len(text) <= num_chars else text[: num_chars - 3] + "..."


def link_marker(link_id: str, text: str, url: str, page_url: str) -> str:
    text = merge_whitespace(text).replace("†", "‡")
    domain = domain_of(url)
    return f"【{link_id}†{text}】" if domain == domain_of(page_url) else f"【{link_id}†{text}†{domain}】"


def wrap_lines(text: str, width: int = WRAP_WIDTH) -> list[str]:
    wrapped = (
        textwrap.wrap(line, width=width, replace_whitespace=False, drop_whitespace=False) if line else [""] for line in text.split("\n")
    )
    return list(itertools.chain.from_iterable(wrapped))


def number_lines(lines: list[str], offset: int) -> str:
    return "\n".join(f"L{i + offset}: {line}" for i, line in enumerate(lines))


# --- how many lines fit in the view: tokens of o200k_base, counted as gpt-oss's browser does ---


@functools.cache
def _encoding() -> tiktoken.Encoding:
    from serve_app.families.vocab import O200K_PATTERN, VOCAB_FILE, ensure_vocabulary

    ranks = tiktoken.load.load_tiktoken_bpe(str(ensure_vocabulary() / VOCAB_FILE))
    return tiktoken.Encoding("o200k_base", pat_str=O200K_PATTERN, mergeable_ranks=ranks, special_tokens={})


@functools.cache
def _token_lengths() -> list[int]:
    encoding = _encoding()
    return [len(encoding.decode([token])) for token in range(encoding.n_vocab)]


def warm_up() -> None:
    """Load the tokenizer and its token lengths (a few seconds) before the first page."""
    _token_lengths()


def _end_line(lines: list[str], loc: int, num_lines: int, view_tokens: int) -> int:
    total = len(lines)
    if num_lines <= 0:
        text = number_lines(lines[loc:], loc)
        num_lines = total
        if len(text) > view_tokens:  # at least one character per token: shorter text fits
            lengths = _token_lengths()
            tokens = _encoding().encode(text[: (view_tokens + 1) * max(lengths)], disallowed_special=())
            if len(tokens) > view_tokens:
                end_char = sum(lengths[token] for token in tokens[:view_tokens])
                num_lines = text[:end_char].count("\n") + 1
    return min(loc + num_lines, total)


def render(page: Page, cursor: int, loc: int = 0, num_lines: int = -1, view_tokens: int = 1024) -> str:
    """The view of `page` from line `loc` that the model reads."""
    lines = page.lines
    if loc >= len(lines):
        raise ToolUsageError(f"Invalid location parameter: `{loc}`. Cannot exceed page maximum of {len(lines) - 1}.")
    end = _end_line(lines, loc, num_lines, view_tokens)
    header = page.title
    if shown_url := maybe_truncate(unquote(page.url)):
        header += f" ({shown_url})"
    scrollbar = f"viewing lines [{loc} - {end - 1}] of {len(lines) - 1}"
    return f"[{cursor}] {header}\n**{scrollbar}**\n\n{number_lines(lines[loc:end], loc)}"


# --- pages made by the browser itself ---


@dataclass(frozen=True)
class SearchResult:
    url: str
    title: str
    snippet: str


def search_results_page(query: str, results: list[SearchResult]) -> Page:
    """The page a search shows: its title is the query; it has no URL of its own."""
    links: dict[str, str] = {}
    items: list[str] = []
    for result in results:
        link_id = next((k for k, v in links.items() if v == result.url), None)
        if link_id is None:
            link_id = str(len(links))
            links[link_id] = result.url
        title = clean_text(result.title).strip() or result.url
        marker = link_marker(link_id, clean_text(title), result.url, "")
        snippet = merge_whitespace(clean_text(result.snippet)).strip()
        items.append(f"  * {marker} {snippet}".rstrip())
    body = "# Search Results\n\n" + "\n".join(items) if items else "# Search Results"
    return Page(url="", title=clean_text(query), text="\nURL: \n" + body, links=links)


def _strip_links(text: str) -> str:
    text = _PARTIAL_START_RE.sub("", text)
    text = _PARTIAL_END_RE.sub(lambda m: m.group("content") or "", text)
    return _LINK_RE.sub(lambda m: m.group("content"), text)


def find_in_page(pattern: str, page: Page) -> Page:
    """The page `find` shows: the lines of `page` that contain `pattern` (any case), with their neighbours."""
    pattern = pattern.lower()
    lines = _strip_links("\n".join(page.lines)).split("\n")
    chunks: list[str] = []
    snippets: dict[str, Snippet] = {}
    line = 0
    while line < len(lines) and len(chunks) < FIND_MAX_RESULTS:
        if pattern not in lines[line].lower():
            line += 1
            continue
        match = str(len(chunks))
        snippet = "\n".join(lines[line : line + FIND_SHOW_LINES])
        chunks.append(f"# 【{match}†match at L{line}】\n{snippet}")
        snippets[match] = Snippet(line=line)
        line += FIND_SHOW_LINES
    text = "\n\n".join(chunks) if chunks else f"No `find` results for pattern: `{pattern}`"
    return Page(
        url=f"{page.url}/find?pattern={quote(pattern)}",
        title=f"Find results for text: `{pattern}` in `{page.title}`",
        text=text,
        links=dict.fromkeys(snippets, page.url),
        snippets=snippets,
        cite=page.cite,
    )

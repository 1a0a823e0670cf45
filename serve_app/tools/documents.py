"""A file's bytes → the text a model reads: PDFs (pypdf) and text formats (plain text,
Markdown, CSV/TSV, JSON, HTML), bounded in pages, characters and time.

Why pypdf: pure Python with no native dependency (nothing to compile, no system library
that differs between images), maintained (releases every few weeks), Apache-licensed
code paths only, and it has the limits a hostile file needs (`pypdf.apply_configuration`:
bytes inflated per stream, entries of the page tree, parsing work per content stream).
pdfplumber and markitdown sit on pdfminer.six (slower, no such limits); docling brings
models and native libraries.

Every file here is hostile: a decompression bomb stops at `max_inflated_bytes` per stream,
a file of thousands of pages is refused by its page count before any page is read, a
malformed one is a `DocumentError` saying so, and the whole extraction runs in a worker
thread of its own pool (`extract_off_loop`) with a deadline it checks between pages: the
event loop never waits on it, and a caller waits at most `timeout_s`.
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import contextlib
import io
import json
import re
import time
from dataclasses import dataclass
from typing import Any

PDF_TYPES = ("application/pdf", "application/x-pdf")
HTML_TYPES = ("text/html", "application/xhtml+xml")
JSON_TYPES = ("application/json", "application/ld+json")
TEXT_TYPES = ("text/plain", "text/markdown", "text/x-markdown", "text/csv", "text/tab-separated-values", *JSON_TYPES, *HTML_TYPES)
SUFFIX_TYPES = {
    ".pdf": "application/pdf",
    ".txt": "text/plain",
    ".text": "text/plain",
    ".log": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".csv": "text/csv",
    ".tsv": "text/tab-separated-values",
    ".json": "application/json",
    ".html": "text/html",
    ".htm": "text/html",
    ".xhtml": "application/xhtml+xml",
}
SUPPORTED = "PDF, plain text, Markdown, CSV, TSV, JSON and HTML"

_WORKERS = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="documents")
_BLOCK_TAGS = ("p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "section", "article", "table")
_BLANK_LINES = re.compile(r"\n\s*\n\s*\n+")


class DocumentError(Exception):
    """The file cannot be given to a model; the message says why (shown to the client)."""


@dataclass(frozen=True, slots=True)
class DocumentLimits:
    max_bytes: int = 32 * 1024 * 1024  # of one file read for a model
    max_pages: int = 500
    max_chars: int = 500_000
    max_inflated_bytes: int = 64 * 1024 * 1024  # of one PDF stream decompressed
    timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Extracted:
    text: str
    media_type: str
    pages: int | None = None  # a PDF's


def media_type_of(data: bytes, filename: str | None, declared: str | None) -> str:
    """What the file is: its bytes' magic (a PDF), the declared type, then its name's suffix."""
    if data[:1024].lstrip()[:5] == b"%PDF-":
        return "application/pdf"
    kind = (declared or "").split(";", 1)[0].strip().lower()
    if kind and kind not in ("application/octet-stream", "binary/octet-stream"):
        return kind
    if filename and "." in filename:
        return SUFFIX_TYPES.get("." + filename.rsplit(".", 1)[1].lower(), "application/octet-stream")
    return "application/octet-stream"


def extract_text(
    data: bytes, *, filename: str | None, content_type: str | None, limits: DocumentLimits, deadline: float | None = None
) -> Extracted:
    """The text of the file (blocking: `extract_off_loop` runs it in a worker thread)."""
    if len(data) > limits.max_bytes:
        raise DocumentError(f"the file has {len(data)} bytes, more than this server reads for a model ({limits.max_bytes})")
    kind = media_type_of(data, filename, content_type)
    if kind in PDF_TYPES:
        text, pages = _pdf_text(data, limits, deadline)
        return Extracted(text, "application/pdf", pages)
    if kind in TEXT_TYPES or kind.startswith("text/"):
        text = _decode(data, content_type)
        if kind in HTML_TYPES:
            text = _html_text(text)
        elif kind in JSON_TYPES:
            try:
                json.loads(text)
            except ValueError as exc:
                raise DocumentError(f"the file is not valid JSON: {exc}") from None
        _check_chars(text, limits)
        return Extracted(text, kind)
    raise DocumentError(f"files of type '{kind}' cannot be read; this server reads {SUPPORTED}")


async def extract_off_loop(data: bytes, *, filename: str | None, content_type: str | None, limits: DocumentLimits) -> Extracted:
    """`extract_text` in a worker thread, within `limits.timeout_s` (waiting for a worker
    included); past it a `DocumentError`."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + limits.timeout_s

    def run() -> Extracted:
        return extract_text(data, filename=filename, content_type=content_type, limits=limits, deadline=deadline)

    try:
        return await asyncio.wait_for(loop.run_in_executor(_WORKERS, run), limits.timeout_s)
    except TimeoutError:
        raise DocumentError(f"reading the file took longer than {limits.timeout_s:g} s (files.input.timeout_s)") from None


def _check_chars(text: str, limits: DocumentLimits) -> None:
    if len(text) > limits.max_chars:
        raise DocumentError(
            f"the file's text has more than {limits.max_chars} characters (files.input.max_chars); send a shorter file or a part of it"
        )


def _decode(data: bytes, content_type: str | None) -> str:
    charset = "utf-8"
    for part in (content_type or "").split(";")[1:]:
        key, _, value = part.partition("=")
        if key.strip().lower() == "charset":
            with contextlib.suppress(LookupError):
                charset = codecs.lookup(value.strip().strip("\"'")).name
    if data.startswith(codecs.BOM_UTF8):
        data, charset = data[3:], "utf-8"
    text = data.decode(charset, errors="replace")
    if "\x00" in text:
        raise DocumentError("the file holds NUL characters: it is not a text file")
    return text


def _html_text(markup: str) -> str:
    from lxml import html as lxml_html

    try:
        tree = lxml_html.document_fromstring(markup)
    except Exception as exc:  # lxml's ParserError, an empty document
        raise DocumentError(f"the HTML cannot be read: {exc}") from None
    for element in tree.xpath("//script|//style|//noscript|//template"):
        element.drop_tree()
    for element in tree.iter(*_BLOCK_TAGS):  # a block's text on lines of its own
        element.tail = "\n" + (element.tail or "")
        if element.tag == "br":
            continue
        element.text = "\n" + (element.text or "")
    text = tree.text_content()
    return _BLANK_LINES.sub("\n\n", "\n".join(line.strip() for line in text.splitlines())).strip()


def _pdf_text(data: bytes, limits: DocumentLimits, deadline: float | None) -> tuple[str, int]:
    import pypdf
    from pypdf.errors import LimitReachedError, PyPdfError

    inflated = limits.max_inflated_bytes
    bounds: dict[str, Any] = {
        "maximum_declared_stream_length": inflated,
        "array_based_stream_maximum_output_length": inflated,
        "jbig2_maximum_output_length": inflated,
        "lzw_maximum_output_length": inflated,
        "run_length_maximum_output_length": inflated,
        "zlib_maximum_output_length": inflated,
        "brotli_maximum_output_length": inflated,
        "flate_maximum_buffer_size": inflated,
        "image_maximum_buffer_size": inflated,
        "stream_decoding_work_maximum_length": 4 * inflated,
        "xfa_decoding_work_maximum_length": 4 * inflated,
        "page_tree_maximum_entries": 2 * limits.max_pages + 64,  # pages and the nodes above them
        "jbig2dec_binary": None,  # never run a program on a client's file
    }
    pieces: list[str] = []
    chars = 0
    try:
        with pypdf.apply_configuration(**_known(pypdf, bounds)):
            reader = pypdf.PdfReader(io.BytesIO(data), strict=False)
            if reader.is_encrypted and not reader.decrypt(""):
                raise DocumentError("the PDF is encrypted with a password")
            pages = len(reader.pages)
            if pages > limits.max_pages:
                raise DocumentError(f"the PDF has more than {limits.max_pages} pages (it has {pages}; files.input.max_pages)")
            for number, page in enumerate(reader.pages, 1):
                if deadline is not None and time.monotonic() > deadline:
                    raise DocumentError(f"reading the PDF took longer than files.input.timeout_s (stopped at page {number} of {pages})")
                text = page.extract_text().replace("\x00", "")
                chars += len(text) + 2
                if chars > limits.max_chars:
                    raise DocumentError(
                        f"the PDF's text has more than {limits.max_chars} characters (files.input.max_chars), "
                        f"passed on page {number} of {pages}; send fewer pages"
                    )
                pieces.append(text.strip())
    except DocumentError:
        raise
    except LimitReachedError as exc:
        if "page tree" in str(exc).lower():
            raise DocumentError(f"the PDF has more than {limits.max_pages} pages (files.input.max_pages)") from None
        raise DocumentError(
            "the PDF passes this server's bounds on decompressed bytes and parsing work (files.input.max_inflated_bytes): " + _short(exc)
        ) from None
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError, OSError, MemoryError) as exc:
        raise DocumentError(f"the file cannot be read as a PDF ({type(exc).__name__}: {_short(exc)})") from None
    return "\n\n".join(piece for piece in pieces if piece), pages


def _known(pypdf: Any, bounds: dict[str, Any]) -> dict[str, Any]:
    """The bounds this pypdf's `Configuration` has (a newer one may rename some)."""
    import dataclasses

    fields = {field.name for field in dataclasses.fields(pypdf.Configuration)}
    return {name: value for name, value in bounds.items() if name in fields}


def _short(exc: BaseException, limit: int = 200) -> str:
    text = str(exc) or "no detail"
    return text if len(text) <= limit else text[:limit] + "…"

"""`input_file` parts read into text before a prompt is rendered, and a file's text for
whoever needs it (`file_text`: the Files API's files as a model reads them).

A part names its file one of three ways: `file_id` (the tenant's own uploads, state/files.py),
`file_data` (base64, a `data:` URL or bare) or `file_url` (fetched through the egress policy
the browser uses: tools/browser/policy.py checks every resolved address and every redirect;
tools/browser/fetch.py bounds time and bytes). The bytes become text in a worker thread
(tools/documents.py), bounded in pages, characters and time; what cannot be read is a 400
naming the part. For a vision model, a PDF in a user message is also drawn as images of its
first pages (tools/pdf_pages.py, in a process of its own within the same time bound; a page
that cannot be drawn is text only, never a 400). Texts and pages are kept per replica by
(tenant, content hash), so a conversation that carries a file along does not extract or draw
it again every turn.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Sequence

from cachetools import LRUCache
from openai.types import FileObject

from serve_app.api.errors import APIError, invalid_request
from serve_app.api.items import (
    ContentPart,
    CustomToolCallOutputItem,
    FilePart,
    FunctionCallOutputItem,
    HistoryItem,
    MessageItem,
)
from serve_app.state.files import FileStore, file_not_found
from serve_app.tools.browser.fetch import Fetcher, FetchError
from serve_app.tools.browser.policy import FetchRefused
from serve_app.tools.documents import PDF_TYPES, DocumentError, DocumentLimits, Extracted, extract_off_loop
from serve_app.tools.pdf_pages import PageBounds, PageImages, render_off_loop

DEFAULT_CACHE_CHARS = 16 * 1024 * 1024
DEFAULT_CACHE_PAGE_BYTES = 64 * 1024 * 1024


class FileCache:
    """What files became for a model, by (tenant, sha256 of the bytes, bounds): extracted texts
    (at most `max_chars` together) and drawn pages (at most `max_page_bytes` of PNG)."""

    def __init__(self, max_chars: int = DEFAULT_CACHE_CHARS, max_page_bytes: int = DEFAULT_CACHE_PAGE_BYTES) -> None:
        self._texts: LRUCache[tuple[str, str], Extracted] = LRUCache(maxsize=max(max_chars, 1), getsizeof=lambda e: len(e.text) + 1)
        self._pages: LRUCache[tuple[str, str], PageImages] = LRUCache(maxsize=max(max_page_bytes, 1), getsizeof=lambda p: p.size)

    def get(self, key: tuple[str, str]) -> Extracted | None:
        return self._texts.get(key)

    def put(self, key: tuple[str, str], extracted: Extracted) -> None:
        if len(extracted.text) + 1 <= self._texts.maxsize:
            self._texts[key] = extracted

    def pages(self, key: tuple[str, str]) -> PageImages | None:
        return self._pages.get(key)

    def put_pages(self, key: tuple[str, str], pages: PageImages) -> None:
        if pages.size <= self._pages.maxsize and not pages.timed_out:  # a busy moment is not the file's fault
            self._pages[key] = pages


def unreadable(param: str, why: str, code: str = "invalid_file") -> APIError:
    return invalid_request(f"The file of '{param}' cannot be given to the model: {why}.", param=param, code=code)


def decode_file_data(data: str, max_bytes: int, param: str) -> tuple[bytes, str | None]:
    """`file_data` (a base64 `data:` URL, or bare base64) → its bytes and declared media type."""
    media_type = None
    payload = data
    if data.startswith("data:"):
        header, comma, payload = data[5:].partition(",")
        if not comma or not header.lower().endswith(";base64"):
            raise unreadable(param, "a 'file_data' data URL must be base64 ('data:<media type>;base64,<data>')")
        media_type = header[: -len(";base64")] or None
    if len(payload) * 3 // 4 > max_bytes + 3:
        raise unreadable(param, f"it has more than {max_bytes} bytes (files.input.max_bytes)", code="file_too_large")
    try:
        return base64.b64decode(payload, validate=True), media_type
    except (binascii.Error, ValueError):
        raise unreadable(param, "'file_data' is not valid base64") from None


def _parts(item: HistoryItem) -> list[ContentPart]:
    if isinstance(item, MessageItem) and isinstance(item.content, list):
        return list(item.content)
    if isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem) and isinstance(item.output, list):
        return list(item.output)
    return []


def _drawn(item: HistoryItem, pages: PageBounds | None) -> PageBounds | None:
    """`pages` for the files of a user message (the messages a vision model sees images in)."""
    return pages if isinstance(item, MessageItem) and item.role == "user" else None


def _part_param(item: HistoryItem, index: int, part: int) -> str:
    field = "content" if isinstance(item, MessageItem) else "output"
    return f"input[{index}].{field}[{part}]"


class FileInputs:
    """One tenant's reader of `input_file` parts: its uploads (`files`), URLs through
    `fetcher` (None: `file_url` refused), within `limits`."""

    def __init__(
        self,
        files: FileStore | None,
        fetcher: Fetcher | None,
        limits: DocumentLimits | None = None,
        cache: FileCache | None = None,
        tenant: str = "",
    ) -> None:
        self.files = files
        self.fetcher = fetcher
        self.limits = limits or DocumentLimits()
        self.cache = cache or FileCache()
        self.tenant = tenant

    async def resolve(self, items: Sequence[HistoryItem], param: str | None = None, pages: PageBounds | None = None) -> None:
        """Read every `input_file` part of a request's own input `items` into text
        (`FilePart._text`); what cannot be read is a 400 (a 404 for a `file_id` the tenant
        has not) naming the part (`param`, else `input[i].content[j]`). `pages`: a vision
        model's, whose PDFs in user messages are also drawn (`FilePart._pages`)."""
        for index, item in enumerate(items):
            for number, part in enumerate(_parts(item)):
                if isinstance(part, FilePart) and part._text is None:
                    name, extracted, drawn = await self.read(part, param or _part_param(item, index, number), _drawn(item, pages))
                    part._text, part._name, part._pages = extracted.text, name, drawn

    async def resolve_history(self, items: Sequence[HistoryItem], pages: PageBounds | None = None) -> None:
        """Read the `input_file` parts of earlier turns again (each turn reads its files as
        they are now, whichever replica serves it); a file no longer there (deleted, expired,
        unreachable) is shown to the model as such instead of failing the turn. `pages`: as
        for `resolve`."""
        for item in items:
            for part in _parts(item):
                if isinstance(part, FilePart):
                    try:
                        name, extracted, drawn = await self.read(part, "input", _drawn(item, pages))
                        part._text, part._name, part._pages = extracted.text, name, drawn
                    except APIError as exc:
                        part._text = f"(this file is no longer available: {exc.message})"

    async def read(self, part: FilePart, param: str, pages: PageBounds | None = None) -> tuple[str, Extracted, PageImages | None]:
        """The name and text of one part's file, or a 400/404 naming `param`; with `pages`, a
        PDF's first pages drawn too (None: not drawn)."""
        if part.file_id is not None:
            file, data = await self._bytes(part.file_id, self.limits.max_bytes, f"{param}.file_id", "files.input.max_bytes")
            return part.filename or file.filename, *await self._read(data, file.filename, None, f"{param}.file_id", pages)
        if part.file_data is not None:
            data, media_type = decode_file_data(part.file_data, self.limits.max_bytes, f"{param}.file_data")
            return part.name, *await self._read(data, part.filename, media_type, f"{param}.file_data", pages)
        assert part.file_url is not None  # FilePart has exactly one source
        where = f"{param}.file_url"
        if self.fetcher is None:
            raise unreadable(where, "this server does not fetch files by URL (files.input.fetch_urls is off)", code="invalid_file_url")
        try:
            fetched = await self.fetcher.fetch_bytes(part.file_url)
        except (FetchRefused, FetchError) as exc:
            raise unreadable(where, f"fetching it failed: {exc}", code="invalid_file_url") from None
        name = part.filename or fetched.url.rsplit("/", 1)[-1].split("?", 1)[0] or part.name
        return name, *await self._read(fetched.data, name, fetched.content_type, where, pages)

    async def file_text(self, file_id: str, *, param: str = "file_id") -> Extracted:
        """The text of the tenant's uploaded file `file_id` as a model reads it (a 404 if the
        tenant has none by that id, a 400 if it cannot be read)."""
        return (await self._uploaded(file_id, param))[1]

    async def uploaded_bytes(self, file_id: str, max_bytes: int, param: str, bound: str = "files.input.max_bytes") -> bytes:
        """The bytes of the tenant's uploaded file `file_id` (an image by `file_id` too): a 404
        if the tenant has none by that id, a 400 `file_too_large` past `max_bytes` (the
        setting `bound`), both naming `param`."""
        return (await self._bytes(file_id, max_bytes, param, bound))[1]

    async def _bytes(self, file_id: str, max_bytes: int, param: str, bound: str) -> tuple[FileObject, bytes]:
        if self.files is None:
            raise file_not_found(file_id, param)
        try:
            found = await self.files.content(file_id, max_bytes)
        except ValueError:
            raise unreadable(param, f"it has more than {max_bytes} bytes ({bound})", code="file_too_large") from None
        if found is None:
            raise file_not_found(file_id, param)
        return found

    async def _uploaded(self, file_id: str, param: str) -> tuple[FileObject, Extracted]:
        file, data = await self._bytes(file_id, self.limits.max_bytes, param, "files.input.max_bytes")
        return file, (await self._read(data, file.filename, None, param, None))[0]

    async def _read(
        self, data: bytes, filename: str | None, media_type: str | None, param: str, pages: PageBounds | None
    ) -> tuple[Extracted, PageImages | None]:
        """The text of `data`, and with `pages` a PDF's pages drawn (once its text is read)."""
        digest = hashlib.sha256(data).hexdigest()
        extracted = await self._extract(data, digest, filename, media_type, param)
        if pages is None or pages.count < 1 or extracted.media_type not in PDF_TYPES:
            return extracted, None
        key = (self.tenant, digest + repr((pages, self.limits.timeout_s)))
        if (known := self.cache.pages(key)) is None:
            known = await render_off_loop(data, pages, self.limits.timeout_s)
            self.cache.put_pages(key, known)
        return extracted, known

    async def _extract(self, data: bytes, digest: str, filename: str | None, media_type: str | None, param: str) -> Extracted:
        key = (self.tenant, digest + repr((filename, media_type, self.limits)))
        if (known := self.cache.get(key)) is not None:
            return known
        try:
            extracted = await extract_off_loop(data, filename=filename, content_type=media_type, limits=self.limits)
        except DocumentError as exc:
            raise unreadable(param, str(exc)) from None
        self.cache.put(key, extracted)
        return extracted

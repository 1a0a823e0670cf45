"""`/v1/files`: upload, list, retrieve, delete, and a file's content; shapes as the `openai`
SDK's `files` resource sends and reads them (`FileObject`, `FileDeleted`, a cursor page).

An upload is admitted within the tenant's quotas from its headers, before its body is read
(`admit`, as `POST /v1/responses`), and read as a stream: the multipart body is parsed as
it arrives (python-multipart's push parser), the file's bytes go to a temporary file on
disk (never held whole in memory), each chunk counted against the replica's request-byte
budget and the tenant's share of it while it is held. Past `files.max_file_bytes` a 413,
past the tenant's bounds a 400 (state/files.py), past `files.upload_timeout_s` a 408.
Then the file goes to the blob store and its metadata to the state store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import unicodedata
from typing import IO, Any, cast, get_args

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from openai.types import FileDeleted, FileObject, FilePurpose
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from serve_app.api.errors import APIError, invalid_request
from serve_app.server.auth import tenant_of
from serve_app.server.context import app_context, tenant_state
from serve_app.server.routes.responses import admit, release
from serve_app.state.blobs import BlobNotFound
from serve_app.state.files import FileStore, file_not_found, file_too_large

router = APIRouter()

# What an upload's purpose may be: the SDK's `FilePurpose` that its `FileObject` can hold
# ("evals" is a purpose to send but not one a FileObject has: refused, not a 500).
PURPOSES = tuple(purpose for purpose in get_args(FilePurpose) if purpose in get_args(FileObject.model_fields["purpose"].annotation))
MAX_FIELD_BYTES = 64 * 1024  # of a form field other than the file
MAX_PARTS = 16
MAX_FILENAME_CHARS = 255
MAX_LIST_LIMIT = 10_000
MIN_EXPIRES_S, MAX_EXPIRES_S = 3600, 30 * 24 * 3600  # OpenAI's bounds of `expires_after.seconds`


def _json(data: str | bytes | dict[str, Any]) -> Response:
    body = data if isinstance(data, (str, bytes)) else json.dumps(data, separators=(",", ":"))
    return Response(body, media_type="application/json")


def _files(request: Request) -> FileStore:
    files = tenant_state(request).files
    if files is None:
        raise APIError("This server keeps no files.", status_code=404, code="not_found")
    return files


class _Upload:
    """The parts of one multipart upload as they arrive: the `file` part's bytes into `spool`
    (`pending` until written), the other fields whole (bounded)."""

    def __init__(self, spool: IO[bytes], max_file_bytes: int) -> None:
        self.spool = spool
        self.max_file_bytes = max_file_bytes
        self.fields: dict[str, bytearray] = {}
        self.filename: str | None = None
        self.file_size = 0
        self.pending: list[bytes] = []
        self.parts = 0
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._headers: dict[str, bytes] = {}
        self._name: str | None = None
        self._is_file = False

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda data, start, end: self._header_field.extend(data[start:end]),
            "on_header_value": lambda data, start, end: self._header_value.extend(data[start:end]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
        }

    def _part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise _bad(f"The upload has more than {MAX_PARTS} form fields.", "file")
        self._headers, self._name, self._is_file = {}, None, False

    def _header_end(self) -> None:
        self._headers[bytes(self._header_field).decode("latin-1").lower()] = bytes(self._header_value)
        self._header_field.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get("content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        self._name = name
        if name == "file":
            if self.filename is not None:
                raise _bad("The upload has more than one 'file'.", "file")
            self._is_file = True
            self.filename = _clean_filename(options.get(b"filename", b"upload").decode("utf-8", "replace"))
        else:
            self.fields[name] = bytearray()

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name is None:
            return
        if self._is_file:
            self.file_size += end - start
            if self.file_size > self.max_file_bytes:
                raise _FileTooLarge(self.file_size)
            self.pending.append(bytes(data[start:end]))
        else:
            field = self.fields[self._name]
            if len(field) + end - start > MAX_FIELD_BYTES:
                raise _bad(f"The form field '{self._name}' is longer than {MAX_FIELD_BYTES} bytes.", self._name)
            field.extend(data[start:end])

    def field(self, name: str) -> str | None:
        value = self.fields.get(name)
        return None if value is None else value.decode("utf-8", "replace").strip()


class _FileTooLarge(Exception):
    def __init__(self, size: int) -> None:
        self.size = size


def _bad(message: str, param: str | None) -> APIError:
    return invalid_request(message, param=param)


def _clean_filename(name: str) -> str:
    """A file name as kept and shown: its last path component, no control characters, bounded."""
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(char for char in name if unicodedata.category(char)[0] != "C").strip()
    return (name or "upload")[:MAX_FILENAME_CHARS]


async def _receive(request: Request, upload: _Upload) -> None:
    """Parse the body into `upload`, spooling the file's bytes as they come."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise _bad("An upload is sent as multipart/form-data with the fields 'file' and 'purpose'.", "file")
    context = app_context(request)
    budget, tenant = context.request_bytes, tenant_of(request.scope)
    try:
        parser = MultipartParser(boundary, cast(Any, upload.callbacks()))
    except (ValueError, MultipartParseError):
        raise _bad("The multipart boundary is not valid.", "file") from None
    async for chunk in request.stream():
        budget.take(len(chunk), tenant)  # held while parsed and written
        try:
            try:
                parser.write(chunk)
            except MultipartParseError as exc:
                raise _bad(f"The multipart body cannot be read: {exc}", "file") from None
            if upload.pending:
                data, upload.pending = b"".join(upload.pending), []
                await asyncio.to_thread(upload.spool.write, data)
        finally:
            budget.give(len(chunk), tenant)
    try:
        parser.finalize()
    except MultipartParseError as exc:
        raise _bad(f"The multipart body cannot be read: {exc}", "file") from None


def _expires_after(upload: _Upload) -> int | None:
    anchor, seconds = upload.field("expires_after[anchor]"), upload.field("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise _bad("'expires_after[anchor]' must be 'created_at'.", "expires_after.anchor")
    if seconds is None or not seconds.isdigit() or not MIN_EXPIRES_S <= int(seconds) <= MAX_EXPIRES_S:
        raise _bad(
            f"'expires_after[seconds]' must be an integer between {MIN_EXPIRES_S} and {MAX_EXPIRES_S}.",
            "expires_after.seconds",
        )
    return int(seconds)


@router.post("/v1/files")
async def create_file(request: Request) -> Response:
    files = _files(request)
    settings = app_context(request).settings.files
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > settings.max_file_bytes + MAX_PARTS * MAX_FIELD_BYTES:
        raise file_too_large(int(declared), files.limits)
    admission = await admit(tenant_state(request))  # before the body: a tenant at its limits sends none
    try:
        with tempfile.TemporaryFile() as spool:
            upload = _Upload(spool, settings.max_file_bytes)
            try:
                async with asyncio.timeout(settings.upload_timeout_s):
                    await _receive(request, upload)
            except TimeoutError:
                raise APIError(
                    f"The upload did not arrive whole within {settings.upload_timeout_s:g} s (files.upload_timeout_s).",
                    status_code=408,
                    code="request_timeout",
                ) from None
            except _FileTooLarge as exc:
                raise file_too_large(exc.size, files.limits) from None
            purpose = upload.field("purpose")
            if purpose is None:
                raise _bad("Missing required parameter: 'purpose'.", "purpose")
            if purpose not in PURPOSES:
                raise _bad(f"Invalid 'purpose': '{purpose[:64]}'. It must be one of {', '.join(PURPOSES)}.", "purpose")
            if upload.filename is None:
                raise _bad("Missing required parameter: 'file'.", "file")
            expires_after_s = _expires_after(upload)
            spool.seek(0)
            file = await files.create(spool, upload.file_size, filename=upload.filename, purpose=purpose, expires_after_s=expires_after_s)
    finally:
        await release(admission)
    return _json(file.model_dump_json())


@router.get("/v1/files")
async def list_files(request: Request) -> Response:
    query = request.query_params
    after, order, limit_text, purpose = (
        query.get("after"),
        query.get("order", "desc"),
        query.get("limit", str(MAX_LIST_LIMIT)),
        query.get("purpose"),
    )
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIST_LIMIT:
        raise _bad(f"Invalid 'limit': '{limit_text[:32]}'. It must be an integer between 1 and {MAX_LIST_LIMIT}.", "limit")
    if order not in ("asc", "desc"):
        raise _bad(f"Invalid 'order': '{order[:32]}'. It must be 'asc' or 'desc'.", "order")
    page = await _files(request).list(after=after, limit=int(limit_text), order=order, purpose=purpose)  # type: ignore[arg-type]  # checked above
    if page is None:
        raise _bad(f"No file with id '{(after or '')[:128]}' to list after.", "after")
    data, has_more = page
    return _json(
        {
            "object": "list",
            "data": [file.model_dump(mode="json") for file in data],
            "first_id": data[0].id if data else None,
            "last_id": data[-1].id if data else None,
            "has_more": has_more,
        }
    )


@router.get("/v1/files/{file_id}")
async def retrieve_file(file_id: str, request: Request) -> Response:
    file = await _files(request).get(file_id)
    if file is None:
        raise file_not_found(file_id)
    return _json(file.model_dump_json())


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request) -> Response:
    if not await _files(request).delete(file_id):
        raise file_not_found(file_id)
    if (vector_stores := tenant_state(request).vector_stores) is not None:  # its chunks go too
        await vector_stores.forget_file(file_id)
    return _json(FileDeleted(id=file_id, object="file", deleted=True).model_dump_json())


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request) -> Response:
    files = _files(request)
    file = await files.get(file_id)
    if file is None:
        raise file_not_found(file_id)
    chunks = files.blobs.chunks(files.blob_key(file_id))
    try:
        first = await anext(chunks, b"")  # a lost content is a 404 before the response starts
    except BlobNotFound:
        raise file_not_found(file_id) from None

    async def body() -> Any:
        async with contextlib.aclosing(chunks):
            yield first
            async for chunk in chunks:
                yield chunk

    return StreamingResponse(body(), media_type="application/octet-stream", headers={"content-length": str(file.bytes)})

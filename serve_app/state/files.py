"""Uploaded files (the Files API; `input_file` by `file_id`): one tenant's metadata in the
store, their contents in a `BlobStore` (state/blobs.py).

Keys, under the tenant's prefix (state/tenancy.py), so another tenant's file id names
nothing of the caller's and gets the 404 a missing id gets:
- `file:{id}`: the `FileObject` (the API's) as JSON, with the file's expiry as its TTL;
- `files`: the ids, oldest first (listing order; an expired id is pruned when met);
- `files:usage`: `[files, bytes]` the tenant holds, for its bounds (`FileLimits`), changed
  by compare-and-set so that concurrent uploads each count.

The blob of file `ID` of tenant `T` is `T/ID`. Upload: the bytes are reserved in the
usage first (a 400 past the tenant's bounds), then the blob is written, then the metadata:
a file is never listed before its content is there. Delete: the metadata first (the file is
gone for every reader), then the blob, then its place in the usage. A file that expires
without a delete leaves its blob and its usage until the tenant's list is next read
(`list`, or an upload that meets the bound: `reconcile`), which prunes it and deletes its
blob.

`text(file_id)` (runtime/files.py) is how the rest of the server reads a file's text.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import IO, Literal

from openai.types import FileObject

from serve_app.api.errors import APIError
from serve_app.state.blobs import BlobNotFound, BlobStore
from serve_app.state.store import Store, StoreUnavailable
from serve_app.state.tenancy import TenantStore

FILES_KEY = "files"
USAGE_KEY = "files:usage"
_CAS_TRIES = 100

DEFAULT_TTL_S = 30 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class FileLimits:
    """What one tenant may upload: bytes per file (413 past it), and files and bytes held
    together (400 past them)."""

    max_file_bytes: int = 512 * 1024 * 1024
    max_tenant_bytes: int = 10 * 1024 * 1024 * 1024
    max_files: int = 10_000


def file_key(file_id: str) -> str:
    return f"file:{file_id}"


def file_not_found(file_id: str, param: str = "file_id") -> APIError:
    return APIError(f"No such File object: {file_id}", status_code=404, param=param, code="not_found")


def file_too_large(size: int, limits: FileLimits) -> APIError:
    return APIError(
        f"The file is larger than this server accepts: {size} bytes, more than {limits.max_file_bytes} (files.max_file_bytes).",
        status_code=413,
        param="file",
        code="file_too_large",
    )


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


class FileStore:
    """One tenant's files: metadata in `store` (under the tenant's prefix), contents in `blobs`."""

    def __init__(
        self, store: Store, tenant: str, blobs: BlobStore, *, limits: FileLimits | None = None, ttl_s: float = DEFAULT_TTL_S
    ) -> None:
        self.tenant = tenant
        self.store = TenantStore(store, tenant)
        self.blobs = blobs
        self.limits = limits or FileLimits()
        self.ttl_s = ttl_s

    def blob_key(self, file_id: str) -> str:
        return f"{self.tenant}/{file_id}"

    # -- usage and its bounds --

    async def _usage(self) -> tuple[bytes | None, int, int]:
        data = await self.store.get(USAGE_KEY)
        if data is None:
            return None, 0, 0
        files, size = json.loads(data)
        return data, int(files), int(size)

    async def _change_usage(self, files: int, size: int, *, enforce: bool) -> bool:
        """Add (files, size) to the tenant's usage; with `enforce`, not past its bounds (False then)."""
        for _ in range(_CAS_TRIES):
            data, held_files, held_bytes = await self._usage()
            new_files, new_bytes = max(held_files + files, 0), max(held_bytes + size, 0)
            if enforce and (new_files > self.limits.max_files or new_bytes > self.limits.max_tenant_bytes):
                return False
            if await self.store.compare_and_set(USAGE_KEY, data, json.dumps([new_files, new_bytes]).encode(), ttl_s=self.ttl_s):
                return True
        raise StoreUnavailable("This tenant's files are being changed by too many requests at once; retry later.")

    async def usage(self) -> tuple[int, int]:
        """(files, bytes) the tenant holds, as counted."""
        _, files, size = await self._usage()
        return files, size

    async def reconcile(self) -> tuple[int, int]:
        """Count the tenant's usage again from its live files (expired ones pruned, their blobs
        deleted): what an upload does before it is refused for the tenant's bounds."""
        files, size = 0, 0
        for file in await self._live_files():
            files, size = files + 1, size + file.bytes
        for _ in range(_CAS_TRIES):
            data, _, _ = await self._usage()
            if await self.store.compare_and_set(USAGE_KEY, data, json.dumps([files, size]).encode(), ttl_s=self.ttl_s):
                break
        return files, size

    async def _reserve(self, size: int) -> None:
        if await self._change_usage(1, size, enforce=True):
            return
        await self.reconcile()
        if await self._change_usage(1, size, enforce=True):
            return
        files, held = await self.usage()
        raise APIError(
            f"This upload would pass the storage this server gives a tenant: {files} files and {held} bytes held, at most "
            f"{self.limits.max_files} files (files.max_files_per_tenant) and {self.limits.max_tenant_bytes} bytes "
            "(files.max_bytes_per_tenant). Delete files you no longer need.",
            status_code=400,
            param="file",
            code="storage_limit_exceeded",
        )

    # -- writes --

    async def create(
        self,
        data: IO[bytes],
        size: int,
        *,
        filename: str,
        purpose: str,
        expires_after_s: int | None = None,
    ) -> FileObject:
        """Store an upload (`size` bytes read from `data`) as a new file of the tenant."""
        if size > self.limits.max_file_bytes:
            raise file_too_large(size, self.limits)
        now = int(time.time())
        ttl_s = self.ttl_s if expires_after_s is None else min(float(expires_after_s), self.ttl_s)
        file = FileObject(
            id=new_file_id(),
            object="file",
            bytes=size,
            created_at=now,
            filename=filename,
            purpose=purpose,
            status="processed",
            expires_at=now + int(ttl_s),
        )
        await self._reserve(size)
        try:
            await self.blobs.put(self.blob_key(file.id), data, size)
            await self.store.put(file_key(file.id), file.model_dump_json().encode(), ttl_s=ttl_s)
            await self.store.append(FILES_KEY, [file.id.encode()], ttl_s=self.ttl_s)
        except BaseException:
            await self._forget(file)
            raise
        return file

    async def _forget(self, file: FileObject) -> None:
        """Undo what an upload that failed part-way did (as far as the stores let us)."""
        with contextlib.suppress(StoreUnavailable, OSError):
            await self.store.delete(file_key(file.id))
        with contextlib.suppress(StoreUnavailable, OSError):
            await self.blobs.delete(self.blob_key(file.id))
        with contextlib.suppress(StoreUnavailable, OSError):
            await self.store.remove(FILES_KEY, file.id.encode())
        with contextlib.suppress(StoreUnavailable, OSError):
            await self._change_usage(-1, -file.bytes, enforce=False)

    async def delete(self, file_id: str) -> bool:
        """Delete the file and its content; False if the tenant has no such file."""
        data = await self.store.get(file_key(file_id))
        if data is None or not await self.store.delete(file_key(file_id)):
            return False
        file = FileObject.model_validate_json(data)
        await self.blobs.delete(self.blob_key(file_id))
        await self.store.remove(FILES_KEY, file_id.encode())
        await self._change_usage(-1, -file.bytes, enforce=False)
        return True

    # -- reads --

    async def get(self, file_id: str) -> FileObject | None:
        data = await self.store.get(file_key(file_id))
        return None if data is None else FileObject.model_validate_json(data)

    async def content(self, file_id: str, max_bytes: int) -> tuple[FileObject, bytes] | None:
        """The file and its whole content; None if the tenant has no such file (or its content
        was lost); `ValueError` if it has more than `max_bytes`."""
        file = await self.get(file_id)
        if file is None:
            return None
        if file.bytes > max_bytes:
            raise ValueError(f"it has {file.bytes} bytes, more than {max_bytes}")
        try:
            return file, await self.blobs.read(self.blob_key(file_id), max_bytes)
        except BlobNotFound:
            return None

    async def _prune(self, file_id: str) -> None:
        """An id whose metadata expired: its blob and its place go (its usage is counted again by `reconcile`)."""
        if await self.store.remove(FILES_KEY, file_id.encode()):
            await self.blobs.delete(self.blob_key(file_id))

    async def _live_files(self) -> list[FileObject]:
        files: list[FileObject] = []
        for raw in await self.store.range(FILES_KEY):
            file_id = raw.decode()
            file = await self.get(file_id)
            if file is None:
                await self._prune(file_id)
            else:
                files.append(file)
        return files

    async def list(
        self, *, after: str | None, limit: int, order: Literal["asc", "desc"], purpose: str | None = None
    ) -> tuple[list[FileObject], bool] | None:
        """A page of the tenant's files (and whether more follow), oldest first for `asc`;
        None if `after` is not one of its files."""
        ids = [raw.decode() for raw in await self.store.range(FILES_KEY)]
        if order == "desc":
            ids.reverse()
        start = 0
        if after is not None:
            if after not in ids:
                return None
            start = ids.index(after) + 1
        page: list[FileObject] = []
        for file_id in ids[start:]:
            file = await self.get(file_id)
            if file is None:
                await self._prune(file_id)
                continue
            if purpose is not None and file.purpose != purpose:
                continue
            if len(page) == limit:
                return page, True
            page.append(file)
        return page, False

"""Where the contents of uploaded files live: one `BlobStore` interface, two backends.

- `LocalBlobStore`: a directory (the default; one machine, or a filesystem every ingress
  replica mounts: NFS, a ReadWriteMany volume). A blob is written to a temporary file beside
  its final name and renamed into place, so a reader sees it whole or not at all.
- `S3BlobStore`: an S3-compatible object store (MinIO, AWS S3, Ceph RGW, ...) through the
  `minio` client: what a cluster whose ingress replicas span machines uses.

A blob's key is chosen by its caller (`state/files.py`: `TENANT/FILE_ID`) and holds only
`[A-Za-z0-9_.-]` and `/`; `put` takes a seekable binary file (an upload spooled to disk, never
held whole in memory) and its size. Both backends are blocking libraries: every call runs in
a worker thread, bounded by `timeout_s`, so the event loop never waits on a disk or the network.
Failures are `StoreUnavailable` (a 503 with `Retry-After`); a key that is not there is
`BlobNotFound`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import tempfile
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol, TypeVar, cast, runtime_checkable

from serve_app.state.store import StoreUnavailable

logger = logging.getLogger(__name__)

T = TypeVar("T")

CHUNK_BYTES = 256 * 1024  # what a read hands over at a time
_KEY = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")


class BlobNotFound(Exception):
    """No blob at this key (never written, deleted, or lost)."""


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key) or any(part in (".", "..") for part in key.split("/")):
        raise ValueError(f"not a blob key: {key!r}")
    return key


@runtime_checkable
class BlobStore(Protocol):
    async def put(self, key: str, data: IO[bytes], size: int) -> None:
        """Store `size` bytes read from `data` (from its current position) at `key`, replacing
        what was there; the blob is visible only once whole."""

    def chunks(self, key: str) -> AsyncGenerator[bytes, None]:
        """The blob's bytes, a chunk at a time (`BlobNotFound` on the first step if absent)."""

    async def read(self, key: str, max_bytes: int) -> bytes:
        """The whole blob, if it has at most `max_bytes` (else `ValueError`); `BlobNotFound`."""

    async def delete(self, key: str) -> bool:
        """Remove the blob; True if there was one."""

    async def close(self) -> None:
        """Release connections (idempotent)."""


class _Threaded:
    """Runs a backend's blocking calls in worker threads, within `timeout_s`."""

    what = "The file store"

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    async def _run(self, call: Callable[[], T]) -> T:
        try:
            return await asyncio.wait_for(asyncio.to_thread(call), self.timeout_s)
        except TimeoutError:
            raise StoreUnavailable(f"{self.what} did not answer within {self.timeout_s:g} s; retry later.") from None
        except (BlobNotFound, ValueError, StoreUnavailable):
            raise
        except Exception as exc:
            logger.exception("the file store failed")
            raise StoreUnavailable(f"{self.what} failed ({type(exc).__name__}); retry later.") from exc


class LocalBlobStore(_Threaded):
    """Blobs as files under `root` (created if missing)."""

    def __init__(self, root: str | os.PathLike[str], timeout_s: float = 30.0) -> None:
        super().__init__(timeout_s)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    async def put(self, key: str, data: IO[bytes], size: int) -> None:
        path = self._path(key)

        def write() -> None:
            _check_size(data, size)
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(prefix=".upload-", dir=path.parent)
            try:
                with os.fdopen(handle, "wb") as out:
                    copied = _copy(data, out, size)
                if copied != size:
                    raise ValueError(f"the upload has {copied} bytes, not {size}")
                os.replace(temporary, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise

        await self._run(write)

    async def chunks(self, key: str) -> AsyncGenerator[bytes, None]:
        path = self._path(key)

        def opened() -> IO[bytes]:
            try:
                return open(path, "rb")
            except FileNotFoundError:
                raise BlobNotFound(key) from None

        handle = await self._run(opened)
        try:
            while chunk := await self._run(functools.partial(handle.read, CHUNK_BYTES)):
                yield chunk
        finally:
            handle.close()

    async def read(self, key: str, max_bytes: int) -> bytes:
        path = self._path(key)

        def read() -> bytes:
            try:
                with open(path, "rb") as handle:
                    data = handle.read(max_bytes + 1)
            except FileNotFoundError:
                raise BlobNotFound(key) from None
            if len(data) > max_bytes:
                raise ValueError(f"larger than {max_bytes} bytes")
            return data

        return await self._run(read)

    async def delete(self, key: str) -> bool:
        path = self._path(key)

        def delete() -> bool:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
            return True

        return await self._run(delete)

    async def close(self) -> None:
        pass


def _check_size(data: IO[bytes], size: int) -> None:
    """`data` holds exactly `size` bytes from its position on (a blob is stored whole or not at all)."""
    start = data.tell()
    end = data.seek(0, os.SEEK_END)
    data.seek(start)
    if end - start != size:
        raise ValueError(f"the upload has {end - start} bytes, not {size}")


def _copy(source: IO[bytes], target: IO[bytes], size: int) -> int:
    copied = 0
    while copied < size and (chunk := source.read(min(CHUNK_BYTES, size - copied))):
        target.write(chunk)
        copied += len(chunk)
    return copied


class S3BlobStore(_Threaded):
    """Blobs as objects in `bucket` of an S3-compatible server (created if missing), under
    `prefix` (apps sharing a bucket differ here). `endpoint`: `host:port`; `secure`: https."""

    what = "The file store (S3)"

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        *,
        access_key: str | None,
        secret_key: str | None,
        secure: bool = True,
        region: str | None = None,
        prefix: str = "",
        timeout_s: float = 30.0,
    ) -> None:
        import urllib3
        from minio import Minio

        super().__init__(timeout_s)
        self.bucket = bucket
        self.prefix = prefix
        # Fail fast: the caller retries; minio's default pool retries for minutes.
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=min(timeout_s, 5.0), read=timeout_s),
            retries=urllib3.Retry(total=2, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]),
            maxsize=16,
        )
        self.client = Minio(endpoint, access_key=access_key, secret_key=secret_key, secure=secure, region=region, http_client=http)
        self._bucket_checked = False

    def _name(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _ensure_bucket(self) -> None:
        if not self._bucket_checked:
            if not self.client.bucket_exists(bucket_name=self.bucket):
                with contextlib.suppress(Exception):  # another replica made it meanwhile: checked again below
                    self.client.make_bucket(bucket_name=self.bucket)
                if not self.client.bucket_exists(bucket_name=self.bucket):
                    raise StoreUnavailable(f"The file store's bucket '{self.bucket}' does not exist and could not be made.")
            self._bucket_checked = True

    def _missing(self, exc: Exception) -> bool:
        from minio.error import S3Error

        return isinstance(exc, S3Error) and exc.code in ("NoSuchKey", "NoSuchObject", "NoSuchBucket")

    async def put(self, key: str, data: IO[bytes], size: int) -> None:
        name = self._name(key)

        def put() -> None:
            _check_size(data, size)
            self._ensure_bucket()
            self.client.put_object(
                bucket_name=self.bucket, object_name=name, data=cast(BinaryIO, data), length=size, part_size=16 * 1024 * 1024
            )

        await self._run(put)

    async def chunks(self, key: str) -> AsyncGenerator[bytes, None]:
        name = self._name(key)

        def open_object() -> Any:
            try:
                self._ensure_bucket()
                return self.client.get_object(bucket_name=self.bucket, object_name=name)
            except Exception as exc:
                if self._missing(exc):
                    raise BlobNotFound(key) from None
                raise

        response = await self._run(open_object)
        try:
            while chunk := await self._run(functools.partial(response.read, CHUNK_BYTES)):
                yield chunk
        finally:
            response.close()
            response.release_conn()

    async def read(self, key: str, max_bytes: int) -> bytes:
        chunks: list[bytes] = []
        size = 0
        async with contextlib.aclosing(self.chunks(key)) as stream:
            async for chunk in stream:
                size += len(chunk)
                if size > max_bytes:
                    raise ValueError(f"larger than {max_bytes} bytes")
                chunks.append(chunk)
        return b"".join(chunks)

    async def delete(self, key: str) -> bool:
        name = self._name(key)

        def delete() -> bool:
            self._ensure_bucket()
            try:
                self.client.stat_object(bucket_name=self.bucket, object_name=name)
            except Exception as exc:
                if self._missing(exc):
                    return False
                raise
            self.client.remove_object(bucket_name=self.bucket, object_name=name)
            return True

        return await self._run(delete)

    async def close(self) -> None:
        pass

"""Uploaded files on every backend: the blob stores (a directory; S3 against a real
S3-compatible server in its own process) behind one contract, and the files' metadata in
each state store (memory, embedded, Redis, Redis as Kubernetes runs it) through `FileStore`:
tenancy, bounds per file and per tenant, listing, deletes that remove the content."""

from __future__ import annotations

import io
import uuid

import pytest

from serve_app.api.errors import APIError
from serve_app.state import MemoryStore
from serve_app.state.blobs import BlobNotFound, BlobStore, LocalBlobStore, S3BlobStore
from serve_app.state.files import FileLimits, FileStore

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["local", "s3"])
async def blobs(request, tmp_path) -> BlobStore:
    if request.param == "local":
        return LocalBlobStore(tmp_path / "blobs")
    server = request.getfixturevalue("s3_server")
    return S3BlobStore(
        server.endpoint,
        "files-test",
        access_key=server.access_key,
        secret_key=server.secret_key,
        secure=False,
        region="us-east-1",
        prefix=f"test-{uuid.uuid4().hex}/",
    )


async def _chunks(blobs: BlobStore, key: str) -> bytes:
    return b"".join([chunk async for chunk in blobs.chunks(key)])


async def test_a_blob_is_stored_read_streamed_and_deleted(blobs):
    data = bytes(range(256)) * 4096  # 1 MiB: several chunks
    await blobs.put("tenant/file-1", io.BytesIO(data), len(data))
    assert await blobs.read("tenant/file-1", len(data)) == data
    assert await _chunks(blobs, "tenant/file-1") == data
    with pytest.raises(ValueError, match="larger than"):
        await blobs.read("tenant/file-1", len(data) - 1)
    await blobs.put("tenant/file-1", io.BytesIO(b"replaced"), 8)
    assert await blobs.read("tenant/file-1", 100) == b"replaced"
    assert await blobs.delete("tenant/file-1")
    assert not await blobs.delete("tenant/file-1")
    with pytest.raises(BlobNotFound):
        await blobs.read("tenant/file-1", 100)
    with pytest.raises(BlobNotFound):
        await _chunks(blobs, "tenant/file-1")


async def test_an_upload_shorter_than_announced_stores_nothing(blobs):
    with pytest.raises(ValueError, match=r"not 10|length|size|bytes"):
        await blobs.put("tenant/short", io.BytesIO(b"short"), 10)
    with pytest.raises(BlobNotFound):
        await blobs.read("tenant/short", 100)


@pytest.mark.parametrize("key", ["../x", "t/../../x", "/abs", "a//b", "a/./b", "t/x y", ""])
async def test_keys_never_leave_the_store(blobs, key):
    with pytest.raises(ValueError, match="not a blob key"):
        await blobs.put(key, io.BytesIO(b""), 0)


# --- FileStore over every state store ---


def _files(store, blobs: BlobStore, tenant: str = "alice", **limits) -> FileStore:
    return FileStore(store, tenant, blobs, limits=FileLimits(**limits) if limits else None)


async def _create(files: FileStore, data: bytes, name: str = "a.txt", purpose: str = "user_data"):
    return await files.create(io.BytesIO(data), len(data), filename=name, purpose=purpose)


async def test_files_are_kept_listed_and_deleted_with_their_content(store, tmp_path):
    blobs = LocalBlobStore(tmp_path)
    files = _files(store, blobs)
    created = [await _create(files, f"file {n}".encode(), f"f{n}.txt", "assistants" if n == 1 else "user_data") for n in range(3)]
    assert await files.get(created[0].id) == created[0]
    page, more = await files.list(after=None, limit=2, order="asc")
    assert [f.id for f in page] == [created[0].id, created[1].id]
    assert more
    page, more = await files.list(after=created[1].id, limit=2, order="asc")
    assert [f.id for f in page] == [created[2].id]
    assert not more
    assert [f.id for f in (await files.list(after=None, limit=10, order="desc"))[0]] == [f.id for f in reversed(created)]
    assert [f.id for f in (await files.list(after=None, limit=10, order="asc", purpose="assistants"))[0]] == [created[1].id]
    assert await files.list(after="file-nope", limit=10, order="asc") is None
    assert await files.usage() == (3, sum(f.bytes for f in created))
    found = await files.content(created[1].id, 1000)
    assert found is not None
    assert found[1] == b"file 1"
    assert await files.delete(created[1].id)
    assert not await files.delete(created[1].id)
    assert await files.get(created[1].id) is None
    assert not (tmp_path / "alice" / created[1].id).exists()  # its content went with it
    assert await files.usage() == (2, sum(f.bytes for f in created) - created[1].bytes)


async def test_a_tenant_never_reaches_anothers_files(store, tmp_path):
    blobs = LocalBlobStore(tmp_path)
    alice, bob = _files(store, blobs, "alice"), _files(store, blobs, "bob")
    secret = await _create(alice, b"alice's")
    assert await bob.get(secret.id) is None
    assert await bob.content(secret.id, 1000) is None
    assert not await bob.delete(secret.id)
    assert (await bob.list(after=None, limit=10, order="asc"))[0] == []
    assert await alice.get(secret.id) == secret


async def test_bounds_per_file_and_per_tenant(store, tmp_path):
    files = _files(store, LocalBlobStore(tmp_path), max_file_bytes=100, max_tenant_bytes=150, max_files=2)
    with pytest.raises(APIError) as error:
        await _create(files, b"x" * 101)
    assert (error.value.status_code, error.value.code) == (413, "file_too_large")
    first = await _create(files, b"x" * 100)
    with pytest.raises(ValueError, match="more than 99"):  # what a model may read of it is bounded too
        await files.content(first.id, 99)
    with pytest.raises(APIError) as error:
        await _create(files, b"y" * 60)  # 160 bytes together
    assert (error.value.status_code, error.value.code, error.value.param) == (400, "storage_limit_exceeded", "file")
    await _create(files, b"y" * 50)
    with pytest.raises(APIError, match="2 files"):  # the count
        await _create(files, b"z")
    assert await files.delete(first.id)
    await _create(files, b"z" * 100)
    assert await files.usage() == (2, 150)


async def test_an_expired_file_is_pruned_and_its_place_given_back(tmp_path):
    now = [1000.0]
    store = MemoryStore(clock=lambda: now[0])
    files = FileStore(store, "alice", LocalBlobStore(tmp_path), limits=FileLimits(max_tenant_bytes=100))
    short = await files.create(io.BytesIO(b"x" * 80), 80, filename="a", purpose="user_data", expires_after_s=3600)
    now[0] += 3601  # its metadata's TTL passes
    assert await files.get(short.id) is None
    await _create(files, b"y" * 80)  # the bound is counted again: the expired file is gone
    assert not (tmp_path / "alice" / short.id).exists()
    assert await files.usage() == (1, 80)

"""Vector stores without HTTP (runtime/vector_stores.py): ingestion off the event loop,
statuses, per-tenant stores, deletes that remove index entries, expiry, batches."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from serve_app.api.errors import APIError
from serve_app.api.filters import ComparisonFilter
from serve_app.api.vector_stores import ChunkingStrategy, StaticChunking
from serve_app.retrieval.embeddings import HashingEmbedder
from serve_app.retrieval.index import EmbeddedIndex
from serve_app.retrieval.stores import VectorStoreRecords
from serve_app.runtime.vector_stores import FileUnreadable, VectorStores
from serve_app.state.memory import MemoryStore
from serve_app.state.tenancy import TenantStore
from tests.support.postgres_server import postgres

FILES = {
    "file-zebra": ("zebras.txt", "Zebras migrate across the Serengeti every July. " * 40),
    "file-budget": ("budget.md", "The marketing budget for 2025 is four million euros. " * 40),
    "file-empty": ("empty.txt", "   "),
}


async def _read(file_id: str) -> tuple[str, str]:
    if file_id == "file-pdf-broken":
        raise FileUnreadable("invalid_file", "The PDF cannot be read.")
    if file_id not in FILES:
        raise APIError(f"No such File object: {file_id}", status_code=404, param="file_id", code="not_found")
    return FILES[file_id]


class WordTokens:
    """Words and the spaces before them as tokens (chunking's own tests use a real tokenizer)."""

    def offsets(self, text: str) -> list[tuple[int, int]]:
        return [m.span() for m in re.finditer(r"\s*\S+|\s+$", text)]


@pytest.fixture
def tokenizer() -> WordTokens:
    return WordTokens()


@pytest.fixture(scope="module")
def pg_url():
    with postgres() as url:
        yield url


@pytest.fixture(params=["embedded", "pgvector"])
def backend(request, tmp_path: Path):
    if request.param == "embedded":
        return EmbeddedIndex(tmp_path, 128)
    from serve_app.retrieval.pgvector import PgVectorIndex

    return PgVectorIndex(request.getfixturevalue("pg_url"), 128, table=f"service_{abs(hash(tmp_path)) % 10**8}")


def _service(index, tokenizer) -> VectorStores:
    return VectorStores(index, HashingEmbedder(128), lambda: tokenizer)


def test_files_are_ingested_searched_and_deleted(backend, tokenizer) -> None:
    async def main() -> None:
        service = _service(backend, tokenizer)
        store = MemoryStore()
        charged: list[int] = []

        async def charge(tokens: int) -> None:
            charged.append(tokens)

        alice = service.for_tenant(VectorStoreRecords(TenantStore(store, "alice")), _read, charge)
        bob = service.for_tenant(VectorStoreRecords(TenantStore(store, "bob")), _read)
        small = ChunkingStrategy(type="static", static=StaticChunking(max_chunk_size_tokens=100, chunk_overlap_tokens=20))
        vs = await alice.create(
            name="docs", file_ids=["file-zebra", "file-budget", "file-empty", "file-missing", "file-pdf-broken"], chunking=small
        )
        assert vs.file_counts.total == 5
        await service.ingestion.drained()
        vs = await alice.records.existing(vs.id)
        assert (vs.file_counts.completed, vs.file_counts.failed, vs.status) == (2, 3, "completed")
        assert vs.usage_bytes > 0
        assert sum(charged) > 0
        failed = {f.id: f.last_error for f in await alice.records.files(vs.id) if f.status == "failed"}
        assert failed["file-missing"].code == "invalid_file"
        assert failed["file-pdf-broken"].message == "The PDF cannot be read."
        hits = await alice.search([vs.id], "When do zebras migrate?", max_results=3)
        assert hits
        assert hits[0].file_id == "file-zebra"
        assert hits[0].filename == "zebras.txt"
        # another tenant's store is a 404, whatever it asks
        for call in (bob.search([vs.id], "zebras"), bob.file(vs.id, "file-zebra"), bob.attach(vs.id, "file-zebra")):
            with pytest.raises(APIError) as refused:
                await call
            assert refused.value.status_code == 404
        assert await bob.delete(vs.id) is False
        # attributes filter; a detached file's chunks are gone from the index
        await alice.update_file(vs.id, "file-budget", {"dept": "marketing"})
        only = await alice.search([vs.id], "zebras budget", filters=ComparisonFilter(key="dept", type="eq", value="marketing"))
        assert {h.file_id for h in only} == {"file-budget"}
        assert await alice.detach(vs.id, "file-zebra")
        assert all(h.file_id != "file-zebra" for h in await alice.search([vs.id], "zebras migrate", max_results=50))
        namespace = VectorStores.namespace(alice.records, vs.id)
        assert await alice.delete(vs.id)
        assert await service.index.count(namespace) == 0
        with pytest.raises(APIError) as gone:
            await alice.search([vs.id], "budget")
        assert gone.value.status_code == 404
        await service.aclose()

    asyncio.run(main())


def test_an_expired_store_is_refused_and_batches_report_their_files(backend, tokenizer) -> None:
    async def main() -> None:
        service = _service(backend, tokenizer)
        alice = service.for_tenant(VectorStoreRecords(TenantStore(MemoryStore(), "alice")), _read)
        vs = await alice.create(name="short", expires_after={"anchor": "last_active_at", "days": 1})
        assert vs.expires_at is not None
        assert vs.expires_at >= time.time() + 86_000
        batch = await alice.create_batch(
            vs.id, [("file-zebra", {"k": 1}, ChunkingStrategy(type="auto")), ("file-missing", None, ChunkingStrategy(type="auto"))]
        )
        assert batch.file_counts.total == 2
        await service.ingestion.drained()
        batch, _files = await alice.batch_files(vs.id, batch.id)
        assert (batch.status, batch.file_counts.completed, batch.file_counts.failed) == ("completed", 1, 1)
        expired = (await alice.records.existing(vs.id)).model_copy(update={"expires_at": int(time.time()) - 1})
        await alice.records._put_store(expired)
        assert (await alice.records.existing(vs.id)).status == "expired"
        with pytest.raises(APIError) as refused:
            await alice.search([vs.id], "zebras")
        assert refused.value.status_code == 400
        assert refused.value.param == "vector_store_id"
        await service.aclose()

    asyncio.run(main())


def test_the_service_ingests_again_after_it_was_closed_on_another_event_loop(tmp_path: Path, tokenizer) -> None:
    """An app's lifespan ends (`aclose`) and a new one starts on another event loop (an app
    started twice in one process, as in-process tests do): files are ingested there too."""
    service = _service(EmbeddedIndex(tmp_path, 128), tokenizer)
    alice = service.for_tenant(VectorStoreRecords(TenantStore(MemoryStore(), "alice")), _read)

    async def ingest_one() -> str:
        vs = await alice.create(name="docs", file_ids=["file-zebra"])
        await service.ingestion.drained()
        status = (await alice.records.existing(vs.id)).status
        await service.aclose()
        return status

    assert asyncio.run(ingest_one()) == "completed"
    assert asyncio.run(ingest_one()) == "completed"


def test_a_file_search_tool_names_only_the_callers_live_stores(tmp_path: Path, tokenizer) -> None:
    """`check_file_search`: the caller's stores pass; another tenant's or a made-up id is the
    404 the Vector Stores API answers, an expired one its 400, each naming where it is; on a
    server without vector stores the tool is not checked (it is left out of the response)."""
    from serve_app.api.request import ResponsesRequest
    from serve_app.runtime.vector_stores import check_file_search

    async def main() -> None:
        service = _service(EmbeddedIndex(tmp_path, 128), tokenizer)
        store = MemoryStore()
        alice = service.for_tenant(VectorStoreRecords(TenantStore(store, "alice")), _read)
        bob = service.for_tenant(VectorStoreRecords(TenantStore(store, "bob")), _read)
        mine, theirs = (await alice.create(name="a")).id, (await bob.create(name="b")).id
        old = await alice.create(name="old", expires_after={"anchor": "last_active_at", "days": 1})
        await alice.records._put_store(old.model_copy(update={"expires_at": int(time.time()) - 1}))

        def asking(*ids: str) -> ResponsesRequest:
            tools = [{"type": "function", "name": "f"}, {"type": "file_search", "vector_store_ids": list(ids)}]
            return ResponsesRequest.model_validate({"model": "m", "input": "x", "tools": tools})

        await check_file_search(asking(mine), alice)
        await check_file_search(asking(theirs, "vs_made_up"), None)
        for ids, status, code in (
            ((mine, theirs), 404, "not_found"),
            ((mine, "vs_made_up"), 404, "not_found"),
            ((mine, old.id), 400, "vector_store_expired"),
        ):
            with pytest.raises(APIError) as refused:
                await check_file_search(asking(*ids), alice)
            assert (refused.value.status_code, refused.value.code, refused.value.param) == (status, code, "tools[1].vector_store_ids[1]")
            assert ids[1] in refused.value.message

    asyncio.run(main())

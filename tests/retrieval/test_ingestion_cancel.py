"""A cancelled file batch's files, and files waiting in a long queue (runtime/vector_stores.py
`Ingestion`, retrieval/stores.py's stale rule).

- Cancelling a batch cancels its files not yet ingested: a queued file is skipped by the
  worker (its place given back the moment the cancel reaches its replica; on another replica
  when the worker reaches it), a file at a worker is dropped at its next step, and a file
  whose chunks were already indexed has them removed. None is ever `completed`, none of their
  chunks is searchable, whichever replica takes the cancel and whenever it lands.
- A file waiting in the queue reads `in_progress` for as long as the replica holding it is
  alive, however long the queue; a file reads `failed` once its replica is gone (its queue's
  lease lapsed) or its ingestion started more than `stale_after_s` ago.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.api.vector_stores import ChunkingStrategy
from serve_app.retrieval.embeddings import HashingEmbedder, Vectors
from serve_app.retrieval.index import EmbeddedIndex, IndexedChunk
from serve_app.retrieval.stores import VectorStoreRecords
from serve_app.runtime.vector_stores import QUEUE_LEASE_S, TenantVectorStores, VectorStoreLimits, VectorStores
from serve_app.state.memory import MemoryStore
from serve_app.state.redis import RedisStore
from serve_app.state.store import Store
from serve_app.state.tenancy import TenantStore
from tests.retrieval.test_ingestion_shares import NetworkedStore, _until
from tests.retrieval.test_vector_stores_service import WordTokens

AUTO = ChunkingStrategy(type="auto")
TIMEOUT_S = 600.0


async def _read(file_id: str) -> tuple[str, str]:
    """Every file is one chunk of its own words; `file-gate-N` waits at the embedder for gate N."""
    words = f"{file_id.replace('-', ' ')} holds these searchable words about zebras. " * 4
    return f"{file_id}.txt", words


class Gates(HashingEmbedder):
    """The hashing model, except that a text of `file-gate-N` waits until gate N opens."""

    def __init__(self) -> None:
        super().__init__(64)
        self.gates: dict[int, asyncio.Event] = {}

    def gate(self, number: int) -> asyncio.Event:
        return self.gates.setdefault(number, asyncio.Event())

    async def embed(self, texts: Sequence[str]) -> Vectors:
        for text in texts:
            if match := re.search(r"file gate (\d+) ", text):
                await self.gate(int(match[1])).wait()
        return await super().embed(texts)


class HookedIndex(EmbeddedIndex):
    """The embedded index, running `after_add` once a file's chunks are in (a cancel that lands
    between the worker's add and its status write)."""

    after_add: Callable[[], Awaitable[None]] | None = None

    async def add(self, namespace: str, chunks: Sequence[IndexedChunk], vectors: Vectors) -> None:
        await super().add(namespace, chunks, vectors)
        if self.after_add is not None:
            hook, self.after_add = self.after_add, None
            await hook()


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _service(index: EmbeddedIndex, embedder: HashingEmbedder, *, workers: int = 1, per_tenant: int | None = 8) -> VectorStores:
    limits = VectorStoreLimits(ingest_timeout_s=TIMEOUT_S)
    return VectorStores(index, embedder, lambda: WordTokens(), limits, workers=workers, queue=50, per_tenant=per_tenant)


def _alice(service: VectorStores, store: Store, clock: Clock | None = None) -> TenantVectorStores:
    records = VectorStoreRecords(TenantStore(store, "alice"), stale_after_s=2 * TIMEOUT_S, clock=clock or Clock())
    return service.for_tenant(records, _read)


def _gates(service: VectorStores) -> Gates:
    assert isinstance(service.embedder, Gates)
    return service.embedder


async def _statuses(tenant: TenantVectorStores, vector_store_id: str) -> dict[str, str]:
    return {file.id: file.status for file in await tenant.records.files(vector_store_id)}


async def _searchable(tenant: TenantVectorStores, vector_store_id: str) -> set[str]:
    return {hit.file_id for hit in await tenant.search([vector_store_id], "searchable words about zebras", max_results=50)}


def test_a_cancelled_batchs_files_are_never_ingested(tmp_path: Path) -> None:
    """One worker: the batch's first file is at the worker (held at the embedder), two are
    queued. The cancel cancels all three; the queued ones give their places back at once and
    are skipped, the one at work is dropped when it comes back from the embedder. Nothing is
    `completed`, nothing searchable; a file attached alone meanwhile is ingested."""

    async def main() -> None:
        service = _service(EmbeddedIndex(tmp_path, 64), Gates())
        alice = _alice(service, MemoryStore())
        vector_store = await alice.create(name="docs")
        batch = await alice.create_batch(vector_store.id, [(f, None, AUTO) for f in ("file-gate-1", "file-a", "file-b")])
        await _until(lambda: service.ingestion.waiting == 2, "the worker took the first file")
        cancelled = await alice.cancel_batch(vector_store.id, batch.id)
        assert cancelled.status == "cancelled"
        assert (cancelled.file_counts.cancelled, cancelled.file_counts.in_progress) == (3, 0)
        # The two queued files' places are back at once; the one at work holds its own until dropped.
        assert (service.ingestion.by_tenant, service.ingestion.waiting) == ({"alice": 1}, 0)
        await alice.attach(vector_store.id, "file-alone")
        _gates(service).gate(1).set()
        await service.ingestion.drained()
        assert await _statuses(alice, vector_store.id) == {
            "file-gate-1": "cancelled",
            "file-a": "cancelled",
            "file-b": "cancelled",
            "file-alone": "completed",
        }
        assert await _searchable(alice, vector_store.id) == {"file-alone"}
        assert await service.index.count(VectorStores.namespace(alice.records, vector_store.id)) == 1
        assert (service.ingestion.by_tenant, service.ingestion.waiting) == ({}, 0)
        assert (await alice.batch(vector_store.id, batch.id)).status == "cancelled"
        await service.ingestion.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_cancel_taken_by_another_replica_stops_the_files_where_they_are(request, tmp_path: Path, backend: str) -> None:
    """Two replicas over one state store (memory, or a real Redis) and one index: the batch
    is queued on `here`, cancelled through `there`. `here`'s worker skips the queued files
    when it reaches them (giving their places back then) and drops the file at work at its
    next step."""

    async def main() -> None:
        store: Store = MemoryStore()
        if backend == "redis":
            server = request.getfixturevalue("redis_server")
            store = RedisStore(server.url, password=server.password, key_prefix=f"test-{uuid.uuid4().hex}:")
        index = EmbeddedIndex(tmp_path, 64)
        here, there = _service(index, Gates()), _service(index, Gates())
        alice_here, alice_there = _alice(here, store), _alice(there, store)
        vector_store = await alice_here.create(name="docs")
        files = ["file-gate-1", "file-a", "file-b"]
        batch = await alice_here.create_batch(vector_store.id, [(f, None, AUTO) for f in files])
        await _until(lambda: here.ingestion.waiting == 2, "the worker took the first file")
        assert (await alice_there.cancel_batch(vector_store.id, batch.id)).file_counts.cancelled == 3
        assert here.ingestion.by_tenant == {"alice": 3}  # `here` learns of it as its worker reaches each file
        _gates(here).gate(1).set()
        await here.ingestion.drained()
        assert set((await _statuses(alice_here, vector_store.id)).values()) == {"cancelled"}
        assert await _searchable(alice_here, vector_store.id) == set()
        assert (here.ingestion.by_tenant, here.ingestion.waiting) == ({}, 0)
        await here.ingestion.aclose()
        await store.close()

    asyncio.run(main())


def test_a_cancel_landing_after_the_chunks_were_indexed_removes_them(tmp_path: Path) -> None:
    """The cancel comes between the worker's add to the index and its `completed`: the file
    ends `cancelled` and its chunks are removed (it used to end `completed` and searchable)."""

    async def main() -> None:
        index = HookedIndex(tmp_path, 64)
        service = _service(index, HashingEmbedder(64))
        alice = _alice(service, MemoryStore())
        vector_store = await alice.create(name="docs")
        batch_ids: list[str] = []

        async def cancel() -> None:
            await alice.cancel_batch(vector_store.id, batch_ids[0])

        index.after_add = cancel
        batch_ids.append((await alice.create_batch(vector_store.id, [("file-a", None, AUTO)])).id)
        await service.ingestion.drained()
        assert (await alice.file(vector_store.id, "file-a")).status == "cancelled"
        assert await index.count(VectorStores.namespace(alice.records, vector_store.id)) == 0
        assert await _searchable(alice, vector_store.id) == set()
        await service.ingestion.aclose()

    asyncio.run(main())


def test_a_cancel_leaves_the_files_it_no_longer_holds(tmp_path: Path) -> None:
    """A batch's file that finished before the cancel keeps its status; one attached again
    since by another request is that request's, not the batch's to cancel."""

    async def main() -> None:
        service = _service(EmbeddedIndex(tmp_path, 64), Gates())
        alice = _alice(service, MemoryStore())
        vector_store = await alice.create(name="docs")
        files = ["file-done", "file-gate-1", "file-again"]
        batch = await alice.create_batch(vector_store.id, [(f, None, AUTO) for f in files])
        await _until(lambda: service.ingestion.waiting == 1, "the worker is at the second file")
        assert (await alice.file(vector_store.id, "file-done")).status == "completed"
        await alice.attach(vector_store.id, "file-again")  # queued again, by a request of its own
        cancelled = await alice.cancel_batch(vector_store.id, batch.id)
        assert (cancelled.status, cancelled.file_counts.completed, cancelled.file_counts.cancelled) == ("cancelled", 1, 1)
        _gates(service).gate(1).set()
        await service.ingestion.drained()
        assert await _statuses(alice, vector_store.id) == {"file-done": "completed", "file-gate-1": "cancelled", "file-again": "completed"}
        assert await _searchable(alice, vector_store.id) == {"file-done", "file-again"}
        assert (await alice.batch(vector_store.id, batch.id)).status == "cancelled"
        await service.ingestion.aclose()

    asyncio.run(main())


@settings(max_examples=25, deadline=None)
@given(
    files=st.integers(1, 5),
    workers=st.integers(1, 3),
    delay=st.integers(0, 300),
    remote=st.booleans(),
)
def test_whenever_a_cancel_lands_each_file_ends_completed_and_searchable_or_cancelled_and_not(
    files: int, workers: int, delay: int, remote: bool
) -> None:
    """A batch cancelled after `delay` turns of the event loop (on this replica or another),
    on a store whose every call lets others run: each file ends either `completed` with its
    chunk searchable or `cancelled` with none, the batch `cancelled`, every place given back."""

    async def main(root: Path) -> None:
        store, index = NetworkedStore(), EmbeddedIndex(root, 64)
        here = _service(index, HashingEmbedder(64), workers=workers)
        there = _service(index, HashingEmbedder(64)) if remote else here
        alice = _alice(here, store)
        vector_store = await alice.create(name="docs")
        names = [f"file-{number}" for number in range(files)]
        batch = await alice.create_batch(vector_store.id, [(name, None, AUTO) for name in names])
        for _ in range(delay):
            await asyncio.sleep(0)
        await _alice(there, store).cancel_batch(vector_store.id, batch.id)
        await here.ingestion.drained()
        statuses = await _statuses(alice, vector_store.id)
        assert set(statuses.values()) <= {"completed", "cancelled"}
        completed = {name for name, status in statuses.items() if status == "completed"}
        assert await _searchable(alice, vector_store.id) == completed
        assert await index.count(VectorStores.namespace(alice.records, vector_store.id)) == len(completed)
        assert (await alice.batch(vector_store.id, batch.id)).status == ("cancelled" if len(completed) < files else "completed")
        assert (here.ingestion.by_tenant, here.ingestion.waiting) == ({}, 0)
        await here.ingestion.aclose()

    with tempfile.TemporaryDirectory() as root:
        asyncio.run(main(Path(root)))


def test_a_file_waiting_in_a_long_queue_is_not_read_as_failed(tmp_path: Path) -> None:
    """One worker, three files: the second and third wait while the first is at work far
    longer than twice `ingest_timeout_s` after they were recorded. They read `in_progress`
    (they used to read `failed`); each is judged from when its own ingestion starts."""

    async def main() -> None:
        clock = Clock()
        service = _service(EmbeddedIndex(tmp_path, 64), Gates())
        alice = _alice(service, MemoryStore(), clock)
        vector_store = await alice.create(name="docs", file_ids=["file-gate-1", "file-gate-2", "file-gate-3"])
        await _until(lambda: service.ingestion.waiting == 2, "the worker took the first file")
        clock.now += 2 * TIMEOUT_S + 100
        assert await _statuses(alice, vector_store.id) == {
            "file-gate-1": "failed",  # at work longer than its ingestion may take: its worker is stuck or gone
            "file-gate-2": "in_progress",
            "file-gate-3": "in_progress",
        }
        _gates(service).gate(1).set()
        await _until(lambda: service.ingestion.waiting == 1, "the worker took the second file")
        clock.now += 2 * TIMEOUT_S - 100  # the second started 2×timeout - 100 s ago
        assert (await alice.file(vector_store.id, "file-gate-2")).status == "in_progress"
        clock.now += 200
        assert await _statuses(alice, vector_store.id) == {
            "file-gate-1": "completed",
            "file-gate-2": "failed",
            "file-gate-3": "in_progress",  # still waiting, its replica alive
        }
        _gates(service).gate(2).set()
        _gates(service).gate(3).set()
        await service.ingestion.drained()
        assert set((await _statuses(alice, vector_store.id)).values()) == {"completed"}
        await service.ingestion.aclose()

    asyncio.run(main())


def test_files_of_a_replica_that_is_gone_read_as_failed(tmp_path: Path) -> None:
    """A replica that stops (its lifespan ends: `aclose`) or dies (its queue's lease is no
    longer renewed and lapses): its queued and in-work files read `failed`, without waiting
    twice `ingest_timeout_s`."""

    async def main() -> None:
        ticks = Clock(0.0)
        store = MemoryStore(clock=ticks)
        for ending in ("stopped", "died"):
            service = _service(EmbeddedIndex(tmp_path / ending, 64), Gates())
            alice = _alice(service, store)
            vector_store = await alice.create(name=ending, file_ids=["file-gate-1", "file-gate-2"])
            await _until(lambda service=service: service.ingestion.waiting == 1, "the worker took the first file")
            assert set((await _statuses(alice, vector_store.id)).values()) == {"in_progress"}
            if ending == "stopped":
                await service.ingestion.aclose()
            else:  # its tasks end with the process: nothing renews its lease
                for task in service.ingestion._tasks:
                    task.cancel()
                ticks.now += QUEUE_LEASE_S - 1
                assert set((await _statuses(alice, vector_store.id)).values()) == {"in_progress"}
                ticks.now += 2
            file = await alice.file(vector_store.id, "file-gate-2")
            assert (file.status, file.last_error.code if file.last_error else None) == ("failed", "server_error")
            assert set((await _statuses(alice, vector_store.id)).values()) == {"failed"}

    asyncio.run(main())

"""Each tenant's share of a replica's ingestion queue (runtime/vector_stores.py `Ingestion`):
one tenant's files waiting or being ingested are at most its share, counted before any
await (concurrent attaches never pass it) and given back when the file's ingestion ends,
however it ends; past it a 429 with `Retry-After` and nothing recorded, while the other
tenants' attaches are taken and ingested. A request's files take their places all or none."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.api.errors import APIError
from serve_app.api.vector_stores import ChunkingStrategy
from serve_app.config import VectorStoresConfig
from serve_app.retrieval.embeddings import HashingEmbedder, Vectors
from serve_app.retrieval.index import EmbeddedIndex
from serve_app.retrieval.stores import VectorStoreRecords
from serve_app.runtime.vector_stores import FileUnreadable, TenantVectorStores, VectorStoreLimits, VectorStores
from serve_app.state.memory import MemoryStore
from serve_app.state.tenancy import TenantStore
from tests.retrieval.test_vector_stores_service import WordTokens

HELD = "HOLD these words until the gate opens. " * 5
TEXTS = {"file-zebra": ("zebras.txt", "Zebras migrate across the Serengeti every July. " * 5)}
AUTO = ChunkingStrategy(type="auto")


async def _read(file_id: str) -> tuple[str, str]:
    if file_id.startswith("file-held"):
        return f"{file_id}.txt", HELD
    if file_id == "file-broken":
        raise FileUnreadable("invalid_file", "The PDF cannot be read.")
    if file_id == "file-crash":
        return "crash.txt", "CRASH the embedder with this text. " * 5
    if file_id not in TEXTS:
        raise APIError(f"No such File object: {file_id}", status_code=404, param="file_id", code="not_found")
    return TEXTS[file_id]


class GatedEmbedder(HashingEmbedder):
    """The hashing model, except that a text with HOLD waits for `gate` and one with CRASH
    raises: a tenant's files stay at work for as long as a test wants."""

    def __init__(self) -> None:
        super().__init__(64)
        self.gate = asyncio.Event()

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if any("CRASH" in text for text in texts):
            raise RuntimeError("the embedder broke")
        if any("HOLD" in text for text in texts):
            await self.gate.wait()
        return await super().embed(texts)


class NetworkedStore(MemoryStore):
    """The memory store, except that each read and write lets the event loop run others first,
    as a store across a network does (the memory store's calls never suspend)."""

    async def get(self, key: str) -> bytes | None:
        await asyncio.sleep(0)
        return await super().get(key)

    async def put(self, key: str, value: bytes, *, ttl_s: float) -> None:
        await asyncio.sleep(0)
        await super().put(key, value, ttl_s=ttl_s)

    async def append(self, key: str, values: Sequence[bytes], *, ttl_s: float, expected_length: int | None = None) -> int:
        await asyncio.sleep(0)
        return await super().append(key, values, ttl_s=ttl_s, expected_length=expected_length)

    async def range(self, key: str, start: int = 0, stop: int | None = None) -> list[bytes]:
        await asyncio.sleep(0)
        return await super().range(key, start, stop)


def _service(root: Path, *, queue: int = 10, per_tenant: int | None = 2, workers: int = 3, timeout_s: float = 600.0) -> VectorStores:
    return VectorStores(
        EmbeddedIndex(root, 64),
        GatedEmbedder(),
        lambda: WordTokens(),
        VectorStoreLimits(ingest_timeout_s=timeout_s),
        workers=workers,
        queue=queue,
        per_tenant=per_tenant,
    )


def _gate(service: VectorStores) -> asyncio.Event:
    assert isinstance(service.embedder, GatedEmbedder)
    return service.embedder.gate


def _tenant(service: VectorStores, store: MemoryStore, name: str, yields: int = 0) -> TenantVectorStores:
    """`name`'s stores; each file check awaits `yields` times (the loop runs others' attaches meanwhile)."""

    async def exists(file_id: str) -> bool:
        for _ in range(yields):
            await asyncio.sleep(0)
        return True

    return service.for_tenant(VectorStoreRecords(TenantStore(store, name)), _read, exists=exists)


async def _until(condition, what: str) -> None:
    """Wait (a bounded number of loop turns) until `condition()` holds."""
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


async def _refused(call) -> APIError:
    with pytest.raises(APIError) as refused:
        await call
    return refused.value


def test_a_tenant_past_its_share_is_refused_while_another_is_served(tmp_path: Path) -> None:
    async def main() -> None:
        service = _service(tmp_path)
        store = MemoryStore()
        alice, bob = _tenant(service, store, "alice"), _tenant(service, store, "bob")
        mine, theirs = await alice.create(name="a"), await bob.create(name="b")
        for number in (1, 2):
            assert (await alice.attach(mine.id, f"file-held-{number}")).status == "in_progress"
        error = await _refused(alice.attach(mine.id, "file-held-3"))
        assert (error.status_code, error.code) == (429, "rate_limit_exceeded")
        assert error.headers["retry-after"] == "5"
        assert "vector_stores.ingest_queue_per_tenant" in error.message
        assert await alice.records.file_ids(mine.id) == ["file-held-1", "file-held-2"]  # nothing recorded
        # bob's file is taken and ingested while alice's two are still at work
        assert (await bob.attach(theirs.id, "file-zebra")).status == "in_progress"
        await _until(lambda: "bob" not in service.ingestion.by_tenant, "bob's file ingested")
        assert (await bob.file(theirs.id, "file-zebra")).status == "completed"
        assert service.ingestion.by_tenant == {"alice": 2}
        _gate(service).set()
        await service.ingestion.drained()
        assert (service.ingestion.by_tenant, service.ingestion.waiting) == ({}, 0)
        assert (await alice.attach(mine.id, "file-held-3")).status == "in_progress"  # places back: alice is taken again
        await service.ingestion.drained()
        assert {f.status for f in await alice.records.files(mine.id)} == {"completed"}
        await service.ingestion.aclose()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("file_id", "status", "error"),
    [
        ("file-zebra", "completed", None),
        ("file-broken", "failed", "invalid_file"),  # the file's text cannot be had
        ("file-missing", "failed", "invalid_file"),  # deleted before its turn came
        ("file-crash", "failed", "server_error"),  # the worker's own failure
        ("file-held", "failed", "server_error"),  # past ingest_timeout_s
    ],
)
def test_a_place_is_given_back_however_the_ingestion_ends(tmp_path: Path, file_id: str, status: str, error: str | None) -> None:
    async def main() -> None:
        service = _service(tmp_path, per_tenant=1, timeout_s=0.05 if file_id == "file-held" else 600.0)
        alice = _tenant(service, MemoryStore(), "alice")
        vector_store = await alice.create(name="a")
        await alice.attach(vector_store.id, file_id)
        assert service.ingestion.by_tenant == {"alice": 1}
        await service.ingestion.drained()
        file = await alice.file(vector_store.id, file_id)
        assert file.status == status
        assert (file.last_error.code if file.last_error else None) == error
        assert (service.ingestion.by_tenant, service.ingestion.waiting) == ({}, 0)
        await alice.attach(vector_store.id, "file-zebra")  # its one place is free again
        await service.ingestion.drained()
        await service.ingestion.aclose()

    asyncio.run(main())


def test_files_still_queued_when_the_app_ends_give_their_places_back(tmp_path: Path) -> None:
    async def main() -> None:
        service = _service(tmp_path, workers=1)
        alice = _tenant(service, MemoryStore(), "alice")
        vector_store = await alice.create(name="a", file_ids=["file-held-1", "file-held-2"])  # one at work, one queued
        assert (service.ingestion.by_tenant, service.ingestion.waiting) == ({"alice": 2}, 2)
        await _until(lambda: service.ingestion.waiting == 1, "the worker took one")
        await service.ingestion.aclose()
        assert (service.ingestion.by_tenant, service.ingestion.waiting) == ({}, 0)
        counts = (await alice.records.existing(vector_store.id)).file_counts
        assert (counts.in_progress, counts.failed) == (0, 2)  # read as failed at once: the queue that held them is gone

    asyncio.run(main())


def test_a_requests_files_take_their_places_all_or_none(tmp_path: Path) -> None:
    async def main() -> None:
        service = _service(tmp_path, per_tenant=4)
        alice = _tenant(service, MemoryStore(), "alice")
        vector_store = await alice.create(name="a", file_ids=["file-held-1", "file-held-2"])
        # more files than the share holds: no retry helps, a 400 naming them
        error = await _refused(alice.create_batch(vector_store.id, [(f"file-held-{n}", None, AUTO) for n in range(3, 8)]))
        assert (error.status_code, error.param) == (400, "file_ids")
        # three more than the two places left: a 429, and neither the batch nor a file recorded
        error = await _refused(alice.create_batch(vector_store.id, [(f"file-held-{n}", None, AUTO) for n in range(3, 6)]))
        assert error.status_code == 429
        assert await alice.records.file_ids(vector_store.id) == ["file-held-1", "file-held-2"]
        assert (await alice.records.existing(vector_store.id)).file_counts.total == 2
        stores = await alice.records.ids()
        error = await _refused(alice.create(name="b", file_ids=["file-held-3", "file-held-4", "file-held-5"]))
        assert error.status_code == 429
        assert await alice.records.ids() == stores  # no store made
        assert service.ingestion.by_tenant == {"alice": 2}
        # a batch the store's file limit stops half-way (as before): the place its second file did not use goes back
        service.limits = VectorStoreLimits(max_files_per_store=3)
        error = await _refused(alice.create_batch(vector_store.id, [("file-held-3", None, AUTO), ("file-held-4", None, AUTO)]))
        assert (error.status_code, error.param) == (400, "file_id")
        assert service.ingestion.by_tenant == {"alice": 3}
        _gate(service).set()
        await service.ingestion.drained()
        assert service.ingestion.by_tenant == {}
        await service.ingestion.aclose()

    asyncio.run(main())


def test_the_replicas_queue_is_a_503_before_anything_is_recorded(tmp_path: Path) -> None:
    """Without tenants (no `auth`) there is no share: the queue's bound alone, now checked
    before the file is recorded (it used to be recorded, then marked failed)."""

    async def main() -> None:
        service = _service(tmp_path, queue=2, per_tenant=None, workers=1)
        anyone = _tenant(service, MemoryStore(), "anonymous")
        vector_store = await anyone.create(name="a", file_ids=["file-held-1"])
        await _until(lambda: service.ingestion.waiting == 0, "the worker took it")
        await anyone.create_batch(vector_store.id, [("file-held-2", None, AUTO), ("file-held-3", None, AUTO)])
        error = await _refused(anyone.attach(vector_store.id, "file-held-4"))
        assert (error.status_code, error.code, error.headers["retry-after"]) == (503, "server_busy", "5")
        assert len(await anyone.records.file_ids(vector_store.id)) == 3
        error = await _refused(anyone.create_batch(vector_store.id, [(f"file-held-{n}", None, AUTO) for n in range(5, 8)]))
        assert (error.status_code, "vector_stores.ingest_queue" in error.message) == (400, True)
        _gate(service).set()
        await service.ingestion.drained()
        await service.ingestion.aclose()

    asyncio.run(main())


@settings(max_examples=40)
@given(
    share=st.integers(1, 5),
    attaches=st.lists(st.sampled_from(["alice", "bob"]), max_size=14),
    yields=st.lists(st.integers(0, 3), min_size=14, max_size=14),
)
def test_concurrent_attaches_never_pass_a_tenants_share(share: int, attaches: list[str], yields: list[int]) -> None:
    """Any number of attaches of two tenants at once, each awaiting its checks a different
    number of times, on a store whose every call lets the others run: each tenant gets exactly min(its attaches, share) places, the rest 429s
    with nothing recorded."""

    async def main(root: Path) -> None:
        service = _service(root, queue=20, per_tenant=share)
        store = NetworkedStore()
        tenants = {name: _tenant(service, store, name, yields=count) for name, count in (("alice", yields[0]), ("bob", yields[1]))}
        stores = {name: (await tenant.create(name=name)).id for name, tenant in tenants.items()}

        async def attach(number: int, name: str) -> str:
            tenant = _tenant(service, store, name, yields=yields[number])
            try:
                await tenant.attach(stores[name], f"file-held-{number}")
            except APIError as exc:
                return f"refused {exc.status_code}"
            return "taken"

        outcomes = await asyncio.gather(*(attach(number, name) for number, name in enumerate(attaches)))
        assert set(outcomes) <= {"taken", "refused 429"}
        for name, tenant in tenants.items():
            asked = attaches.count(name)
            taken = sum(1 for outcome, who in zip(outcomes, attaches, strict=True) if who == name and outcome == "taken")
            assert taken == min(asked, share)
            assert service.ingestion.by_tenant.get(name, 0) == taken
            assert len(await tenant.records.file_ids(stores[name])) == taken
        await service.ingestion.aclose()
        assert service.ingestion.by_tenant == {}

    with tempfile.TemporaryDirectory() as root:
        asyncio.run(main(Path(root)))


def test_the_default_share_is_a_quarter_of_the_queue_and_fits_one_request() -> None:
    assert VectorStoresConfig(ingest_queue=4000).tenant_ingest_share() == 1000
    assert VectorStoresConfig().tenant_ingest_share() == 500  # the 500 files one request may attach
    assert VectorStoresConfig(ingest_queue=100).tenant_ingest_share() == 100
    assert VectorStoresConfig(ingest_queue=100, ingest_queue_per_tenant=10).tenant_ingest_share() == 10
    with pytest.raises(ValueError, match="at most ingest_queue"):
        VectorStoresConfig(ingest_queue=10, ingest_queue_per_tenant=11)

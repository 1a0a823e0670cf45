"""Vector stores for one app: their metadata (retrieval/stores.py), their files' ingestion,
and search (hybrid, filtered: retrieval/index.py) — what the Vector Stores API's routes and
the `file_search` tool both use.

Ingestion runs off the event loop: attaching a file records it `in_progress` and queues it
(`Ingestion`: a bounded queue per replica, `ingest_workers` tasks). The places are taken
before anything is recorded, all of a request's files or none: a full queue is a 503 with
`Retry-After`, and with tenants one tenant's files waiting or being ingested on the replica
are at most its share (`ingest_queue_per_tenant`; a 429 with `Retry-After` past it), so one
tenant's uploads cannot fill the queue for the others. A worker reads the file's text (the
Files API's `file_text`), chunks it in a thread, embeds the chunks (in a thread, or on the
model's replicas), adds them to the index and records the file `completed` with its
`usage_bytes` (or `failed` with `last_error`). Embedding counts the chunks' tokens in the tenant's `tokens_per_minute`.
Deleting a file from a store, or a store, removes its index entries.

Cancelling a file batch cancels its files not yet ingested (OpenAI: the batch's processing
is cancelled "as soon as possible"; a file's `cancelled` status is final): each is recorded
`cancelled` and its chunks removed, and it never becomes `completed` or searchable. A file
still queued on the replica that takes the cancel gives its place back at once and is
skipped; a file at one of its workers is dropped at the worker's next step (after reading,
chunking or embedding) and gives its place back then. On another replica the worker learns
it from the file's record: a queued file is skipped when the worker reaches it (one store
read, its place given back then), a file at work is dropped before its chunks are indexed,
and one whose chunks were indexed as the cancel landed has them removed (the status is
written by compare-and-set: the worker's `completed` never overwrites a `cancelled`).

A replica's queue is alive while it renews a lease in the state store (`QUEUE_LEASE_S`, per
tenant with files in it): a file it holds reads `failed` once the lease lapses (the replica
died or stopped), not merely because it waited long (retrieval/stores.py). A `file_search` tool
naming a store that is not the caller's is refused as its request arrives
(`check_file_search`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openai.types import VectorStore
from openai.types.vector_stores import VectorStoreFile, VectorStoreFileBatch

from serve_app.api.errors import APIError, invalid_request, retry_after, server_error, server_full
from serve_app.api.filters import Filter
from serve_app.api.request import ResponsesRequest
from serve_app.api.tools import FileSearchTool
from serve_app.api.vector_stores import AUTO, ChunkingStrategy
from serve_app.config import VectorStoresConfig
from serve_app.retrieval.chunking import TokenOffsets, chunk_text, load_token_offsets
from serve_app.retrieval.embeddings import Embedder, EmbeddingUnavailable, HashingEmbedder
from serve_app.retrieval.index import EmbeddedIndex, Hit, IndexedChunk, Ranking, VectorIndex
from serve_app.retrieval.stores import (
    VectorStoreRecords,
    batch_not_found,
    file_not_in_store,
    new_id,
    queue_lease_key,
    store_expired,
)
from serve_app.state import Store, StoreUnavailable
from serve_app.state.files import file_not_found

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5  # a refused attach: files take seconds each to ingest
# A replica's ingestion queue is alive while its lease is renewed (every third of this): its
# files read as failed this long after the replica died at most.
QUEUE_LEASE_S = 60.0


class FileUnreadable(Exception):
    """A file's text cannot be had: `code` is `invalid_file` / `unsupported_file` / `server_error`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


# A tenant's file, read: (filename, text). Raises `APIError` 404 for a file the tenant does
# not have, `FileUnreadable` for one that is no text.
FileReader = Callable[[str], Awaitable[tuple[str, str]]]
Charge = Callable[[int], Awaitable[None]]  # embedding tokens, into the tenant's quota
FileExists = Callable[[str], Awaitable[bool]]  # whether the tenant has this file (the Files API's metadata)


@dataclass(frozen=True, slots=True)
class VectorStoreLimits:
    max_stores_per_tenant: int = 100
    max_files_per_store: int = 10_000
    max_file_chars: int = 4_000_000
    max_chunks_per_store: int = 1_000_000
    ingest_timeout_s: float = 600.0
    max_search_results: int = 50


@dataclass(slots=True)
class _Job:
    records: VectorStoreRecords
    namespace: str
    vector_store: VectorStore
    file: VectorStoreFile
    read: FileReader
    charge: Charge | None
    chunking: ChunkingStrategy
    batch_id: str | None = None
    tenant: str = ""
    id: str = field(default_factory=lambda: new_id("vsj"))
    cancelled: bool = False  # on this replica (`Ingestion.cancel`): skipped, or dropped at its next step

    def owns(self, fields: dict[str, Any] | None) -> bool:
        """Whether the file's record (`VectorStoreRecords.file_fields`) is still this job's to
        ingest: `in_progress`, not attached again since (a new job), not cancelled."""
        return fields is not None and fields.get("status") == "in_progress" and fields.get("_job", self.id) == self.id


def _started(fields: dict[str, Any], job: _Job, now: float) -> dict[str, Any] | None:
    """The file's record with its ingestion started now, if it is still the job's to ingest."""
    return fields | {"_started_at": now} if job.owns(fields) else None


class Places:
    """Places in the replica's ingestion taken for one request's files (`Ingestion.take`): each
    queued job uses one; closing gives back those no job used (the request failed before it
    queued them all)."""

    def __init__(self, ingestion: Ingestion, tenant: str, count: int) -> None:
        self.ingestion, self.tenant, self.left = ingestion, tenant, count

    def submit(self, job: _Job) -> None:
        if self.left <= 0:
            raise RuntimeError("no place was taken for this file")
        self.left -= 1
        job.tenant = self.tenant
        self.ingestion.queued[job.id] = job
        self.ingestion.queue.put_nowait(job)  # the queue has room: its place was counted

    def close(self) -> None:
        left, self.left = self.left, 0
        self.ingestion.waiting -= left
        self.ingestion.give(self.tenant, left)

    def __enter__(self) -> Places:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Ingestion:
    """The replica's ingestion workers and their bounded queue (see the module's docstring).

    Places are counted when an attach asks for them, before it records or awaits anything
    (`take`), so concurrent attaches never pass a bound: `waiting` (files taken for, queued,
    not yet at a worker) against `size`, and with tenants each tenant's files waiting or being
    ingested (`by_tenant`) against `per_tenant`, given back when its file's ingestion ends,
    however it ends, or when it is cancelled while queued. The queue's lease (`queue_id`) is
    renewed in each of those tenants' stores while the workers run."""

    def __init__(self, service: VectorStores, workers: int, queue: int, per_tenant: int | None = None) -> None:
        self.service = service
        self.workers = workers
        self.size = queue
        self.per_tenant = per_tenant
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()  # bounded by `take`
        self.waiting = 0
        self.by_tenant: dict[str, int] = {}
        self.queued: dict[str, _Job] = {}  # jobs in the queue, not cancelled, by id
        self.at_work: dict[str, _Job] = {}  # jobs at a worker, by id
        self.queue_id = new_id("vsq")  # this queue's, in its files' records; a new one each lifespan
        self._leases: dict[str, Store] = {}  # tenant -> its store, where the queue's lease is renewed
        self._tasks: list[asyncio.Task[None]] = []

    def take(self, tenant: str, files: int, param: str = "file_id") -> Places:
        """Places for `files` files of `tenant`, all or none, or raise with nothing taken: a
        400 naming `param` for more files than a request may ever have queued, a 429 past the
        tenant's share, a 503 past the replica's queue. Nothing awaits between the checks and
        the count."""
        share = self.size if self.per_tenant is None else min(self.per_tenant, self.size)
        if files > share:
            setting = "vector_stores.ingest_queue" if self.per_tenant is None else "vector_stores.ingest_queue_per_tenant"
            raise invalid_request(
                f"This request attaches {files} files; this server queues at most {share} files of one caller for "
                f"ingestion ({setting}): attach them in smaller batches.",
                param=param,
            )
        held = self.by_tenant.get(tenant, 0)
        if self.per_tenant is not None and held + files > self.per_tenant:
            error = APIError(
                f"This API key's tenant has as many files waiting for ingestion or being ingested on this server as it may "
                f"({self.per_tenant}, vector_stores.ingest_queue_per_tenant). Retry when some of them have finished.",
                status_code=429,
                code="rate_limit_exceeded",
                type="requests",
            )
            raise retry_after(error, RETRY_AFTER_S)
        if self.waiting + files > self.size:
            raise server_full("This server is ingesting too many files; retry later.", code="server_busy", retry_after_s=RETRY_AFTER_S)
        if files:
            self.waiting += files
            self.by_tenant[tenant] = held + files
            if not self._tasks:
                self._tasks = [asyncio.create_task(self._work()) for _ in range(self.workers)]
                self._tasks.append(asyncio.create_task(self._renew_leases()))
        return Places(self, tenant, files)

    def give(self, tenant: str, files: int = 1) -> None:
        """`tenant`'s places of `files` files given back (their ingestion ended, or never started)."""
        left = self.by_tenant.get(tenant, 0) - files
        if left > 0:
            self.by_tenant[tenant] = left
        else:
            self.by_tenant.pop(tenant, None)
            self._leases.pop(tenant, None)  # none of its files is here: its lease may lapse

    async def hold_lease(self, tenant: str, store: Store) -> None:
        """Before `tenant`'s file is recorded as queued here: the queue's lease in its store (written
        now if it is not being renewed already)."""
        if tenant not in self._leases:
            await store.put(queue_lease_key(self.queue_id), b"1", ttl_s=QUEUE_LEASE_S)
            self._leases[tenant] = store

    async def _renew_leases(self) -> None:
        while True:
            await asyncio.sleep(QUEUE_LEASE_S / 3)
            for tenant, store in list(self._leases.items()):
                try:
                    await store.put(queue_lease_key(self.queue_id), b"1", ttl_s=QUEUE_LEASE_S)
                except Exception:  # the store is down: the next round (a lease outlives two missed ones)
                    logger.warning("vector stores: renewing the ingestion queue's lease of %s failed", tenant, exc_info=True)

    def cancel(self, job_id: str) -> None:
        """The job's file was cancelled: if it is queued here, its place given back now (the worker
        will skip it); if at a worker here, dropped at the worker's next step."""
        job = self.queued.pop(job_id, None)
        if job is not None:
            job.cancelled = True
            self.waiting -= 1
            self.give(job.tenant)
        elif (job := self.at_work.get(job_id)) is not None:
            job.cancelled = True

    async def _work(self) -> None:
        while True:
            job = await self.queue.get()
            if job.cancelled:  # its place was given back when it was cancelled
                self.queue.task_done()
                continue
            del self.queued[job.id]
            self.waiting -= 1
            self.at_work[job.id] = job
            try:
                await asyncio.wait_for(self.service.ingest(job), self.service.limits.ingest_timeout_s)
            except TimeoutError:
                await self.service.finish(job, error=("server_error", "The file's ingestion took too long."))
            except Exception:  # a worker survives any one file
                logger.exception("vector store %s: ingesting %s failed", job.vector_store.id, job.file.id)
                with contextlib.suppress(Exception):
                    await self.service.finish(job, error=("server_error", "The file could not be ingested."))
            finally:
                del self.at_work[job.id]
                self.give(job.tenant)
                self.queue.task_done()

    async def drained(self) -> None:
        """Wait until every queued file is ingested (tests, shutdown)."""
        await self.queue.join()

    async def aclose(self) -> None:
        """End the workers (the app's lifespan ends). Files still queued or at work are left
        `in_progress`, their places given back and the queue's leases removed (best effort), so
        they read as failed at once (or when the leases lapse); an app started again (its next
        lifespan, maybe on another event loop) starts with an empty queue of its own."""
        leases = list(self._leases.values())  # (giving the places back forgets them)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        while not self.queue.empty():
            job = self.queue.get_nowait()
            if not job.cancelled:
                self.waiting -= 1
                self.give(job.tenant)
        for store in leases:
            with contextlib.suppress(Exception):
                await store.delete(queue_lease_key(self.queue_id))
        self.queue = asyncio.Queue()
        self.queued, self.at_work, self._leases = {}, {}, {}
        self.queue_id = new_id("vsq")


class VectorStores:
    """The app's vector stores: one index, one embedding model, one chunking tokenizer."""

    def __init__(
        self,
        index: VectorIndex,
        embedder: Embedder,
        tokenizer: Callable[[], TokenOffsets],
        limits: VectorStoreLimits | None = None,
        *,
        workers: int = 2,
        queue: int = 1000,
        per_tenant: int | None = None,
    ) -> None:
        self.index, self.embedder, self._tokenizer = index, embedder, tokenizer
        self.limits = limits or VectorStoreLimits()
        self.ingestion = Ingestion(self, workers, queue, per_tenant)
        self._token_offsets: TokenOffsets | None = None

    async def aclose(self) -> None:
        """The app's lifespan ends: the ingestion workers stop (`Ingestion.aclose`), then the
        index lets go of its connections."""
        await self.ingestion.aclose()
        await self.index.aclose()

    def tokenizer(self) -> TokenOffsets:
        if self._token_offsets is None:
            self._token_offsets = self._tokenizer()
        return self._token_offsets

    @staticmethod
    def namespace(records: VectorStoreRecords, vector_store_id: str) -> str:
        return f"{getattr(records.store, 'tenant', '')}/{vector_store_id}"

    # -- ingestion --
    async def ingest(self, job: _Job) -> None:
        """Ingest the job's file, unless its record says it is no longer the job's (cancelled,
        detached or attached again before its turn came); dropped at each step where the file
        was cancelled on this replica meanwhile, and before its chunks are indexed where it was
        cancelled on another."""
        if job.cancelled:
            return
        now = job.records.clock()
        _, started = await job.records.change_file(job.vector_store, job.file.id, lambda fields: _started(fields, job, now))
        if not started:
            return
        try:
            filename, text = await job.read(job.file.id)
        except FileUnreadable as exc:
            await self.finish(job, error=(exc.code, exc.message))
            return
        except APIError as exc:
            await self.finish(job, error=("invalid_file", exc.message))
            return
        if len(text) > self.limits.max_file_chars:
            await self.finish(job, error=("invalid_file", f"The file's text has more than {self.limits.max_file_chars} characters."))
            return
        if job.cancelled:
            return
        chunks = await asyncio.to_thread(chunk_text, text, self.tokenizer(), job.chunking) if text.strip() else []
        if not chunks:
            await self.finish(job, error=("invalid_file", "The file holds no text to search."))
            return
        if job.cancelled:
            return
        try:
            vectors = await self.embedder.embed([chunk.text for chunk in chunks])
        except EmbeddingUnavailable as exc:
            await self.finish(job, error=("server_error", f"The embedding model could not be reached: {exc}"))
            return
        if job.charge is not None:  # the embedding was done, cancelled since or not
            try:
                await job.charge(sum(chunk.tokens for chunk in chunks))
            except StoreUnavailable as exc:
                logger.warning("vector store %s: embedding not counted in the quota: %s", job.vector_store.id, exc.message)
        attributes = dict(job.file.attributes or {})
        indexed = [IndexedChunk(job.file.id, filename, chunk.index, chunk.text, attributes) for chunk in chunks]
        if await self.index.count(job.namespace) + len(indexed) > self.limits.max_chunks_per_store:
            await self.finish(
                job, error=("invalid_file", f"The vector store would hold more than {self.limits.max_chunks_per_store} chunks.")
            )
            return
        if job.cancelled or not job.owns(await job.records.file_fields(job.vector_store.id, job.file.id)):
            return  # cancelled or detached meanwhile (a cancel or detach that lands from now on removes the chunks)
        await self.index.add(job.namespace, indexed, vectors)
        usage = sum(len(chunk.text.encode()) for chunk in chunks) + vectors.nbytes
        await self.finish(job, usage_bytes=usage, indexed=True)

    async def finish(self, job: _Job, *, usage_bytes: int = 0, error: tuple[str, str] | None = None, indexed: bool = False) -> None:
        """Record the job's file `completed` (or `failed` with `error`) if it is still the job's
        to ingest; else, when its chunks were `indexed`, remove them if the file was detached or
        cancelled meanwhile (attached again: the new job's chunks replace them)."""
        update: dict[str, Any] = {"status": "completed", "usage_bytes": usage_bytes, "last_error": None}
        if error is not None:
            update = {"status": "failed", "usage_bytes": 0, "last_error": {"code": error[0], "message": error[1]}}
        fields, written = await job.records.change_file(job.vector_store, job.file.id, lambda f: f | update if job.owns(f) else None)
        if not written and indexed and (fields is None or fields.get("_job", job.id) == job.id):
            await self.index.remove_file(job.namespace, job.file.id)

    # -- one tenant's view --
    def for_tenant(
        self, records: VectorStoreRecords, read: FileReader, charge: Charge | None = None, exists: FileExists | None = None
    ) -> TenantVectorStores:
        return TenantVectorStores(self, records, read, charge, exists)


class TenantVectorStores:
    """One tenant's vector stores: what the routes and the `file_search` tool call. With
    `exists`, a file the tenant does not have is a 404 before anything is recorded or queued
    (else another tenant's or a made-up id would take a place in the replica's shared
    ingestion queue, only to fail there)."""

    def __init__(
        self, service: VectorStores, records: VectorStoreRecords, read: FileReader, charge: Charge | None, exists: FileExists | None = None
    ) -> None:
        self.service, self.records, self.read, self.charge, self.exists = service, records, read, charge, exists
        self.tenant: str = getattr(records.store, "tenant", "")

    async def _check_files(self, file_ids: Sequence[str]) -> None:
        if self.exists is None:
            return
        for file_id in file_ids:
            if not await self.exists(file_id):
                raise file_not_found(file_id[:128])

    def _namespace(self, vector_store_id: str) -> str:
        return VectorStores.namespace(self.records, vector_store_id)

    async def create(
        self,
        *,
        name: str | None = None,
        metadata: dict[str, str] | None = None,
        expires_after: dict[str, Any] | None = None,
        file_ids: Sequence[str] = (),
        chunking: ChunkingStrategy = AUTO,
    ) -> VectorStore:
        if len(await self.records.ids()) >= self.service.limits.max_stores_per_tenant:
            await self.records.all()  # prunes deleted and expired ids
            if len(await self.records.ids()) >= self.service.limits.max_stores_per_tenant:
                raise invalid_request(
                    f"This tenant holds {self.service.limits.max_stores_per_tenant} vector stores, the most this server keeps "
                    "(vector_stores.max_stores_per_tenant): delete one first.",
                    param="name",
                )
        await self._check_files(file_ids)
        with self.service.ingestion.take(self.tenant, len(file_ids), "file_ids") as places:
            vector_store = await self.records.create(name, metadata, expires_after)
            for file_id in file_ids:
                await self._attach(vector_store, file_id, None, chunking, places)
        return await self.records.existing(vector_store.id)

    async def attach(
        self,
        vector_store_id: str,
        file_id: str,
        *,
        attributes: dict[str, Any] | None = None,
        chunking: ChunkingStrategy = AUTO,
    ) -> VectorStoreFile:
        """Attach one of the tenant's files: recorded `in_progress`, queued for ingestion."""
        vector_store = await self.active(vector_store_id)
        await self._check_files([file_id])
        with self.service.ingestion.take(self.tenant, 1) as places:
            return await self._attach(vector_store, file_id, attributes, chunking, places)

    async def _attach(
        self,
        vector_store: VectorStore,
        file_id: str,
        attributes: dict[str, Any] | None,
        chunking: ChunkingStrategy,
        places: Places,
        batch_id: str | None = None,
    ) -> VectorStoreFile:
        """`attach` of a file already checked (`_check_files`), to a store already read, in a
        place taken for it (`Ingestion.take`: before anything is recorded); `batch_id`: the
        batch that attaches it."""
        existing = await self.records.get_file(vector_store.id, file_id)
        if existing is None and len(await self.records.file_ids(vector_store.id)) >= self.service.limits.max_files_per_store:
            raise invalid_request(
                f"The vector store holds {self.service.limits.max_files_per_store} files, the most this server keeps "
                "(vector_stores.max_files_per_store).",
                param="file_id",
            )
        file = VectorStoreFile.model_validate(
            {
                "id": file_id,
                "object": "vector_store.file",
                "created_at": int(time.time()),
                "vector_store_id": vector_store.id,
                "status": "in_progress",
                "usage_bytes": 0,
                "last_error": None,
                "attributes": attributes,
                "chunking_strategy": chunking.as_file_strategy(),
            }
        )
        ingestion = self.service.ingestion
        job = _Job(self.records, self._namespace(vector_store.id), vector_store, file, self.read, self.charge, chunking, batch_id)
        await ingestion.hold_lease(self.tenant, self.records.store)  # before the file says it is queued here
        await self.records.put_file(vector_store, file, new=existing is None, job_id=job.id, queue_id=ingestion.queue_id, batch_id=batch_id)
        places.submit(job)
        return file

    async def active(self, vector_store_id: str, param: str = "vector_store_id") -> VectorStore:
        """The store, if the tenant has it and it has not expired (a 400 then), marked as used."""
        vector_store = await self.records.existing(vector_store_id, param)
        if vector_store.status == "expired":
            raise store_expired(vector_store_id, param)
        return await self.records.touch(vector_store)

    async def update(self, vector_store_id: str, changes: dict[str, Any]) -> VectorStore:
        """`changes`: the fields an update gave; a null `name` is no name (`""`, as a store created without one)."""
        vector_store = await self.records.existing(vector_store_id)
        if "name" in changes and changes["name"] is None:
            changes = {**changes, "name": ""}
        await self.records.touch(vector_store, **changes)
        return await self.records.existing(vector_store_id)

    async def delete(self, vector_store_id: str) -> bool:
        if await self.records.get(vector_store_id) is None:
            return False
        await self.records.delete(vector_store_id)
        await self.service.index.drop(self._namespace(vector_store_id))
        return True

    async def detach(self, vector_store_id: str, file_id: str) -> bool:
        await self.records.existing(vector_store_id)
        if not await self.records.delete_file(vector_store_id, file_id):
            return False
        await self.service.index.remove_file(self._namespace(vector_store_id), file_id)
        return True

    async def forget_file(self, file_id: str) -> int:
        """The tenant deleted the file: detached from each of its stores (its chunks removed);
        how many held it."""
        held = 0
        for vector_store_id in await self.records.ids():
            if await self.records.get_file(vector_store_id, file_id) is not None:
                held += await self.detach(vector_store_id, file_id)
        return held

    async def file(self, vector_store_id: str, file_id: str) -> VectorStoreFile:
        await self.records.existing(vector_store_id)
        file = await self.records.get_file(vector_store_id, file_id)
        if file is None:
            raise file_not_in_store(file_id, vector_store_id)
        return file

    async def update_file(self, vector_store_id: str, file_id: str, attributes: dict[str, Any] | None) -> VectorStoreFile:
        """New attributes; its status and ingestion as they are (a write racing a worker's loses nothing)."""
        await self.file(vector_store_id, file_id)
        vector_store = await self.records.existing(vector_store_id)
        await self.records.change_file(vector_store, file_id, lambda fields: fields | {"attributes": attributes})
        await self.service.index.set_attributes(self._namespace(vector_store_id), file_id, dict(attributes or {}))
        return await self.file(vector_store_id, file_id)

    async def create_batch(
        self, vector_store_id: str, files: Sequence[tuple[str, dict[str, Any] | None, ChunkingStrategy]], *, param: str = "file_ids"
    ) -> VectorStoreFileBatch:
        """`param`: where the request named the files (`file_ids` or `files`)."""
        vector_store = await self.active(vector_store_id)
        await self._check_files([file_id for file_id, _, _ in files])
        with self.service.ingestion.take(self.tenant, len(files), param) as places:
            return await self._create_batch(vector_store, files, places)

    async def _create_batch(
        self, vector_store: VectorStore, files: Sequence[tuple[str, dict[str, Any] | None, ChunkingStrategy]], places: Places
    ) -> VectorStoreFileBatch:
        batch = VectorStoreFileBatch.model_validate(
            {
                "id": new_id("vsfb"),
                "object": "vector_store.files_batch",
                "created_at": int(time.time()),
                "vector_store_id": vector_store.id,
                "status": "in_progress",
                "file_counts": {"in_progress": len(files), "completed": 0, "failed": 0, "cancelled": 0, "total": len(files)},
            }
        )
        await self.records.put_batch(vector_store, batch, [file_id for file_id, _, _ in files])
        for file_id, attributes, chunking in files:
            await self._attach(vector_store, file_id, attributes, chunking, places, batch.id)
        return await self.batch(vector_store.id, batch.id)

    async def batch(self, vector_store_id: str, batch_id: str) -> VectorStoreFileBatch:
        return (await self.batch_files(vector_store_id, batch_id))[0]

    async def batch_files(self, vector_store_id: str, batch_id: str) -> tuple[VectorStoreFileBatch, list[VectorStoreFile]]:
        await self.records.existing(vector_store_id)
        found = await self.records.get_batch(vector_store_id, batch_id)
        if found is None:
            raise batch_not_found(batch_id)
        return found

    async def cancel_batch(self, vector_store_id: str, batch_id: str) -> VectorStoreFileBatch:
        """The batch's files still in progress are cancelled: recorded `cancelled` (from
        `in_progress` only: one that was completed meanwhile stays so), their chunks removed,
        their jobs on this replica skipped or dropped (the module's docstring)."""
        vector_store = await self.records.existing(vector_store_id)
        _, files = await self.batch_files(vector_store_id, batch_id)
        await self.records.cancel_batch(vector_store, batch_id)

        def cancelled(fields: dict[str, Any]) -> dict[str, Any] | None:
            # Attached by this batch (not again since by another request), or recorded before records named their batch.
            mine = fields.get("_batch") == batch_id or "_job" not in fields
            return fields | {"status": "cancelled"} if fields.get("status") == "in_progress" and mine else None

        for file in files:
            if file.status != "in_progress":
                continue
            fields, written = await self.records.change_file(vector_store, file.id, cancelled)
            if written and fields is not None:
                if "_job" in fields:
                    self.service.ingestion.cancel(fields["_job"])
                await self.service.index.remove_file(self._namespace(vector_store_id), file.id)
        return await self.batch(vector_store_id, batch_id)

    async def search(
        self,
        vector_store_ids: Sequence[str],
        query: str,
        *,
        max_results: int = 10,
        ranking: Ranking | None = None,
        filters: Filter | None = None,
        param: str = "vector_store_id",
    ) -> list[Hit]:
        """The best chunks of these stores for `query`, best first (404 for a store the tenant
        does not have, 400 for an expired one)."""
        stores = [await self.active(vector_store_id, param) for vector_store_id in vector_store_ids]
        try:
            vector = await self.service.embedder.embed([query])
        except EmbeddingUnavailable as exc:
            raise server_error(f"The embedding model could not be reached: {exc}", status_code=503) from None
        hits: list[Hit] = []
        for vector_store in stores:
            hits += await self.service.index.search(
                self._namespace(vector_store.id), query, vector, max_results=max_results, ranking=ranking or Ranking(), filters=filters
            )
        hits.sort(key=lambda hit: -hit.score)
        return hits[:max_results]


async def check_file_search(request: ResponsesRequest, stores: TenantVectorStores | None) -> None:
    """A request's `file_search` tool names only vector stores of the caller's that have not
    expired: else the 404 (400 for an expired one) the Vector Stores API answers for that id,
    naming `tools[i].vector_store_ids[j]`, before anything is generated, stored or charged
    (OpenAI's answer; the call would only have found nothing). `stores`: the caller's (None:
    this server has no vector stores, and the tool is left out of the response)."""
    if stores is None:
        return
    for index, tool in enumerate(request.tools):
        if isinstance(tool, FileSearchTool):
            for number, vector_store_id in enumerate(tool.vector_store_ids):  # at most MAX_VECTOR_STORES_PER_SEARCH
                await stores.records.check(vector_store_id, f"tools[{index}].vector_store_ids[{number}]")


def vector_store_service(config: VectorStoresConfig, embedder: Embedder | None = None, *, tenanted: bool = False) -> VectorStores:
    """The app's vector stores as `vector_stores:` config says (the tokenizer loads at the
    first ingestion); `embedder`: the served embedding model's (`embedding.type: vllm`);
    `tenanted`: callers are tenants (`auth`), each with its share of the ingestion queue."""
    if config.embedding.type == "vllm" and embedder is None:
        raise ValueError("vector_stores.embedding.type vllm is served by its EmbeddingServer deployment: build the app with build_app")
    embedder = embedder or HashingEmbedder(config.embedding.dimensions)
    index: VectorIndex
    if config.index == "pgvector":
        from serve_app.retrieval.pgvector import PgVectorIndex, PoolLimits

        assert config.url is not None  # the config requires it
        pool = PoolLimits(config.pool_min_size, config.pool_max_size, config.pool_timeout_s, config.pool_max_waiting)
        index = PgVectorIndex(
            config.url, embedder.dimensions, timeout_s=config.statement_timeout_s, password=os.environ.get(config.password_env), pool=pool
        )
    else:
        index = EmbeddedIndex(config.directory, embedder.dimensions)
    limits = VectorStoreLimits(
        max_stores_per_tenant=config.max_stores_per_tenant,
        max_files_per_store=config.max_files_per_store,
        max_file_chars=config.max_file_chars,
        max_chunks_per_store=config.max_chunks_per_store,
        ingest_timeout_s=config.ingest_timeout_s,
        max_search_results=config.max_search_results,
    )
    tokenizer = functools.partial(load_token_offsets, config.tokenizer)
    return VectorStores(
        index,
        embedder,
        tokenizer,
        limits,
        workers=config.ingest_workers,
        queue=config.ingest_queue,
        per_tenant=config.tenant_ingest_share() if tenanted else None,
    )

"""Vector stores' metadata in the state store, one tenant's (its `TenantStore`: another
tenant's id names nothing of the caller's and gets the 404 a missing id gets). Every backend
(memory, embedded, Redis) holds it the same way, through the `Store` interface.

Keys, under the tenant's prefix:
- `vs:{id}`: the `VectorStore` (the API's, `file_counts` and `usage_bytes` filled on read);
- `vs`: the tenant's store ids, oldest first (a deleted or expired id is pruned when met);
- `vs:{id}:files`: the store's file ids, in the order they were attached;
- `vsf:{id}:{file_id}`: the `VectorStoreFile`;
- `vsb:{id}:{batch_id}`: a `VectorStoreFileBatch` and its file ids.

Expiry (`expires_after: {anchor: last_active_at, days}`): `expires_at` moves with each use; a
store read after it is `expired` (a search of it is refused); every key carries the store's
TTL (a store without expiry: `DEFAULT_TTL_S`, renewed by use), so nothing stays forever.
- `vsq:{queue_id}`: a replica's ingestion queue is alive (runtime/vector_stores.py
  `Ingestion` renews it while it holds the tenant's files, `QUEUE_LEASE_S`).

A file's record also holds what its ingestion needs to know, never shown: the job that
ingests it (`_job`: each attach queues a new one), the queue that holds that job (`_queue`),
the batch that attached it (`_batch`) and when its ingestion started (`_started_at`). A
status changes only from `in_progress`, by compare-and-set (`change_file`), so a cancel and a
worker's `completed` never overwrite each other, whichever replica writes them.

A file still `in_progress` reads as `failed` (so none stays `in_progress` forever) when the
replica that queued it is gone (its queue's lease lapsed: a crash, a scale-down, a restart)
or its ingestion started more than `stale_after_s` ago (twice `ingest_timeout_s`: its worker
is stuck). A file waiting in a long queue of a live replica is not stale, however long it
waits.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

from openai.types import VectorStore
from openai.types.vector_stores import VectorStoreFile, VectorStoreFileBatch

from serve_app.api.errors import APIError
from serve_app.state.store import Store, StoreUnavailable

DAY_S = 86_400.0
DEFAULT_TTL_S = 365 * DAY_S
STORES_KEY = "vs"
MAX_CHANGE_TRIES = 16  # compare-and-set retries of one file's record (each lost to another writer)
FileStatus = Literal["in_progress", "completed", "cancelled", "failed"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def store_not_found(vector_store_id: str, param: str = "vector_store_id") -> APIError:
    return APIError(f"No vector store found with id '{vector_store_id}'.", status_code=404, param=param, code="not_found")


def store_expired(vector_store_id: str, param: str = "vector_store_id") -> APIError:
    return APIError(f"Vector store '{vector_store_id}' has expired.", status_code=400, param=param, code="vector_store_expired")


def file_not_in_store(file_id: str, vector_store_id: str) -> APIError:
    return APIError(
        f"No file found with id '{file_id}' in vector store '{vector_store_id}'.", status_code=404, param="file_id", code="not_found"
    )


def batch_not_found(batch_id: str) -> APIError:
    return APIError(f"No file batch found with id '{batch_id}'.", status_code=404, param="batch_id", code="not_found")


def queue_lease_key(queue_id: str) -> str:
    """The key that says the replica's ingestion queue `queue_id` is alive (under the tenant's prefix)."""
    return f"vsq:{queue_id}"


def _expired(data: dict[str, Any]) -> bool:
    expires_at = data.get("expires_at")
    return expires_at is not None and time.time() > expires_at


class VectorStoreRecords:
    """One tenant's vector stores, their files and batches (keys above)."""

    def __init__(self, store: Store, *, stale_after_s: float = 3600.0, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.stale_after_s = stale_after_s
        self.clock = clock  # wall-clock seconds: when an ingestion started, and now

    # -- stores --
    @staticmethod
    def _ttl(vector_store: VectorStore) -> float:
        if vector_store.expires_after is not None:
            return vector_store.expires_after.days * DAY_S + DAY_S  # read as expired for a day, then gone
        return DEFAULT_TTL_S

    async def create(self, name: str | None, metadata: dict[str, str] | None, expires_after: dict[str, Any] | None) -> VectorStore:
        now = int(time.time())
        vector_store = VectorStore.model_validate(
            {
                "id": new_id("vs"),
                "object": "vector_store",
                "created_at": now,
                "last_active_at": now,
                "name": name or "",
                "metadata": metadata,
                "status": "completed",
                "usage_bytes": 0,
                "file_counts": {"in_progress": 0, "completed": 0, "failed": 0, "cancelled": 0, "total": 0},
                "expires_after": expires_after,
                "expires_at": now + int(expires_after["days"] * DAY_S) if expires_after else None,
            }
        )
        await self._put_store(vector_store)
        await self.store.append(STORES_KEY, [vector_store.id.encode()], ttl_s=DEFAULT_TTL_S)
        return vector_store

    async def _put_store(self, vector_store: VectorStore) -> None:
        await self.store.put(
            f"vs:{vector_store.id}",
            vector_store.model_dump_json(exclude={"file_counts", "usage_bytes"}).encode(),
            ttl_s=self._ttl(vector_store),
        )

    async def get(self, vector_store_id: str) -> VectorStore | None:
        """The store with its file counts and usage (`status: expired` past `expires_at`)."""
        raw = await self.store.get(f"vs:{vector_store_id}")
        if raw is None:
            return None
        data = json.loads(raw)
        files = await self.files(vector_store_id)
        counts = {"in_progress": 0, "completed": 0, "failed": 0, "cancelled": 0}
        for file in files:
            counts[file.status] += 1
        data["file_counts"] = {**counts, "total": len(files)}
        data["usage_bytes"] = sum(file.usage_bytes for file in files)
        if _expired(data):
            data["status"] = "expired"
        else:
            data["status"] = "in_progress" if counts["in_progress"] else "completed"
        return VectorStore.model_validate(data)

    async def existing(self, vector_store_id: str, param: str = "vector_store_id") -> VectorStore:
        vector_store = await self.get(vector_store_id)
        if vector_store is None:
            raise store_not_found(vector_store_id, param)
        return vector_store

    async def check(self, vector_store_id: str, param: str = "vector_store_id") -> None:
        """That the tenant has this store (else the 404 `existing` gives) and it has not expired
        (else a 400), from its own record: none of its files is read."""
        raw = await self.store.get(f"vs:{vector_store_id}")
        if raw is None:
            raise store_not_found(vector_store_id, param)
        if _expired(json.loads(raw)):
            raise store_expired(vector_store_id, param)

    async def touch(self, vector_store: VectorStore, **changes: Any) -> VectorStore:
        """The store used (or changed): `last_active_at` now, its expiry moved along."""
        now = int(time.time())
        data = vector_store.model_dump() | changes | {"last_active_at": now}
        if data.get("expires_after"):
            data["expires_at"] = now + int(data["expires_after"]["days"] * DAY_S)
        else:
            data["expires_at"] = None
        updated = VectorStore.model_validate(data)
        await self._put_store(updated)
        keys = [f"vs:{updated.id}:files"] + [f"vsf:{updated.id}:{file_id}" for file_id in await self.file_ids(updated.id)]
        await self.store.expire(keys, self._ttl(updated))
        return updated

    async def ids(self) -> list[str]:
        return [raw.decode() for raw in await self.store.range(STORES_KEY)]

    async def all(self) -> list[VectorStore]:
        stores = []
        for vector_store_id in await self.ids():
            vector_store = await self.get(vector_store_id)
            if vector_store is None:
                await self.store.remove(STORES_KEY, vector_store_id.encode())
            else:
                stores.append(vector_store)
        return stores

    async def delete(self, vector_store_id: str) -> list[str]:
        """Forget the store (its files' records too); the ids of the files it held."""
        file_ids = await self.file_ids(vector_store_id)
        await self.store.delete(f"vs:{vector_store_id}")
        for file_id in file_ids:
            await self.store.delete(f"vsf:{vector_store_id}:{file_id}")
        await self.store.delete(f"vs:{vector_store_id}:files")
        await self.store.remove(STORES_KEY, vector_store_id.encode())
        return file_ids

    # -- files --
    async def file_ids(self, vector_store_id: str) -> list[str]:
        return [raw.decode() for raw in await self.store.range(f"vs:{vector_store_id}:files")]

    async def files(self, vector_store_id: str) -> list[VectorStoreFile]:
        files = []
        alive: dict[str, bool] = {}  # each queue's lease read once
        for file_id in await self.file_ids(vector_store_id):
            file = await self.get_file(vector_store_id, file_id, alive)
            if file is not None:
                files.append(file)
        return files

    async def file_fields(self, vector_store_id: str, file_id: str) -> dict[str, Any] | None:
        """The file's stored fields, the hidden `_` ones too, as written (no stale rule)."""
        raw = await self.store.get(f"vsf:{vector_store_id}:{file_id}")
        return None if raw is None else json.loads(raw)

    async def get_file(self, vector_store_id: str, file_id: str, alive: dict[str, bool] | None = None) -> VectorStoreFile | None:
        """The file as the API shows it: `failed` if its ingestion is stale (the module's docstring).
        `alive`: the queues' leases already read (by queue id)."""
        data = await self.file_fields(vector_store_id, file_id)
        if data is None:
            return None
        hidden = {key: data.pop(key) for key in [key for key in data if key.startswith("_")]}
        file = VectorStoreFile.model_validate(data)
        if file.status == "in_progress" and await self._stale(hidden, {} if alive is None else alive):
            stale = {
                "status": "failed",
                "last_error": {"code": "server_error", "message": "The file's ingestion did not finish; attach it again."},
            }
            return VectorStoreFile.model_validate(file.model_dump() | stale)
        return file

    async def _stale(self, hidden: dict[str, Any], alive: dict[str, bool]) -> bool:
        started = hidden.get("_started_at")
        if started is not None and self.clock() - started > self.stale_after_s:
            return True
        queue = hidden.get("_queue")
        if queue is None:  # recorded before queues had leases: judged by `_started_at` alone
            return False
        if queue not in alive:
            alive[queue] = await self.store.get(queue_lease_key(queue)) is not None
        return not alive[queue]

    async def put_file(
        self,
        vector_store: VectorStore,
        file: VectorStoreFile,
        *,
        new: bool = False,
        job_id: str | None = None,
        queue_id: str | None = None,
        batch_id: str | None = None,
    ) -> None:
        """Record the file as given (an attach: `in_progress`, queued as `job_id` in `queue_id`,
        by the batch `batch_id` if any), over any record it had."""
        data = file.model_dump(mode="json")
        hidden = {"_job": job_id, "_queue": queue_id, "_batch": batch_id}
        data |= {key: value for key, value in hidden.items() if value is not None}
        await self.store.put(f"vsf:{vector_store.id}:{file.id}", json.dumps(data).encode(), ttl_s=self._ttl(vector_store))
        if new:
            await self.store.append(f"vs:{vector_store.id}:files", [file.id.encode()], ttl_s=self._ttl(vector_store))

    async def change_file(
        self, vector_store: VectorStore, file_id: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]
    ) -> tuple[dict[str, Any] | None, bool]:
        """Change the file's record atomically: `change` is given its stored fields (hidden ones
        too) and returns the new ones, or None to leave it as it is; tried again (at most
        `MAX_CHANGE_TRIES` times) when another writer changed it meanwhile. The fields last read
        (None: there is no record) and whether `change` was written."""
        key = f"vsf:{vector_store.id}:{file_id}"
        for _ in range(MAX_CHANGE_TRIES):
            raw = await self.store.get(key)
            if raw is None:
                return None, False
            data = json.loads(raw)
            changed = change(dict(data))
            if changed is None:
                return data, False
            if await self.store.compare_and_set(key, raw, json.dumps(changed).encode(), ttl_s=self._ttl(vector_store)):
                return changed, True
        raise StoreUnavailable("A vector store file's record kept changing under this write; retry.")

    async def delete_file(self, vector_store_id: str, file_id: str) -> bool:
        existed = await self.store.delete(f"vsf:{vector_store_id}:{file_id}")
        while await self.store.remove(f"vs:{vector_store_id}:files", file_id.encode()):
            pass
        return existed

    # -- batches --
    async def put_batch(self, vector_store: VectorStore, batch: VectorStoreFileBatch, file_ids: list[str]) -> None:
        value = json.dumps({"batch": batch.model_dump(mode="json", exclude={"file_counts", "status"}), "file_ids": file_ids})
        await self.store.put(f"vsb:{vector_store.id}:{batch.id}", value.encode(), ttl_s=self._ttl(vector_store))

    async def get_batch(self, vector_store_id: str, batch_id: str) -> tuple[VectorStoreFileBatch, list[VectorStoreFile]] | None:
        raw = await self.store.get(f"vsb:{vector_store_id}:{batch_id}")
        if raw is None:
            return None
        data = json.loads(raw)
        alive: dict[str, bool] = {}
        files = [f for file_id in data["file_ids"] if (f := await self.get_file(vector_store_id, file_id, alive)) is not None]
        counts = {"in_progress": 0, "completed": 0, "failed": 0, "cancelled": 0}
        for file in files:
            counts[file.status] += 1
        # Cancelled when the cancel found some of its files still to ingest (else it changed
        # nothing), whatever its files attached again since by other requests are doing; the
        # API's batch has no `cancelling` (the SDK's type refuses it).
        cancelled = data["batch"].get("_cancelled") and counts["cancelled"]
        status = "cancelled" if cancelled else "in_progress" if counts["in_progress"] else "completed"
        if counts["failed"] == len(files) and files:
            status = "failed"
        batch = VectorStoreFileBatch.model_validate(
            {
                **{k: v for k, v in data["batch"].items() if not k.startswith("_")},
                "status": status,
                "file_counts": {**counts, "total": len(files)},
            }
        )
        return batch, files

    async def cancel_batch(self, vector_store: VectorStore, batch_id: str) -> bool:
        raw = await self.store.get(f"vsb:{vector_store.id}:{batch_id}")
        if raw is None:
            return False
        data = json.loads(raw)
        data["batch"]["_cancelled"] = True
        await self.store.put(f"vsb:{vector_store.id}:{batch_id}", json.dumps(data).encode(), ttl_s=self._ttl(vector_store))
        return True

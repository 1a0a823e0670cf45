"""The embedded store: one Serve replica holding a `MemoryStore`, and `HandleStore`, the
`Store` every ingress replica (on any node of the cluster) uses to reach it.

The replica runs every call on its one event loop and `MemoryStore` never awaits inside a
call, so each primitive is atomic across all ingress replicas. Its contents are lost when
the replica restarts (use Redis to keep them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import ray
from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException, RequestCancelledError
from ray.serve.handle import DeploymentHandle

from deployments.metrics import export_store_size
from serve_app.engines.cpu_cores import leave_batch_policy
from serve_app.state import MemoryStore, StoreUnavailable

# The replica gone or restarting, its queue full (BackPressureError), an error inside it: a 503.
_GONE = (RayError, RayServeException)


class StoreServer:
    """Serve deployment class of the embedded store (one replica)."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        leave_batch_policy()  # on the request path of stateful requests
        self.store = MemoryStore(max_entries=max_entries, max_bytes=max_bytes)
        export_store_size(self.store.stats)

    async def get(self, key: str) -> bytes | None:
        return await self.store.get(key)

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        await self.store.put(key, value, ttl_s=ttl_s)

    async def compare_and_set(self, key: str, expected: bytes | None, value: bytes | None, ttl_s: float) -> bool:
        return await self.store.compare_and_set(key, expected, value, ttl_s=ttl_s)

    async def delete(self, key: str) -> bool:
        return await self.store.delete(key)

    async def expire(self, keys: Sequence[str], ttl_s: float) -> int:
        return await self.store.expire(keys, ttl_s)

    async def append(self, key: str, values: Sequence[bytes], ttl_s: float, expected_length: int | None) -> int:
        return await self.store.append(key, values, ttl_s=ttl_s, expected_length=expected_length)

    async def range(self, key: str, start: int, stop: int | None) -> list[bytes]:
        return await self.store.range(key, start, stop)

    async def length(self, key: str) -> int:
        return await self.store.length(key)

    async def remove(self, key: str, value: bytes) -> bool:
        return await self.store.remove(key, value)

    async def take(self, key: str, capacity: float, per_s: float, cost: float, need: float) -> tuple[bool, float]:
        return await self.store.take(key, capacity=capacity, per_s=per_s, cost=cost, need=need)

    async def lease(self, key: str, holder: str, limit: int, ttl_s: float) -> int:
        return await self.store.lease(key, holder, limit=limit, ttl_s=ttl_s)

    async def renew(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> None:
        await self.store.renew(leases, ttl_s)

    async def release(self, key: str, holder: str) -> None:
        await self.store.release(key, holder)

    async def wait_length(self, key: str, beyond: int, timeout_s: float) -> int:
        """A long poll: held in this replica until the list grows past `beyond` (its own
        in-process notification) or `timeout_s` passes."""
        return await self.store.wait_length(key, beyond, timeout_s)

    async def stats(self) -> dict[str, Any]:
        return {**self.store.stats(), "actor_name": ray.get_runtime_context().get_actor_name()}


class HandleStore:
    """`Store` over a `StoreServer` deployment handle."""

    def __init__(self, handle: DeploymentHandle[StoreServer]) -> None:
        self._handle = handle

    async def _call(self, method: str, *args: Any) -> Any:
        """`StoreServer.<method>(*args)` on the replica; its result (each caller casts it to that method's type)."""
        try:
            return await getattr(self._handle, method).remote(*args)
        except RequestCancelledError:  # the caller's own cancellation (a waiter that left), not the store's failure
            raise asyncio.CancelledError from None
        except _GONE as exc:
            raise StoreUnavailable(f"The embedded response store is unavailable: {type(exc).__name__}; retry later.") from exc

    async def get(self, key: str) -> bytes | None:
        return cast(bytes | None, await self._call("get", key))

    async def put(self, key: str, value: bytes, *, ttl_s: float) -> None:
        await self._call("put", key, value, ttl_s)

    async def compare_and_set(self, key: str, expected: bytes | None, value: bytes | None, *, ttl_s: float) -> bool:
        return cast(bool, await self._call("compare_and_set", key, expected, value, ttl_s))

    async def delete(self, key: str) -> bool:
        return cast(bool, await self._call("delete", key))

    async def expire(self, keys: Sequence[str], ttl_s: float) -> int:
        return cast(int, await self._call("expire", list(keys), ttl_s))

    async def append(self, key: str, values: Sequence[bytes], *, ttl_s: float, expected_length: int | None = None) -> int:
        return cast(int, await self._call("append", key, list(values), ttl_s, expected_length))

    async def range(self, key: str, start: int = 0, stop: int | None = None) -> list[bytes]:
        return cast(list[bytes], await self._call("range", key, start, stop))

    async def length(self, key: str) -> int:
        return cast(int, await self._call("length", key))

    async def remove(self, key: str, value: bytes) -> bool:
        return cast(bool, await self._call("remove", key, value))

    async def take(self, key: str, *, capacity: float, per_s: float, cost: float, need: float) -> tuple[bool, float]:
        return cast(tuple[bool, float], await self._call("take", key, capacity, per_s, cost, need))

    async def lease(self, key: str, holder: str, *, limit: int, ttl_s: float) -> int:
        return cast(int, await self._call("lease", key, holder, limit, ttl_s))

    async def renew(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> None:
        await self._call("renew", list(leases), ttl_s)

    async def release(self, key: str, holder: str) -> None:
        await self._call("release", key, holder)

    async def wait_length(self, key: str, beyond: int, timeout_s: float) -> int:
        return cast(int, await self._call("wait_length", key, beyond, timeout_s))

    async def close(self) -> None:
        pass

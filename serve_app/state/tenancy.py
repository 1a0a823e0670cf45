"""Tenancy in the state layer: every key a tenant's state uses lives under its own prefix.

`ResponseStore`, `RunStore` and `ConversationStore` take the tenant when they are made and
reach the store only through `TenantStore`, so no read or write can leave the tenant's
namespace: another tenant's id, whatever a client writes in it, names a key of the caller's
own namespace, which does not hold it, and gets exactly what a missing id gets.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from serve_app.state.store import Store

# Tenant names as the config allows them: no ":", so a tenant's prefix is never a prefix of another's.
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def tenant_prefix(tenant: str) -> str:
    if not TENANT_NAME.fullmatch(tenant):
        raise ValueError(f"not a tenant name: {tenant!r}")
    return f"t:{tenant}:"


class TenantStore:
    """A `Store` holding one tenant's keys inside another `Store`."""

    def __init__(self, store: Store, tenant: str) -> None:
        self.inner = store
        self.tenant = tenant
        self.prefix = tenant_prefix(tenant)

    def _key(self, key: str) -> str:
        return self.prefix + key

    async def get(self, key: str) -> bytes | None:
        return await self.inner.get(self._key(key))

    async def put(self, key: str, value: bytes, *, ttl_s: float) -> None:
        await self.inner.put(self._key(key), value, ttl_s=ttl_s)

    async def compare_and_set(self, key: str, expected: bytes | None, value: bytes | None, *, ttl_s: float) -> bool:
        return await self.inner.compare_and_set(self._key(key), expected, value, ttl_s=ttl_s)

    async def delete(self, key: str) -> bool:
        return await self.inner.delete(self._key(key))

    async def expire(self, keys: Sequence[str], ttl_s: float) -> int:
        return await self.inner.expire([self._key(key) for key in keys], ttl_s)

    async def append(self, key: str, values: Sequence[bytes], *, ttl_s: float, expected_length: int | None = None) -> int:
        return await self.inner.append(self._key(key), values, ttl_s=ttl_s, expected_length=expected_length)

    async def range(self, key: str, start: int = 0, stop: int | None = None) -> list[bytes]:
        return await self.inner.range(self._key(key), start, stop)

    async def length(self, key: str) -> int:
        return await self.inner.length(self._key(key))

    async def remove(self, key: str, value: bytes) -> bool:
        return await self.inner.remove(self._key(key), value)

    async def take(self, key: str, *, capacity: float, per_s: float, cost: float, need: float) -> tuple[bool, float]:
        return await self.inner.take(self._key(key), capacity=capacity, per_s=per_s, cost=cost, need=need)

    async def lease(self, key: str, holder: str, *, limit: int, ttl_s: float) -> int:
        return await self.inner.lease(self._key(key), holder, limit=limit, ttl_s=ttl_s)

    async def renew(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> None:
        await self.inner.renew([(self._key(key), holder) for key, holder in leases], ttl_s)

    async def release(self, key: str, holder: str) -> None:
        await self.inner.release(self._key(key), holder)

    async def wait_length(self, key: str, beyond: int, timeout_s: float) -> int:
        return await self.inner.wait_length(self._key(key), beyond, timeout_s)

    async def close(self) -> None:
        pass  # the shared store is closed by its owner

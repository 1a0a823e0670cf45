"""The embedded store full: whose keys go. It evicted the keys written longest ago, whoever's:
a tenant that wrote a gigabyte (within a generous rate limit, or with none) evicted every other tenant's
stored responses, conversations and background runs, and its own quota counters (its rate
limit started again from full). Now the tenant holding the most loses its own oldest keys,
and quota keys are never evicted (they expire)."""

from __future__ import annotations

import pytest

from serve_app.state import MemoryStore
from serve_app.state.tenancy import TenantStore

pytestmark = pytest.mark.anyio


async def test_a_tenant_filling_the_store_evicts_its_own_keys_not_the_others():
    store = MemoryStore(max_entries=1_000, max_bytes=64 * 1024)
    a, b = TenantStore(store, "team-a"), TenantStore(store, "team-b")
    for i in range(5):
        await a.put(f"response:a{i}", b"a" * 1000, ttl_s=600)
    assert (await b.take("quota:requests", capacity=2, per_s=2 / 60, cost=1, need=1))[0]
    assert (await b.take("quota:requests", capacity=2, per_s=2 / 60, cost=1, need=1))[0]
    for i in range(500):  # ~300 KiB into a 64 KiB store
        await b.put(f"conversation:b{i}", b"b" * 600, ttl_s=600)
    assert [await a.get(f"response:a{i}") for i in range(5)] == [b"a" * 1000] * 5
    assert await b.get("conversation:b499") is not None
    assert await b.get("conversation:b0") is None
    refused, _ = await b.take("quota:requests", capacity=2, per_s=2 / 60, cost=1, need=1)
    assert not refused  # its counter was kept: still used up
    assert store.stats()["bytes"] <= 64 * 1024


async def test_the_entry_bound_takes_from_the_tenant_with_the_most_keys():
    store = MemoryStore(max_entries=20)
    a, b = TenantStore(store, "team-a"), TenantStore(store, "team-b")
    for i in range(5):
        await a.put(f"k{i}", b"x", ttl_s=600)
    for i in range(100):
        await b.put(f"k{i}", b"x", ttl_s=600)
    assert all([await a.get(f"k{i}") for i in range(5)])
    assert store.stats()["entries"] == 20


async def test_one_entry_larger_than_the_budget_goes_itself():
    store = MemoryStore(max_bytes=1_000)
    a, b = TenantStore(store, "team-a"), TenantStore(store, "team-b")
    await a.put("small", b"x" * 100, ttl_s=600)
    await b.put("huge", b"x" * 5_000, ttl_s=600)
    assert await b.get("huge") is None
    assert await a.get("small") == b"x" * 100

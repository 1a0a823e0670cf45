"""The store's quota primitives (token buckets, expiring leases) on every backend: atomic under
concurrency, timed by the store's own clock. What the quotas build on them: tests/state/test_quotas.py."""

from __future__ import annotations

import asyncio
import math

import pytest

from serve_app.state import Store

pytestmark = pytest.mark.anyio


async def test_a_bucket_starts_full_and_refuses_when_empty(store: Store):
    for left in (2, 1, 0):
        granted, level = await store.take("b", capacity=3, per_s=0.001, cost=1, need=1)
        assert granted
        assert level == pytest.approx(left, abs=0.01)
    granted, level = await store.take("b", capacity=3, per_s=0.001, cost=1, need=1)
    assert not granted
    assert level == pytest.approx(0, abs=0.01)
    assert (await store.take("other", capacity=3, per_s=0.001, cost=1, need=1))[0]  # buckets are per key


@pytest.mark.slow
async def test_a_bucket_refills_continuously_up_to_its_capacity(store: Store):
    await store.take("b", capacity=4, per_s=20, cost=4, need=1)
    assert not (await store.take("b", capacity=4, per_s=20, cost=1, need=1))[0]
    await asyncio.sleep(0.1)  # 2 back
    granted, level = await store.take("b", capacity=4, per_s=20, cost=0, need=1)
    assert granted
    assert 1.5 < level < 3.5
    await asyncio.sleep(0.5)  # full, not more
    assert (await store.take("b", capacity=4, per_s=20, cost=0, need=1))[1] == pytest.approx(4)


async def test_usage_past_the_limit_is_a_debt_to_wait_out(store: Store):
    granted, level = await store.take("b", capacity=10, per_s=0.001, cost=25, need=-math.inf)
    assert granted
    assert level == pytest.approx(-15, abs=0.01)
    assert not (await store.take("b", capacity=10, per_s=0.001, cost=0, need=1))[0]


async def test_concurrent_takes_never_exceed_the_capacity(store: Store):
    results = await asyncio.gather(*(store.take("b", capacity=10, per_s=0.0001, cost=1, need=1) for _ in range(25)))
    assert sum(granted for granted, _ in results) == 10


async def test_leases_hold_places_up_to_the_limit(store: Store):
    assert await store.lease("l", "h1", limit=2, ttl_s=60) == 1
    assert await store.lease("l", "h2", limit=2, ttl_s=60) == 2
    assert await store.lease("l", "h3", limit=2, ttl_s=60) == -1
    assert await store.lease("l", "h1", limit=2, ttl_s=60) == 2  # a holder renews its own
    await store.release("l", "h1")
    await store.release("l", "h1")  # twice: nothing
    assert await store.lease("l", "h3", limit=2, ttl_s=60) == 2
    await store.release("l", "never-held")


async def test_a_lease_not_renewed_expires_and_one_renewed_does_not(store: Store):
    await store.lease("l", "dead", limit=2, ttl_s=0.3)
    await store.lease("l", "alive", limit=2, ttl_s=0.3)
    await asyncio.sleep(0.2)
    await store.renew([("l", "alive")], 0.3)
    await asyncio.sleep(0.2)  # "dead" has expired, "alive" has not
    assert await store.lease("l", "new", limit=2, ttl_s=60) == 2
    assert await store.lease("l", "newer", limit=2, ttl_s=60) == -1


async def test_renewing_takes_a_lost_lease_back_whatever_the_limit(store: Store):
    """A running request whose lease lapsed (the store was slow) is still running: it counts."""
    await store.lease("l", "slow", limit=1, ttl_s=0.1)
    await asyncio.sleep(0.2)
    assert await store.lease("l", "other", limit=1, ttl_s=60) == 1
    await store.renew([("l", "slow"), ("m", "x")], 60)
    assert await store.lease("l", "third", limit=2, ttl_s=60) == -1  # slow and other hold both places


async def test_concurrent_leases_never_exceed_the_limit(store: Store):
    results = await asyncio.gather(*(store.lease("l", f"h{i}", limit=5, ttl_s=60) for i in range(20)))
    assert sum(n > 0 for n in results) == 5

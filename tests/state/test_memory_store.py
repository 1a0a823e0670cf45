"""`MemoryStore` (the embedded store's) stays cheap as it fills: the work of a write does not
grow with the number of keys. Counted, not timed: its clock's time counts how often it is
compared with an expiry, whatever the implementation does with it (a scan of every key on
each write compares it 100,000 times a write at 100,000 keys)."""

from __future__ import annotations

import asyncio
import random

import pytest

from serve_app.state import MemoryStore


class Now(float):
    """A time that counts the comparisons made with it."""

    compared = 0

    def _count(self, other: object, result: bool) -> bool:
        Now.compared += 1
        return result

    def __lt__(self, other):
        return self._count(other, float(self) < other)

    def __le__(self, other):
        return self._count(other, float(self) <= other)

    def __gt__(self, other):
        return self._count(other, float(self) > other)

    def __ge__(self, other):
        return self._count(other, float(self) >= other)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> Now:
        return Now(self.t)


KEYS = 100_000


@pytest.mark.slow
def test_writes_at_100k_keys_compare_the_time_a_few_times_each():
    clock = Clock()
    store = MemoryStore(max_entries=KEYS, max_bytes=1 << 30, clock=clock)
    rng = random.Random(0)

    async def fill_then_write() -> tuple[float, float]:
        Now.compared = 0
        for i in range(KEYS):  # keys with TTLs from ten minutes to ten days
            await store.put(f"k{i}", b"v", ttl_s=rng.uniform(600, 864_000))
            if i % 1_000 == 999:  # filling it is linear too (a scan per write would be quadratic)
                assert Now.compared < 10 * (i + 1), f"{Now.compared} comparisons with the time for {i + 1} writes"
        Now.compared = 0
        for i in range(2_000):  # writes as time goes on: keys expire, are refreshed, replaced
            clock.t += 5.0
            await store.put(f"new{i}", b"v" * 10, ttl_s=rng.uniform(60, 86_400))
            await store.append(f"list{i % 50}", [b"e"], ttl_s=600)
            await store.expire([f"k{rng.randrange(KEYS)}"], 3_600)
            await store.compare_and_set(f"k{rng.randrange(KEYS)}", b"v", b"w", ttl_s=60)
        writes = 2_000 * 4
        return Now.compared / writes, store.stats()["entries"]

    per_write, entries = asyncio.run(fill_then_write())
    assert entries > 0.9 * KEYS  # still full: the writes ran at ~100,000 keys
    assert per_write < 10, f"{per_write:.1f} comparisons with the time per write"


def test_expired_keys_go_and_the_heap_of_expiries_stays_bounded():
    """Keys refreshed again and again leave stale heap entries: the heap is rebuilt, so it
    holds at most about twice the keys; expired keys are gone at the next write."""
    clock = Clock()
    store = MemoryStore(clock=clock)

    async def run() -> None:
        for i in range(100):
            await store.put(f"k{i}", b"v", ttl_s=10)
        for _ in range(50):
            await store.expire([f"k{i}" for i in range(100)], 10)
            assert len(store._expiries) <= 2 * 100 + 64
        clock.t = 11
        await store.put("other", b"v", ttl_s=100)
        assert store.stats()["entries"] == 1
        assert [await store.get(f"k{i}") for i in range(3)] == [None, None, None]

    asyncio.run(run())

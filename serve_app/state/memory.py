"""`MemoryStore`: the store in one process's memory, bounded, oldest out first.

Used directly for tests and a single-replica app (`store: {type: memory}`), and inside the
embedded store deployment (`deployments/store.py`), whose one replica every ingress replica
calls. Each method runs without awaiting, so on one event loop every call is atomic.

Every call costs O(log n) at most in the number of keys n (and O(t) in the number of tenants
t): keys expire through a heap of their expiry times (the due ones are taken off its top),
and when a bound is reached the keys written longest ago go first, from an ordered dict per
tenant — of the tenant holding the most (state/tenancy.py names a key's tenant), so that one
tenant filling the store evicts its own keys, not the others'. Quota counters and leases
(`t:TENANT:quota:...`) are never evicted, only expired: evicting them would reset a
tenant's limits (they are a few small keys per tenant). A key given a new expiry leaves its
old heap entry behind, skipped when it comes up; the heap is rebuilt once those outnumber
the keys. (A scan of every key on each write cost 14 ms a write at 100,000 keys.)

`wait_length` waits on this process's own notification: every write to a key wakes the
waiters of that key (a future each), which then look at the key again.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from serve_app.state.store import bucket_ttl_s


@dataclass(slots=True)
class _Entry:
    value: bytes | list[bytes]
    expires_at: float
    size: int
    stamp: int  # of its current entry in the expiry heap


def _size(key: str, value: bytes | list[bytes]) -> int:
    return len(key) + (len(value) if isinstance(value, bytes) else sum(len(v) for v in value))


def _owner(key: str) -> tuple[str, bool]:
    """The tenant of a key (`t:TENANT:...`; "" for any other key) and whether the bounds may
    evict it (not a quota key)."""
    if key.startswith("t:") and (end := key.find(":", 2)) > 0:
        return key[2:end], not key.startswith("quota:", end + 1)
    return "", True


class MemoryStore:
    """At most `max_entries` keys and `max_bytes` of keys and values; when either would be
    exceeded the keys written (or refreshed) longest ago go first, of the tenant holding the
    most (quota keys never: they expire)."""

    def __init__(self, max_entries: int = 100_000, max_bytes: int = 1 << 30, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._bytes = 0
        # The keys the bounds may evict, per tenant, oldest first, and their bytes.
        self._evictable: dict[str, OrderedDict[str, None]] = {}
        self._evictable_bytes: dict[str, int] = {}
        self._expiries: list[tuple[float, int, str]] = []  # (expires_at, stamp, key), a heap
        self._stamps = itertools.count()
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}  # `wait_length` callers, by key

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._entries), "bytes": self._bytes}

    # -- bookkeeping --

    def _live(self, key: str) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.expires_at <= self._clock():
            self._drop(key)
            return None
        return entry

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.size
        owner, evictable = _owner(key)
        if evictable:
            order = self._evictable[owner]
            del order[key]
            self._evictable_bytes[owner] -= entry.size
            if not order:
                del self._evictable[owner], self._evictable_bytes[owner]

    def _grow(self, key: str, size: int) -> None:
        """`key` (in `_entries`) is `size` bytes larger and now the newest of its tenant's."""
        self._bytes += size
        owner, evictable = _owner(key)
        if evictable:
            self._evictable.setdefault(owner, OrderedDict())[key] = None
            self._evictable[owner].move_to_end(key)
            self._evictable_bytes[owner] = self._evictable_bytes.get(owner, 0) + size

    def _wake(self, key: str) -> None:
        """`key` changed: its waiters look again."""
        for waiter in self._waiters.pop(key, ()):
            if not waiter.done():
                waiter.set_result(None)

    def _set(self, key: str, value: bytes | list[bytes], ttl_s: float) -> None:
        self._wake(key)
        if key in self._entries:
            self._drop(key)
        entry = _Entry(value, 0.0, _size(key, value), 0)
        self._entries[key] = entry
        self._grow(key, entry.size)
        self._expire_at(key, entry, self._clock() + ttl_s)
        self._evict(keep=key)

    def _expire_at(self, key: str, entry: _Entry, expires_at: float) -> None:
        entry.expires_at, entry.stamp = expires_at, next(self._stamps)
        heapq.heappush(self._expiries, (expires_at, entry.stamp, key))
        if len(self._expiries) > 2 * len(self._entries) + 64:  # mostly stale: rebuilt, O(n) once per n pushes
            self._expiries = [(e.expires_at, e.stamp, k) for k, e in self._entries.items()]
            heapq.heapify(self._expiries)

    def _evict(self, keep: str) -> None:
        now = self._clock()
        while self._expiries and self._expiries[0][0] <= now:
            _, stamp, key = heapq.heappop(self._expiries)
            entry = self._entries.get(key)
            if entry is not None and entry.stamp == stamp:  # not a stale one
                self._drop(key)
        while self._evictable and (len(self._entries) > self.max_entries or self._bytes > self.max_bytes):
            if self._bytes > self.max_bytes:
                owner = max(self._evictable_bytes, key=self._evictable_bytes.__getitem__)
            else:
                owner = max(self._evictable, key=lambda tenant: len(self._evictable[tenant]))
            oldest = next(iter(self._evictable[owner]))
            self._drop(oldest)
            if oldest == keep:  # its tenant has nothing older: the entry that went over goes itself
                return

    # -- values --

    async def get(self, key: str) -> bytes | None:
        entry = self._live(key)
        return entry.value if entry is not None and isinstance(entry.value, bytes) else None

    async def put(self, key: str, value: bytes, *, ttl_s: float) -> None:
        self._set(key, bytes(value), ttl_s)

    async def compare_and_set(self, key: str, expected: bytes | None, value: bytes | None, *, ttl_s: float) -> bool:
        entry = self._live(key)
        current = None if entry is None else entry.value
        if current != expected:
            return False
        if value is None:
            if entry is not None:
                self._drop(key)
        else:
            self._set(key, bytes(value), ttl_s)
        return True

    async def delete(self, key: str) -> bool:
        if self._live(key) is None:
            return False
        self._drop(key)
        self._wake(key)
        return True

    async def expire(self, keys: Sequence[str], ttl_s: float) -> int:
        found = 0
        for key in keys:
            entry = self._live(key)
            if entry is not None:
                self._expire_at(key, entry, self._clock() + ttl_s)
                self._grow(key, 0)
                found += 1
        return found

    # -- lists --

    async def append(self, key: str, values: Sequence[bytes], *, ttl_s: float, expected_length: int | None = None) -> int:
        entry = self._live(key)
        if entry is None or not isinstance(entry.value, list):  # a value at `key` is replaced
            if expected_length not in (None, 0):
                return -1
            self._set(key, [bytes(v) for v in values], ttl_s)
            return len(values)
        if expected_length is not None and len(entry.value) != expected_length:
            return -1
        # In place: an event log grows by a batch at a time, copying it would be quadratic.
        added = [bytes(v) for v in values]
        entry.value.extend(added)
        entry.size += sum(len(v) for v in added)
        self._expire_at(key, entry, self._clock() + ttl_s)
        self._grow(key, sum(len(v) for v in added))
        self._wake(key)
        length = len(entry.value)
        self._evict(keep=key)
        return length

    async def range(self, key: str, start: int = 0, stop: int | None = None) -> list[bytes]:
        entry = self._live(key)
        if entry is None or not isinstance(entry.value, list):
            return []
        return entry.value[start:stop]

    async def length(self, key: str) -> int:
        entry = self._live(key)
        return len(entry.value) if entry is not None and isinstance(entry.value, list) else 0

    async def remove(self, key: str, value: bytes) -> bool:
        entry = self._live(key)
        if entry is None or not isinstance(entry.value, list) or value not in entry.value:
            return False
        remaining = list(entry.value)
        remaining.remove(value)
        expires_at = entry.expires_at
        self._set(key, remaining, max(expires_at - self._clock(), 0.0))
        return True

    # -- notification --

    async def wait_length(self, key: str, beyond: int, timeout_s: float) -> int:
        length = await self.length(key)
        if length > beyond or timeout_s <= 0:
            return length
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, set()).add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, timeout_s)
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[key]
        return await self.length(key)

    # -- quotas --

    async def take(self, key: str, *, capacity: float, per_s: float, cost: float, need: float) -> tuple[bool, float]:
        now = self._clock()
        entry = self._live(key)
        level = capacity
        if entry is not None and isinstance(entry.value, bytes):
            stored, at = json.loads(entry.value)
            level = min(capacity, stored + (now - at) * per_s)
        if level < need:
            return False, level
        level -= cost
        self._set(key, json.dumps([level, now]).encode(), bucket_ttl_s(capacity, per_s, level))
        return True, level

    def _holders(self, key: str) -> dict[str, float]:
        entry = self._live(key)
        if entry is None or not isinstance(entry.value, bytes):
            return {}
        now = self._clock()
        return {holder: until for holder, until in json.loads(entry.value).items() if until > now}

    async def lease(self, key: str, holder: str, *, limit: int, ttl_s: float) -> int:
        holders = self._holders(key)
        if holder not in holders and len(holders) >= limit:
            return -1
        holders[holder] = self._clock() + ttl_s
        self._set(key, json.dumps(holders).encode(), ttl_s)
        return len(holders)

    async def renew(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> None:
        for key, holder in leases:
            holders = self._holders(key)
            holders[holder] = self._clock() + ttl_s
            self._set(key, json.dumps(holders).encode(), ttl_s)

    async def release(self, key: str, holder: str) -> None:
        holders = self._holders(key)
        if holders.pop(holder, None) is not None:
            if holders:
                self._set(key, json.dumps(holders).encode(), max(holders.values()) - self._clock())
            else:
                self._drop(key)

    async def close(self) -> None:
        pass

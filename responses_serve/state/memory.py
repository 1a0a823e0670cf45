"""`MemoryStore`: the store in one process's memory, bounded, oldest out first.

Used directly for tests and a single-replica app (`store: {type: memory}`), and inside the
embedded store deployment (`responses_serve/serve/store.py`), whose one replica every ingress replica
calls. Each method runs without awaiting, so on one event loop every call is atomic.

Every call costs O(log n) at most in the number of keys n: keys expire through a heap of
their expiry times (the due ones are taken off its top), and the keys written longest ago
go first from an ordered dict when a bound is reached. A key given a new expiry leaves its
old heap entry behind, skipped when it comes up; the heap is rebuilt once those outnumber
the keys. (A scan of every key on each write cost 14 ms a write at 100,000 keys.)
"""

from __future__ import annotations

import heapq
import itertools
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from responses_serve.state.store import bucket_ttl_s


@dataclass(slots=True)
class _Entry:
    value: bytes | list[bytes]
    expires_at: float
    size: int
    stamp: int  # of its current entry in the expiry heap


def _size(key: str, value: bytes | list[bytes]) -> int:
    return len(key) + (len(value) if isinstance(value, bytes) else sum(len(v) for v in value))


class MemoryStore:
    """At most `max_entries` keys and `max_bytes` of keys and values; when either would be
    exceeded the keys written (or refreshed) longest ago go first."""

    def __init__(self, max_entries: int = 100_000, max_bytes: int = 1 << 30, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._expiries: list[tuple[float, int, str]] = []  # (expires_at, stamp, key), a heap
        self._stamps = itertools.count()

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

    def _set(self, key: str, value: bytes | list[bytes], ttl_s: float) -> None:
        if key in self._entries:
            self._drop(key)
        entry = _Entry(value, 0.0, _size(key, value), 0)
        self._entries[key] = entry
        self._bytes += entry.size
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
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            oldest = next(iter(self._entries))
            if oldest == keep:  # one entry larger than the whole budget: it goes too
                self._drop(oldest)
                return
            self._drop(oldest)

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
        return True

    async def expire(self, keys: Sequence[str], ttl_s: float) -> int:
        found = 0
        for key in keys:
            entry = self._live(key)
            if entry is not None:
                self._expire_at(key, entry, self._clock() + ttl_s)
                self._entries.move_to_end(key)
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
        self._bytes += sum(len(v) for v in added)
        self._entries.move_to_end(key)
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

"""The one store interface every backend implements, and the time bound around it.

A few general primitives over byte strings, each atomic on every backend, so that one
contract test suite (tests/state/test_store_contract.py) covers them all and everything above
(responses, background runs, conversations) is written once:

- values: `get`, `put`, `compare_and_set` (create-once, leases, flags), `delete`, `expire`;
- lists, append-only (event logs, conversation items): `append` (all values or none,
  optionally only at an expected length), `range`, `length`, `remove`;
- quotas (serve_app/state/quotas.py): token buckets (`take`) and expiring leases
  (`lease`, `renew`, `release`), timed by the store's own clock so that every replica agrees;
- a notification: `wait_length` returns as soon as a list grows past a length (a follower of
  a background run waits on it instead of reading the log over and over). Each backend
  notifies its own way: `MemoryStore` in its process (the embedded store in its replica, which
  every ingress replica calls), `RedisStore` by pub/sub; the wait is bounded, and a
  notification lost (a dropped connection) costs a waiter only its timeout, never a hang.

Every write carries a TTL (seconds): nothing stays forever. Values and lists share one key
space; `delete` and `expire` work on both. Keys are plain strings; a backend may prefix
them (Redis: several Serve apps share one server).

Backends raise `StoreUnavailable` when they cannot answer (connection refused, actor gone);
`BoundedStore` adds a timeout to every call so a slow store is an unavailable one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from serve_app.api.errors import APIError, retry_after

logger = logging.getLogger(__name__)

T = TypeVar("T")


class StoreUnavailable(APIError):
    """The store did not answer, or refused (down, unreachable, out of memory, without the
    permission, slower than the timeout): a 503 with `Retry-After`."""

    def __init__(self, message: str = "The response store is unavailable; retry later.") -> None:
        super().__init__(message, status_code=503, code="store_unavailable", type="server_error")
        retry_after(self, 1)


@runtime_checkable
class Store(Protocol):
    # -- values --
    async def get(self, key: str) -> bytes | None:
        """The value at `key`, or None (absent, expired, or a list)."""

    async def put(self, key: str, value: bytes, *, ttl_s: float) -> None:
        """Set `key` to `value` (replacing a value or a list) for `ttl_s` seconds."""

    async def compare_and_set(self, key: str, expected: bytes | None, value: bytes | None, *, ttl_s: float) -> bool:
        """Atomically: if the value at `key` equals `expected` (None: absent), set it to
        `value` (None: delete it) with `ttl_s`, and return True; else change nothing, False."""

    async def delete(self, key: str) -> bool:
        """Remove a value or list; True if there was one."""

    async def expire(self, keys: Sequence[str], ttl_s: float) -> int:
        """Give existing keys a fresh TTL (a read that should keep them alive); absent keys are
        skipped. The number of keys that existed."""

    # -- append-only lists --
    async def append(self, key: str, values: Sequence[bytes], *, ttl_s: float, expected_length: int | None = None) -> int:
        """Atomically append `values` (all or none) and set the list's TTL; the new length.
        With `expected_length`, append only if the list has exactly that many elements
        (absent = 0), else append nothing and return -1 (one writer per sequence)."""

    async def range(self, key: str, start: int = 0, stop: int | None = None) -> list[bytes]:
        """Elements `start` (>= 0) up to `stop` (exclusive; None: the end), like `list[start:stop]`."""

    async def length(self, key: str) -> int:
        """Elements in the list at `key` (0 if absent)."""

    async def remove(self, key: str, value: bytes) -> bool:
        """Remove the first element equal to `value`; True if one was removed."""

    # -- quotas: token buckets and leases, each read-modify-write atomic, on the store's own clock --
    async def take(self, key: str, *, capacity: float, per_s: float, cost: float, need: float) -> tuple[bool, float]:
        """A token bucket at `key` (absent: full), refilled at `per_s` up to `capacity`: if it
        holds at least `need`, take `cost` (it may go below zero: a debt that refills) and
        return (True, the level left); else take nothing: (False, the level)."""

    async def lease(self, key: str, holder: str, *, limit: int, ttl_s: float) -> int:
        """Hold a place among the leases at `key` for `ttl_s` (a holder that has one renews
        it): the number of live leases, or -1 if `limit` are held by others. A lease not
        renewed or released expires: a holder that died frees its place."""

    async def renew(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> None:
        """Give these (key, holder) leases `ttl_s` more, whatever the limit (taken back if one expired meanwhile)."""

    async def release(self, key: str, holder: str) -> None:
        """Give a lease up (absent: nothing happens)."""

    # -- notification --
    async def wait_length(self, key: str, beyond: int, timeout_s: float) -> int:
        """Wait until the list at `key` holds more than `beyond` elements, at most `timeout_s`
        seconds: its length then (at most `beyond` when the time ran out or the list is gone).
        Returns at once when it already does."""

    async def close(self) -> None:
        """Release connections (idempotent)."""


def bucket_ttl_s(capacity: float, per_s: float, level: float) -> float:
    """How long a bucket's state matters: until it is full again (then it is as if absent)."""
    return (capacity - level) / per_s + 1.0


class BoundedStore:
    """A `Store` whose every call ends within `timeout_s` (a slow store is an unavailable
    one), and whose every failure is `StoreUnavailable`: whatever a backend raises (a Redis
    error, a Ray error, a bug), the caller gets a 503 and a stream its terminal event, never
    an exception it did not expect. The details go to the log.

    A call that times out may still happen on the backend (a write in flight); every write
    is a single atomic primitive, so a reader sees it whole or not at all.
    """

    def __init__(self, store: Store, timeout_s: float) -> None:
        self.inner = store
        self.timeout_s = timeout_s

    async def _bounded(self, call: Awaitable[T], wait_s: float = 0.0) -> T:
        """`call`, within the timeout (plus `wait_s`, a wait the call is asked to make)."""
        try:
            return await asyncio.wait_for(call, self.timeout_s + wait_s)
        except TimeoutError:
            raise StoreUnavailable(f"The response store did not answer within {self.timeout_s:g} s; retry later.") from None
        except StoreUnavailable:
            raise
        except Exception as exc:  # not CancelledError: a caller that goes away is not a store failure
            logger.exception("the response store failed")
            raise StoreUnavailable(f"The response store failed ({type(exc).__name__}); retry later.") from exc

    async def get(self, key: str) -> bytes | None:
        return await self._bounded(self.inner.get(key))

    async def put(self, key: str, value: bytes, *, ttl_s: float) -> None:
        return await self._bounded(self.inner.put(key, value, ttl_s=ttl_s))

    async def compare_and_set(self, key: str, expected: bytes | None, value: bytes | None, *, ttl_s: float) -> bool:
        return await self._bounded(self.inner.compare_and_set(key, expected, value, ttl_s=ttl_s))

    async def delete(self, key: str) -> bool:
        return await self._bounded(self.inner.delete(key))

    async def expire(self, keys: Sequence[str], ttl_s: float) -> int:
        return await self._bounded(self.inner.expire(keys, ttl_s))

    async def append(self, key: str, values: Sequence[bytes], *, ttl_s: float, expected_length: int | None = None) -> int:
        return await self._bounded(self.inner.append(key, values, ttl_s=ttl_s, expected_length=expected_length))

    async def range(self, key: str, start: int = 0, stop: int | None = None) -> list[bytes]:
        return await self._bounded(self.inner.range(key, start, stop))

    async def length(self, key: str) -> int:
        return await self._bounded(self.inner.length(key))

    async def remove(self, key: str, value: bytes) -> bool:
        return await self._bounded(self.inner.remove(key, value))

    async def take(self, key: str, *, capacity: float, per_s: float, cost: float, need: float) -> tuple[bool, float]:
        return await self._bounded(self.inner.take(key, capacity=capacity, per_s=per_s, cost=cost, need=need))

    async def lease(self, key: str, holder: str, *, limit: int, ttl_s: float) -> int:
        return await self._bounded(self.inner.lease(key, holder, limit=limit, ttl_s=ttl_s))

    async def renew(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> None:
        return await self._bounded(self.inner.renew(leases, ttl_s))

    async def release(self, key: str, holder: str) -> None:
        return await self._bounded(self.inner.release(key, holder))

    async def wait_length(self, key: str, beyond: int, timeout_s: float) -> int:
        # The wait is the caller's; the store's answer after it is bounded as any other.
        return await self._bounded(self.inner.wait_length(key, beyond, timeout_s), wait_s=timeout_s)

    async def close(self) -> None:
        await self.inner.close()

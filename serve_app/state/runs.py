"""Background runs as every replica sees them, over any `Store`.

A background response has, next to its stored turn (`responses.py`, which holds the
`Response` snapshot GET shows):

- `run:{id}`, a small JSON record: the replica running it (`owner`), its lease
  (`lease_until`, wall-clock seconds, renewed while it runs), `cancel` (asked by any
  replica), and once the run is over `closed` with the event log's final `length` and the
  run's `status`. Changed only by compare-and-set (`update`), so concurrent writers (the
  owner renewing, another replica cancelling or expiring it) never lose each other's change.
- `events:{id}`, the SSE frames of its events, one element per event: the element index is
  the event's `sequence_number`. Only ever appended at an expected length, so there is one
  writer per position: a presumed-dead owner that wakes up after another replica declared
  its run failed is refused, and stops.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from serve_app.state.store import Store
from serve_app.state.tenancy import TenantStore

DEFAULT_LEASE_S = 10.0
EVENTS_TTL_S = 24 * 3600.0  # a run's record and event log: for resuming streams, not for keeping
_CAS_ATTEMPTS = 20


OPEN_RUNS_KEY = "runs:open"  # ids of the tenant's runs not closed yet, for the sweepers


def run_key(response_id: str) -> str:
    return f"run:{response_id}"


def events_key(response_id: str) -> str:
    return f"events:{response_id}"


@dataclass(frozen=True, slots=True)
class RunRecord:
    owner: str
    lease_until: float
    cancel: bool = False
    closed: bool = False
    length: int | None = None  # events in the log once closed
    status: str | None = None  # the run's final status once closed

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> RunRecord:
        return cls(**json.loads(data))

    def expired(self, now: float) -> bool:
        return not self.closed and self.lease_until < now


class RunStore:
    """One tenant's records and event logs of background runs (its keys under the tenant's
    prefix), kept `ttl_s` (default a day; the response itself is stored as long as any).
    `clock` is wall-clock time: leases are compared across replicas and nodes."""

    def __init__(
        self,
        store: Store,
        tenant: str,
        ttl_s: float = EVENTS_TTL_S,
        lease_s: float = DEFAULT_LEASE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tenant = tenant
        self.store = TenantStore(store, tenant)
        self.ttl_s = ttl_s
        self.lease_s = lease_s
        self.clock = clock

    async def create(self, response_id: str, owner: str) -> RunRecord:
        record = RunRecord(owner=owner, lease_until=self.clock() + self.lease_s)
        if not await self.store.compare_and_set(run_key(response_id), None, record.encode(), ttl_s=self.ttl_s):
            raise RuntimeError(f"background run {response_id} exists already")
        await self.store.append(OPEN_RUNS_KEY, [response_id.encode()], ttl_s=self.ttl_s)
        return record

    async def open_runs(self) -> list[str]:
        return [value.decode() for value in await self.store.range(OPEN_RUNS_KEY)]

    async def forget(self, response_id: str) -> None:
        """Off the list of open runs (closed, or gone with its TTL)."""
        await self.store.remove(OPEN_RUNS_KEY, response_id.encode())

    async def get(self, response_id: str) -> RunRecord | None:
        data = await self.store.get(run_key(response_id))
        return None if data is None else RunRecord.decode(data)

    async def update(self, response_id: str, change: Callable[[RunRecord], RunRecord | None]) -> RunRecord | None:
        """Read, change, compare-and-set until it sticks. `change` returns None to leave the
        record as it is. Returns the record as it now is (None: there is none)."""
        key = run_key(response_id)
        for _ in range(_CAS_ATTEMPTS):
            data = await self.store.get(key)
            if data is None:
                return None
            record = RunRecord.decode(data)
            new = change(record)
            if new is None or new == record:
                return record
            if await self.store.compare_and_set(key, data, new.encode(), ttl_s=self.ttl_s):
                return new
        raise RuntimeError(f"background run {response_id}: too many concurrent updates")

    async def renew(self, response_id: str, owner: str) -> RunRecord | None:
        """Extend `owner`'s lease; the record tells the owner whether to cancel, or that the
        run is no longer its own (closed by someone else)."""
        until = self.clock() + self.lease_s
        return await self.update(response_id, lambda r: replace(r, lease_until=until) if r.owner == owner and not r.closed else None)

    async def request_cancel(self, response_id: str) -> RunRecord | None:
        return await self.update(response_id, lambda r: None if r.closed else replace(r, cancel=True))

    async def close(self, response_id: str, length: int, status: str) -> RunRecord | None:
        """Mark the run over with `length` events; a no-op if someone closed it first."""
        record = await self.update(response_id, lambda r: None if r.closed else replace(r, closed=True, length=length, status=status))
        await self.forget(response_id)
        return record

    async def append(self, response_id: str, frames: list[bytes], at: int) -> bool:
        """Append events whose first sequence number is `at`; False if position `at` is
        not the end of the log (someone else wrote there)."""
        return await self.store.append(events_key(response_id), frames, ttl_s=self.ttl_s, expected_length=at) != -1

    async def events(self, response_id: str, start: int) -> list[bytes]:
        """The frames of the events with sequence numbers `start`, `start` + 1, …"""
        return await self.store.range(events_key(response_id), start)

    async def length(self, response_id: str) -> int:
        return await self.store.length(events_key(response_id))

    async def wait_events(self, response_id: str, beyond: int, timeout_s: float) -> int:
        """Wait (at most `timeout_s`) until the log holds more than `beyond` events: its length
        then (`beyond` or less when the time ran out). The store's notification, not reads."""
        return await self.store.wait_length(events_key(response_id), beyond, timeout_s)

    async def delete(self, response_id: str) -> None:
        """A run and all trace of it: record, event log, place among the open runs."""
        await self.store.delete(run_key(response_id))
        await self.store.delete(events_key(response_id))
        await self.forget(response_id)

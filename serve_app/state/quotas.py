"""A tenant's quotas, the same for every ingress replica: the counters live in the shared store.

- `requests_per_minute`, `tokens_per_minute`: token buckets (`Store.take`) holding a minute's
  worth, refilled continuously: a burst gets the limit at once, then the limit per minute,
  over any span (a fixed window would let twice the limit through across its boundary).
  Input tokens count when the prompt is rendered, output tokens as they are produced
  (`Admission.charge_tokens`): a stream already started is never cut for its tokens, they
  make a debt that the tenant's next requests wait out.
- `max_concurrent_requests` (open streams, in-flight requests, running background
  responses) and `max_background`: leases (`Store.lease`) that this replica renews while
  the request runs (`LeaseKeeper`) and releases at its end; a replica that dies stops
  renewing, and its leases expire within `LEASE_TTL_S`: nothing leaks.

Over a limit: `RateLimited`, a 429 naming the limit, with `Retry-After` and OpenAI's
`x-ratelimit-*` headers, which `Admission.headers` also gives every admitted request,
`TenantQuota.take_request` every request of a route that counts one and holds nothing
(conversation writes, `input_tokens`), and `TenantQuota.headers` every other request of the
tenant (reads, deletes, which count none).
Server-side tools (the tool loop) charge their tokens and calls on the same `Admission`.

Not the `limits` library: it has no token bucket and no charge after the fact (a cost over
the limit is refused, never counted), its moving window stores one entry per unit (two
million for a tokens-per-minute limit), it knows no leases, and each limit would be a round
trip of its own over a connection pool of its own. Two small primitives of the store do it,
atomically on every backend (tests/state/test_quota_primitives.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
import weakref
from dataclasses import dataclass, field

from serve_app.api.errors import APIError
from serve_app.state.store import Store, StoreUnavailable
from serve_app.state.tenancy import TenantStore

logger = logging.getLogger(__name__)

LEASE_TTL_S = 30.0  # a dead replica's leases are free again after this
RENEW_EVERY_S = LEASE_TTL_S / 3
MINUTE_S = 60.0

REQUESTS_KEY, TOKENS_KEY = "quota:requests", "quota:tokens"
CONCURRENT_KEY, BACKGROUND_KEY = "quota:concurrent", "quota:background"


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """A tenant's limits (None: none), as `TenantLimits` in the config gives them."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    max_background: int | None = None


def duration(seconds: float) -> str:
    """A duration as OpenAI's `x-ratelimit-reset-*` headers write it: `20ms`, `1s`, `6m0s`."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


class RateLimited(APIError):
    """A 429: `limit` (the config's name for it) is used up; `retry_after_s` until there is room."""

    def __init__(self, limit: str, message: str, retry_after_s: float, headers: dict[str, str], kind: str = "requests") -> None:
        super().__init__(message, status_code=429, code="rate_limit_exceeded", type=kind)
        self.limit = limit
        wait = max(retry_after_s, 0.001)
        self.headers = {**headers, "retry-after": str(math.ceil(wait)), "retry-after-ms": str(math.ceil(wait * 1000))}


class LeaseKeeper:
    """The leases this replica holds, renewed together every `RENEW_EVERY_S` until dropped."""

    def __init__(self, store: Store, ttl_s: float = LEASE_TTL_S) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._held: dict[tuple[str, str], None] = {}  # (store key, holder), in order

    def hold(self, key: str, holder: str) -> None:
        self._held[(key, holder)] = None

    def drop(self, key: str, holder: str) -> None:
        self._held.pop((key, holder), None)

    def drop_all(self, leases: list[tuple[str, str]]) -> None:
        for key, holder in leases:
            self.drop(key, holder)

    def __len__(self) -> int:
        return len(self._held)

    async def renew(self) -> None:
        if self._held:
            await self.store.renew(list(self._held), self.ttl_s)

    async def renew_forever(self, every_s: float = RENEW_EVERY_S) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.renew()
            except Exception:  # the store is down: the next round (a lease outlives two missed ones)
                logger.warning("quotas: renewing this replica's leases failed", exc_info=True)


@dataclass(eq=False)
class Admission:
    """One admitted request: its leases (released when it ends) and its rate-limit headers."""

    quota: TenantQuota
    holder: str
    leases: list[str]  # store keys (the tenant's) of the leases it holds
    headers: dict[str, str] = field(default_factory=dict)
    released: bool = False

    async def charge_tokens(self, tokens: int) -> None:
        """Count tokens used (input, output, a tool's); never refused: past the limit they are a debt."""
        await self.quota.charge(tokens_=tokens)

    async def charge_requests(self, requests: int = 1) -> None:
        """Count requests made on the tenant's behalf (a server-side tool call); never refused."""
        await self.quota.charge(requests=requests)

    async def lease_background(self) -> None:
        """Also hold a place among the tenant's background responses (`max_background`), for a
        request admitted before its body said it runs in the background; or `RateLimited` (the
        admission kept as it was: its holder releases it)."""
        limit = self.quota.limits.max_background
        if limit is not None and BACKGROUND_KEY not in self.leases:
            try:
                await self.quota.lease(self, BACKGROUND_KEY, limit, "max_background")
            except RateLimited as exc:  # with the headers of the buckets the admission took from
                exc.headers = self.headers | exc.headers
                raise

    async def release(self) -> None:
        """Give the leases back (idempotent): no longer renewed from now on, and given back in
        the store by a task of its own, which the caller's cancellation (a client that went
        away) does not stop; if the store does not answer, they expire."""
        if self.released:
            return
        self.released = True
        for key in self.leases:
            self.quota.keeper.drop(self.quota.store.prefix + key, self.holder)
        if self.leases:
            task = asyncio.create_task(self._give_back())
            _GIVING_BACK.add(task)
            task.add_done_callback(_GIVING_BACK.discard)
            await asyncio.shield(task)

    async def _give_back(self) -> None:
        for key in self.leases:
            with contextlib.suppress(StoreUnavailable):
                await self.quota.store.release(key, self.holder)


_GIVING_BACK: set[asyncio.Task[None]] = set()  # releases in flight (the loop keeps only weak references to tasks)


class TenantQuota:
    """One tenant's limits over the shared store (its keys under the tenant's prefix)."""

    def __init__(self, store: Store, tenant: str, limits: QuotaLimits, keeper: LeaseKeeper) -> None:
        self.store = TenantStore(store, tenant)
        self.limits = limits
        self.keeper = keeper

    async def admit(self, *, background: bool = False, follower: bool = False) -> Admission:
        """Take a request's place within the limits, or raise `RateLimited` (nothing taken then).
        An HTTP request is admitted from its headers, before its body is read (`background`
        False; `Admission.lease_background` once the body says so); a WebSocket message as its
        response starts. A `follower` (a stream of a background response's events, a read that
        generates nothing) takes its place among the concurrent requests and nothing else."""
        limits = self.limits
        admission = Admission(self, uuid.uuid4().hex, [])
        try:
            if limits.max_concurrent_requests is not None:
                await self.lease(admission, CONCURRENT_KEY, limits.max_concurrent_requests, "max_concurrent_requests")
            if background and limits.max_background is not None:
                await self.lease(admission, BACKGROUND_KEY, limits.max_background, "max_background")
            if limits.tokens_per_minute is not None and not follower:  # any left: the request's own tokens are counted as they come
                admission.headers |= await self._take(TOKENS_KEY, limits.tokens_per_minute, "tokens", cost=0)
            if limits.requests_per_minute is not None and not follower:
                admission.headers |= await self._take(REQUESTS_KEY, limits.requests_per_minute, "requests", cost=1)
        except BaseException as exc:
            if isinstance(exc, RateLimited):  # its headers with those of the buckets already read
                exc.headers = admission.headers | exc.headers
            await admission.release()
            raise
        # An admission dropped without its release (a response whose stream never started)
        # stops being renewed when it is collected: its leases (those taken later too: the
        # list itself) then expire.
        weakref.finalize(admission, _stop_renewing, self.keeper, self.store.prefix, admission.holder, admission.leases)
        return admission

    async def take_request(self, *, tokens: bool = False) -> dict[str, str]:
        """One request of a route that writes or computes but holds no place (conversation
        writes, `input_tokens`): taken from `requests_per_minute` (none: nothing taken), or
        `RateLimited`; the `x-ratelimit-*` headers of its take (and of the tokens bucket as it is).
        `tokens`: the route's work is tokens (`input_tokens` renders a prompt, `charge`d after),
        so it also needs some left of `tokens_per_minute`, as a response does."""
        headers: dict[str, str] = {}
        if self.limits.tokens_per_minute is not None:
            if tokens:
                headers |= await self._take(TOKENS_KEY, self.limits.tokens_per_minute, "tokens", cost=0)
            else:
                headers |= await self._level(TOKENS_KEY, self.limits.tokens_per_minute, "tokens")
        if self.limits.requests_per_minute is not None:
            try:
                headers |= await self._take(REQUESTS_KEY, self.limits.requests_per_minute, "requests", cost=1)
            except RateLimited as refused:
                refused.headers = headers | refused.headers
                raise
        return headers

    async def charge(self, *, tokens_: int = 0, requests: int = 0) -> None:
        """Count usage, never refused (a bucket may go below zero)."""
        for key, per_minute, amount in (
            (TOKENS_KEY, self.limits.tokens_per_minute, tokens_),
            (REQUESTS_KEY, self.limits.requests_per_minute, requests),
        ):
            if per_minute is not None and amount > 0:
                await self.store.take(key, capacity=per_minute, per_s=per_minute / MINUTE_S, cost=amount, need=-math.inf)

    async def headers(self) -> dict[str, str]:
        """The `x-ratelimit-*` headers of the tenant's buckets now, taking nothing (for the
        responses of requests that do not count: reads)."""
        headers: dict[str, str] = {}
        for key, per_minute, unit in (
            (REQUESTS_KEY, self.limits.requests_per_minute, "requests"),
            (TOKENS_KEY, self.limits.tokens_per_minute, "tokens"),
        ):
            if per_minute is not None:
                headers |= await self._level(key, per_minute, unit)
        return headers

    async def _level(self, key: str, per_minute: int, unit: str) -> dict[str, str]:
        """The `x-ratelimit-*` headers of a bucket as it is (nothing taken)."""
        _, level = await self.store.take(key, capacity=per_minute, per_s=per_minute / MINUTE_S, cost=0, need=-math.inf)
        return _rate_headers(per_minute, level, unit)

    async def lease(self, admission: Admission, key: str, limit: int, name: str) -> None:
        """One more lease for `admission` (`limit` of them for the tenant, `name` in the config), or `RateLimited`."""
        if await self.store.lease(key, admission.holder, limit=limit, ttl_s=self.keeper.ttl_s) < 0:
            what = "requests in progress" if name == "max_concurrent_requests" else "background responses queued or running"
            raise RateLimited(
                name,
                f"Rate limit reached: {limit} {what} ({name}). Retry when one of them has finished.",
                retry_after_s=1.0,
                headers={},
            )
        admission.leases.append(key)
        self.keeper.hold(self.store.prefix + key, admission.holder)

    async def _take(self, key: str, per_minute: int, unit: str, *, cost: int) -> dict[str, str]:
        """Take `cost` from a bucket that must hold at least one; its `x-ratelimit-*` headers."""
        per_s = per_minute / MINUTE_S
        granted, level = await self.store.take(key, capacity=per_minute, per_s=per_s, cost=cost, need=1)
        headers = _rate_headers(per_minute, level, unit)
        if not granted:
            name = f"{unit}_per_minute"
            raise RateLimited(
                name,
                f"Rate limit reached: {per_minute} {unit} per minute ({name}). Used up for now; retry in {duration((1 - level) / per_s)}.",
                retry_after_s=(1 - level) / per_s,
                headers=headers,
                kind=unit,
            )
        return headers


def _stop_renewing(keeper: LeaseKeeper, prefix: str, holder: str, leases: list[str]) -> None:
    keeper.drop_all([(prefix + key, holder) for key in leases])


def _rate_headers(per_minute: int, level: float, unit: str) -> dict[str, str]:
    """OpenAI's headers for a bucket of `per_minute` `unit`s holding `level` (below zero: a debt)."""
    return {
        f"x-ratelimit-limit-{unit}": str(per_minute),
        f"x-ratelimit-remaining-{unit}": str(max(0, math.floor(level))),
        f"x-ratelimit-reset-{unit}": duration((per_minute - level) / (per_minute / MINUTE_S)),
    }

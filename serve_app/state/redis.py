"""`RedisStore`: the store in Redis (or Valkey), for production.

Survives Serve restarts and redeploys, and several Serve applications can share one server
(each under its own key prefix). Only commands Valkey has too: GET/SET PX/DEL/PEXPIRE,
RPUSH/LRANGE/LLEN/LREM, TYPE, HMGET/HSET and ZADD/ZREM/ZCARD/ZSCORE/ZREMRANGEBYSCORE
(quotas), and EVAL for the read-modify-write primitives, so each is atomic on the server. Every key gets a TTL when written.

Notification (`wait_length`) is Redis pub/sub, which needs no server configuration (keyspace
notifications would): `append` publishes the list's new length on a channel named as the
key, and each `RedisStore` holds one subscriber connection, subscribed to the keys its
waiters wait on (one subscription per key, however many wait on it). A message lost while
that connection is down costs a waiter its timeout; it then reads the length.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from serve_app.state.store import StoreUnavailable

logger = logging.getLogger(__name__)

# compare_and_set: ARGV = has_expected, expected, has_value, value, ttl_ms
_COMPARE_AND_SET = """
local kind = redis.call('TYPE', KEYS[1]).ok
local current = false
if kind == 'string' then current = redis.call('GET', KEYS[1]) elseif kind ~= 'none' then return 0 end
if ARGV[1] == '1' then
  if current ~= ARGV[2] then return 0 end
elseif current then
  return 0
end
if ARGV[3] == '1' then redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5]) else redis.call('DEL', KEYS[1]) end
return 1
"""

# append: ARGV = ttl_ms, expected_length ('' for none), values...
_APPEND = """
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'list' and kind ~= 'none' then redis.call('DEL', KEYS[1]) end
local length = redis.call('LLEN', KEYS[1])
if ARGV[2] ~= '' and length ~= tonumber(ARGV[2]) then return -1 end
for i = 3, #ARGV do length = redis.call('RPUSH', KEYS[1], ARGV[i]) end
if length > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
if #ARGV > 2 then redis.call('PUBLISH', KEYS[1], length) end
return length
"""

# Quotas run on the server's clock (TIME), so replicas on skewed nodes agree. Redis replicates
# a script's effects, not the script, so TIME in a writing script is allowed (Redis >= 5, Valkey).
_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) + tonumber(t[2]) / 1000000"

# take: ARGV = capacity, per_s, cost, need
_TAKE = (
    _NOW
    + """
local capacity, per_s, cost, need = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local level = capacity
local state = redis.call('HMGET', KEYS[1], 'level', 'at')
if state[1] then level = math.min(capacity, tonumber(state[1]) + (now - tonumber(state[2])) * per_s) end
if level < need then return {0, tostring(level)} end
level = level - cost
redis.call('HSET', KEYS[1], 'level', tostring(level), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(((capacity - level) / per_s + 1) * 1000))
return {1, tostring(level)}
"""
)

# lease: ARGV = holder, limit, ttl_s (a sorted set: holder -> expiry); -1 when full
_LEASE = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return -1 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) * 1000))
return redis.call('ZCARD', KEYS[1])
"""
)

# renew: ARGV = ttl_s, holder for each key
_RENEW = (
    _NOW
    + """
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + tonumber(ARGV[1]), ARGV[i + 1])
  redis.call('PEXPIRE', key, math.ceil(tonumber(ARGV[1]) * 1000))
end
return 0
"""
)

# What a Redis error means for the client: every one is a 503 (the store cannot do it now).
_REFUSALS: list[tuple[type[Exception], str]] = [
    (redis_errors.OutOfMemoryError, "is out of memory (maxmemory)"),
    (redis_errors.NoPermissionError, "refused: its user lacks a permission (ACL)"),
    (redis_errors.AuthenticationError, "refused the credentials"),
    (redis_errors.ReadOnlyError, "is a read-only replica"),
    (redis_errors.BusyLoadingError, "is loading its data"),
    (redis_errors.TimeoutError, "did not answer in time"),
    (redis_errors.ConnectionError, "is unreachable"),
    (OSError, "is unreachable"),
    (redis_errors.RedisError, "failed"),
]


# A refusal inside a script (EVAL) comes back as a plain error that quotes it.
_QUOTED = {"-OOM ": redis_errors.OutOfMemoryError, "-NOPERM ": redis_errors.NoPermissionError, "-READONLY ": redis_errors.ReadOnlyError}


def _what(exc: Exception) -> str:
    """What a Redis error says of the store, for the client."""
    kind: type[Exception] = next((quoted for text, quoted in _QUOTED.items() if text in str(exc)), type(exc))
    return next(what for refused, what in _REFUSALS if issubclass(kind, refused))


def _wrong_type(exc: redis_errors.ResponseError) -> bool:
    """A command on a key holding the other kind (a value where a list is read): not a failure."""
    return str(exc).startswith("WRONGTYPE")


def _ms(ttl_s: float) -> int:
    return max(1, int(ttl_s * 1000))


P = ParamSpec("P")
R = TypeVar("R")


def _unavailable_when_down(
    method: Callable[Concatenate[RedisStore, P], Awaitable[R]],
) -> Callable[Concatenate[RedisStore, P], Coroutine[Any, Any, R]]:
    @functools.wraps(method)
    async def call(self: RedisStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(self, *args, **kwargs)
        except (redis_errors.RedisError, OSError) as exc:
            what = _what(exc)
            logger.warning("the response store (Redis) %s: %s", what, exc)
            raise StoreUnavailable(f"The response store (Redis) {what}; retry later.") from exc

    return call


class RedisStore:
    def __init__(self, url: str, *, password: str | None = None, key_prefix: str = "responses-serve:", timeout_s: float = 2.0) -> None:
        self.prefix = key_prefix
        # Fail fast: a request must not wait on reconnect back-offs; the caller retries.
        self.client = aioredis.Redis.from_url(
            url,
            password=password,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
            retry=None,
            health_check_interval=30,
        )
        self._compare_and_set = self.client.register_script(_COMPARE_AND_SET)
        self._append = self.client.register_script(_APPEND)
        self._take = self.client.register_script(_TAKE)
        self._lease = self.client.register_script(_LEASE)
        self._renew = self.client.register_script(_RENEW)
        self._subscriber = _Subscriber(self.client)

    def _key(self, key: str) -> str:
        return self.prefix + key

    @_unavailable_when_down
    async def get(self, key: str) -> bytes | None:
        try:
            return cast(bytes | None, await self.client.get(self._key(key)))
        except redis_errors.ResponseError as exc:
            if not _wrong_type(exc):  # a list lives there; anything else is a failure
                raise
            return None

    @_unavailable_when_down
    async def put(self, key: str, value: bytes, *, ttl_s: float) -> None:
        await self.client.set(self._key(key), value, px=_ms(ttl_s))

    @_unavailable_when_down
    async def compare_and_set(self, key: str, expected: bytes | None, value: bytes | None, *, ttl_s: float) -> bool:
        args = ["0" if expected is None else "1", expected or b"", "0" if value is None else "1", value or b"", _ms(ttl_s)]
        return bool(await self._compare_and_set(keys=[self._key(key)], args=args))

    @_unavailable_when_down
    async def delete(self, key: str) -> bool:
        return bool(await self.client.delete(self._key(key)))

    @_unavailable_when_down
    async def expire(self, keys: Sequence[str], ttl_s: float) -> int:
        if not keys:
            return 0
        async with self.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.pexpire(self._key(key), _ms(ttl_s))
            return sum(map(bool, await pipe.execute()))

    @_unavailable_when_down
    async def append(self, key: str, values: Sequence[bytes], *, ttl_s: float, expected_length: int | None = None) -> int:
        args = [_ms(ttl_s), "" if expected_length is None else expected_length, *values]
        return int(await self._append(keys=[self._key(key)], args=args))

    @_unavailable_when_down
    async def range(self, key: str, start: int = 0, stop: int | None = None) -> list[bytes]:
        if stop is not None and stop <= start:
            return []
        try:
            return cast(list[bytes], await self.client.lrange(self._key(key), start, -1 if stop is None else stop - 1))
        except redis_errors.ResponseError as exc:
            if not _wrong_type(exc):
                raise
            return []

    @_unavailable_when_down
    async def length(self, key: str) -> int:
        try:
            return await self.client.llen(self._key(key))
        except redis_errors.ResponseError as exc:
            if not _wrong_type(exc):
                raise
            return 0

    @_unavailable_when_down
    async def remove(self, key: str, value: bytes) -> bool:
        try:
            return bool(await self.client.lrem(self._key(key), 1, value))  # type: ignore[arg-type]  # bytes are values too
        except redis_errors.ResponseError as exc:
            if not _wrong_type(exc):
                raise
            return False

    @_unavailable_when_down
    async def take(self, key: str, *, capacity: float, per_s: float, cost: float, need: float) -> tuple[bool, float]:
        granted, level = await self._take(keys=[self._key(key)], args=[repr(capacity), repr(per_s), repr(cost), repr(need)])
        return bool(granted), float(level)

    @_unavailable_when_down
    async def lease(self, key: str, holder: str, *, limit: int, ttl_s: float) -> int:
        return int(await self._lease(keys=[self._key(key)], args=[holder, limit, repr(ttl_s)]))

    @_unavailable_when_down
    async def renew(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> None:
        if leases:  # one script: the keys of one server (no Redis Cluster)
            await self._renew(keys=[self._key(key) for key, _ in leases], args=[repr(ttl_s), *(holder for _, holder in leases)])

    @_unavailable_when_down
    async def release(self, key: str, holder: str) -> None:
        await self.client.zrem(self._key(key), holder)

    async def wait_length(self, key: str, beyond: int, timeout_s: float) -> int:
        channel = self._key(key).encode()
        async with self._subscriber.waiting(channel) as published:
            length = await self.length(key)  # after subscribing: no append falls between the two
            if length > beyond or timeout_s <= 0:
                return length
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    while (length := await published.get()) <= beyond:
                        pass
                    return length
        return await self.length(key)

    async def close(self) -> None:
        await self._subscriber.close()
        await self.client.aclose()


class _Subscriber:
    """One pub/sub connection for a `RedisStore`'s waiters: a key is subscribed while anyone
    waits on it, and every message (a list's new length) goes to each of its waiters' queues.
    The connection's failures are logged and retried by its reader; waiters meanwhile time out."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self._pubsub: Any = None  # redis.asyncio.client.PubSub, made on the first wait
        self._reader: asyncio.Task[None] | None = None
        self._waiters: dict[bytes, set[asyncio.Queue[int]]] = {}
        self._commands = asyncio.Lock()  # one (un)subscribe at a time on the connection: concurrent writes broke it

    @contextlib.asynccontextmanager
    async def waiting(self, channel: bytes) -> AsyncIterator[asyncio.Queue[int]]:
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=64)
        waiters = self._waiters.setdefault(channel, set())
        first = not waiters
        waiters.add(queue)
        try:
            if first:
                await self._subscribe(channel)
            yield queue
        finally:
            waiters.discard(queue)
            if not waiters and self._waiters.get(channel) is waiters:
                del self._waiters[channel]
                await self._unsubscribe(channel)

    async def _subscribe(self, channel: bytes) -> None:
        """Subscribed when this returns, or logged: its waiters then wait out their timeout."""
        try:
            if self._pubsub is None:
                self._pubsub = self._client.pubsub()
            async with self._commands:
                await self._pubsub.subscribe(channel)
            if self._reader is None or self._reader.done():
                self._reader = asyncio.create_task(self._read(), name="redis store notifications")
        except (redis_errors.RedisError, OSError) as exc:
            logger.warning("the response store (Redis): no notifications for now (%s); waiters fall back to reads", exc)

    async def _unsubscribe(self, channel: bytes) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(redis_errors.RedisError, OSError):
                async with self._commands:
                    await self._pubsub.unsubscribe(channel)

    async def _read(self) -> None:
        while True:
            try:
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except (redis_errors.RedisError, OSError) as exc:  # reconnected (and resubscribed) by the next read
                logger.warning("the response store (Redis): notifications interrupted (%s); retrying", exc)
                await asyncio.sleep(1.0)
                continue
            if message is None or message.get("type") != "message":
                continue
            for queue in self._waiters.get(message["channel"], ()):
                with contextlib.suppress(asyncio.QueueFull):  # a waiter that far behind reads the length itself
                    queue.put_nowait(int(message["data"]))

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._pubsub is not None:
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await self._pubsub.aclose()


async def server_version(url: str, password: str | None = None, timeout_s: float = 2.0) -> str:
    """The server's version, after a round trip to it (`responses-serve doctor`)."""
    client = aioredis.Redis.from_url(url, password=password, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=None)
    try:
        info = await client.info("server")
        return str(info.get("valkey_version") or info.get("redis_version") or "unknown version")
    finally:
        await client.aclose()

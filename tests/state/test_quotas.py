"""A tenant's quotas over every store backend (serve_app/state/quotas.py): what is admitted,
refused (429 naming the limit, with the headers the SDK reads), counted and released."""

from __future__ import annotations

import asyncio
import gc

import pytest

from serve_app.state.quotas import LeaseKeeper, QuotaLimits, RateLimited, TenantQuota, duration

pytestmark = pytest.mark.anyio


def _quota(store, tenant="team-a", **limits) -> TenantQuota:
    return TenantQuota(store, tenant, QuotaLimits(**limits), LeaseKeeper(store))


async def test_requests_per_minute_admits_a_burst_of_the_limit_then_refuses_with_headers(store):
    quota = _quota(store, requests_per_minute=3)
    admitted = [await quota.admit() for _ in range(3)]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in admitted] == ["2", "1", "0"]
    assert admitted[0].headers["x-ratelimit-limit-requests"] == "3"
    with pytest.raises(RateLimited) as refused:
        await quota.admit()
    error = refused.value
    assert (error.status_code, error.code, error.limit) == (429, "rate_limit_exceeded", "requests_per_minute")
    assert "3 requests per minute (requests_per_minute)" in error.message
    assert 15 <= int(error.headers["retry-after"]) <= 20  # one request refills in 20 s
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert error.headers["x-ratelimit-limit-requests"] == "3"
    assert await _quota(store, tenant="team-b", requests_per_minute=3).admit()  # tenants are apart


async def test_tokens_are_counted_as_used_and_a_debt_refuses_until_it_refills(store):
    quota = _quota(store, tokens_per_minute=600)  # 10 a second
    admission = await quota.admit()
    assert admission.headers["x-ratelimit-remaining-tokens"] == "600"
    await admission.charge_tokens(550)
    await admission.charge_tokens(100)  # produced anyway: never refused, a debt of ~50
    with pytest.raises(RateLimited) as refused:
        await quota.admit()
    assert refused.value.limit == "tokens_per_minute"
    assert refused.value.type == "tokens"
    assert 5 <= int(refused.value.headers["retry-after"]) <= 6  # 51 tokens at 10 a second


async def test_concurrent_requests_hold_leases_until_released(store):
    quota = _quota(store, max_concurrent_requests=2, max_background=1)
    first, second = await quota.admit(), await quota.admit(background=True)
    with pytest.raises(RateLimited) as refused:
        await quota.admit()
    assert refused.value.limit == "max_concurrent_requests"
    assert refused.value.headers["retry-after"] == "1"
    await first.release()
    await first.release()  # idempotent: frees one place only
    with pytest.raises(RateLimited) as refused:
        await quota.admit(background=True)
    assert refused.value.limit == "max_background"
    third = await quota.admit()  # the place first gave back; the failed background attempt took none
    await asyncio.gather(second.release(), third.release())
    assert len(quota.keeper) == 0


@pytest.mark.slow
async def test_a_dead_replicas_leases_expire_and_a_live_ones_are_renewed(store):
    live, dead = LeaseKeeper(store, ttl_s=0.4), LeaseKeeper(store, ttl_s=0.4)
    on_live = TenantQuota(store, "team-a", QuotaLimits(max_concurrent_requests=2), live)
    on_dead = TenantQuota(store, "team-a", QuotaLimits(max_concurrent_requests=2), dead)
    held = await on_live.admit()
    await on_dead.admit()  # its replica dies: nobody renews or releases it
    with pytest.raises(RateLimited):
        await on_live.admit()
    for _ in range(4):  # 0.6 s: the dead lease has expired, the live one was renewed
        await asyncio.sleep(0.15)
        await live.renew()
    second = await on_live.admit()
    with pytest.raises(RateLimited):
        await on_live.admit()
    await asyncio.gather(held.release(), second.release())


@pytest.mark.slow
async def test_an_admission_dropped_unreleased_is_no_longer_renewed(store):
    quota = _quota(store, max_concurrent_requests=1)
    await quota.admit()  # dropped at once: a stream that never started
    gc.collect()
    assert len(quota.keeper) == 0


def test_reset_durations_are_written_as_openai_writes_them():
    assert [duration(s) for s in (0.0203, 1, 59.2, 60, 360, 3725)] == ["21ms", "1s", "1m0s", "1m0s", "6m0s", "62m5s"]

"""bench.overload's judge of each answer: an admitted stream is whole (its text, its tokens),
a refusal counts only as a 429/503 with Retry-After."""

from __future__ import annotations

import asyncio

import aiohttp

from bench.overload import one_request
from serve_app.engines.replay import ReplayBackend
from serve_app.server.app import ServedModel, create_app
from tests.server.test_failures import _RefusingBackend
from tests.support.servers import uvicorn_server


async def _answer(url: str):
    async with aiohttp.ClientSession() as session:
        return await one_request(session, url)


def test_an_admitted_stream_and_a_refusal_are_told_apart():
    app = create_app([ServedModel("gpt-oss-replay", ReplayBackend())])
    with uvicorn_server(app) as url:
        admitted = asyncio.run(_answer(url))
    assert (admitted.kind, admitted.lost, admitted.cut) == ("admitted", False, False)
    assert admitted.tpot_s is not None
    busy = create_app([ServedModel("gpt-oss-replay", _RefusingBackend(client_error=False))])
    with uvicorn_server(busy) as url:
        refused = asyncio.run(_answer(url))
    assert (refused.kind, refused.status) == ("refused", 503)


def test_the_hostile_summary_reports_the_honest_tenants_ratios_and_the_loops_pause():
    """Shape only: the figures the hostile mix reports, from outcomes made up here."""
    from collections import Counter

    from bench.overload import Outcome, Phase, hostile_summary

    def phase(ttft_s: float, tpot_s: float, lost: bool = False) -> Phase:
        return Phase([Outcome("admitted", 200, ttft_s=ttft_s, tpot_s=tpot_s, lost=lost) for _ in range(4)])

    lag = {"unloaded": {"longest_pause_ms": 3.0, "pauses_over_50ms": 0}, "attacked": {"longest_pause_ms": 30.0, "pauses_over_50ms": 1}}
    result = hostile_summary(phase(0.1, 0.02), phase(0.2, 0.03, lost=True), Counter({"slow body 429": 5}), lag)
    assert (result["lost"], result["cut"], result["honest_refused"]) == (4, 0, 0)
    assert round(result["ttft_p99_ratio"], 6) == 2.0
    assert round(result["tpot_ratio"], 6) == 1.5
    assert result["loop_pause_max_ms"] == {"unloaded": 3.0, "attacked": 30.0}
    assert result["attacker_answers"] == {"slow body 429": 5}


def test_the_hostile_config_gives_the_attacker_limits_and_no_key_in_clear():
    from bench.overload import ATTACKER_KEY, HONEST_KEY, hostile_config
    from serve_app.config import AppConfig

    args = hostile_config(8000, 8, 2, 20.0)["applications"][0]["args"]
    config = AppConfig.model_validate(args)
    assert config.auth is not None
    assert config.auth.tenant_limits("attacker").max_concurrent_requests == 4
    assert HONEST_KEY not in str(args)
    assert ATTACKER_KEY not in str(args)

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

"""One tenant against the others over WebSocket, on one replica: idle connections cost the
client nothing (no bytes, no requests, no quota), so a tenant that opened `max_websockets` of
them refused every other tenant's handshake for as long as it held them. A tenant holds at
most `max_websockets_per_tenant`; the others still connect."""

from __future__ import annotations

import contextlib
import json

import pytest
from websockets.exceptions import InvalidStatus

from serve_app.config import AuthConfig, ReplicaLimits
from serve_app.engines.replay import ReplayBackend
from serve_app.server.app import ServedModel, ServerSettings, create_app
from tests.support import socket_scenarios
from tests.support.servers import uvicorn_server

KEY_A, KEY_B = "sk-team-a-0123456789abcdefghij", "sk-team-b-abcdefghij0123456789"
AUTH = AuthConfig.model_validate({"keys": [{"tenant": "team-a", "key_env": "A"}, {"tenant": "team-b", "key_env": "B"}]})
LIMITS = ReplicaLimits(max_websockets=4, max_websockets_per_tenant=2)


def _key(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def url():
    app = create_app(
        [ServedModel("gpt-oss-replay", ReplayBackend())], ServerSettings(auth=AUTH, replica_limits=LIMITS), environ={"A": KEY_A, "B": KEY_B}
    )
    with uvicorn_server(app) as base:
        yield base


def test_a_tenant_cannot_hold_every_connection_of_a_replica(url):
    with contextlib.ExitStack() as held:
        for _ in range(LIMITS.max_websockets_per_tenant):  # B's idle connections
            held.enter_context(socket_scenarios.socket(url, _key(KEY_B)))
        with pytest.raises(InvalidStatus) as refused, socket_scenarios.socket(url, _key(KEY_B)):
            pass
        response = refused.value.response
        assert response.status_code == 429
        assert response.headers["retry-after"] == "1"
        error = json.loads(response.body)["error"]
        assert error["code"] == "too_many_connections"
        assert "replica_limits.max_websockets_per_tenant" in error["message"]
        with socket_scenarios.socket(url, _key(KEY_A)) as connection:  # A still gets in, and is served
            socket_scenarios.create(connection, model="gpt-oss-replay", input="hello")
            assert socket_scenarios.until_end(connection)[-1]["type"] == "response.completed"
    with socket_scenarios.socket(url, _key(KEY_B)):  # B's closed ones gave their places back
        pass


def test_the_replicas_own_bound_still_holds_over_every_tenant(url):
    with contextlib.ExitStack() as held:
        for key in (KEY_A, KEY_A, KEY_B, KEY_B):
            held.enter_context(socket_scenarios.socket(url, _key(key)))
        with pytest.raises(InvalidStatus) as refused, socket_scenarios.socket(url, _key(KEY_A)):
            pass
        assert refused.value.response.status_code == 503


def test_a_hundred_concurrent_handshakes_get_exactly_the_caps(url, monkeypatch):
    """The count is taken before the handshake's first await: 100 handshakes of one tenant at
    once get its 2 places and no more, even when accepting takes a while (a slow client, a
    busy loop: here, accept sleeps first); counted after accept, all 100 got in."""
    import asyncio

    from starlette.websockets import WebSocket
    from websockets.asyncio.client import connect

    accept = WebSocket.accept

    async def slow_accept(self, *args, **kwargs):
        await asyncio.sleep(0.2)
        return await accept(self, *args, **kwargs)

    monkeypatch.setattr(WebSocket, "accept", slow_accept)

    async def attempt(gate: asyncio.Event, statuses: list[int]) -> None:
        try:
            async with connect(socket_scenarios.socket_url(url), additional_headers=_key(KEY_B), open_timeout=30):
                statuses.append(101)
                await gate.wait()  # held open until every handshake has been answered
        except InvalidStatus as refused:
            statuses.append(refused.response.status_code)

    async def storm() -> list[int]:
        gate, statuses = asyncio.Event(), []
        tasks = [asyncio.create_task(attempt(gate, statuses)) for _ in range(100)]
        while len(statuses) < len(tasks):
            await asyncio.sleep(0.01)
        gate.set()
        await asyncio.gather(*tasks)
        return statuses

    statuses = asyncio.run(storm())
    assert statuses.count(101) == LIMITS.max_websockets_per_tenant
    assert statuses.count(429) == 100 - LIMITS.max_websockets_per_tenant

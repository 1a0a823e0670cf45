"""Tenant B fills the store through the Conversations API within its rate limit, in one
process with a small embedded-style store: tenant A's response and conversation were evicted
(404), and B's own rate limit started again from full. Now B's oldest keys go, A's stay, and
B's limit holds."""

from __future__ import annotations

import asyncio

import httpx

from serve_app.config import AuthConfig
from serve_app.engines.replay import ReplayBackend
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.state import MemoryStore

KEY_A, KEY_B = "sk-team-a-0123456789abcdefghij", "sk-team-b-abcdefghij0123456789"
AUTH = AuthConfig.model_validate(
    {"keys": [{"tenant": "a", "key_env": "A"}, {"tenant": "b", "key_env": "B", "limits": {"requests_per_minute": 22}}]}
)


def test_a_tenant_flooding_the_store_evicts_only_its_own():
    store = MemoryStore(max_bytes=4 << 20, clock=lambda: 1000.0)  # B's bucket does not refill
    app = create_app(
        [ServedModel("gpt-oss-replay", ReplayBackend())], ServerSettings(auth=AUTH), environ={"A": KEY_A, "B": KEY_B}, store=store
    )
    a, b = {"Authorization": f"Bearer {KEY_A}"}, {"Authorization": f"Bearer {KEY_B}"}

    async def attack() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=30) as http:
            kept = (await http.post("/v1/responses", json={"model": "gpt-oss-replay", "input": "A's plan"}, headers=a)).json()["id"]
            body = {"items": [{"type": "message", "role": "user", "content": "A's"}]}
            conversation = (await http.post("/v1/conversations", json=body, headers=a)).json()["id"]
            for _ in range(2):
                assert (await http.post("/v1/responses", json={"model": "gpt-oss-replay", "input": "x"}, headers=b)).status_code == 200
            flood = {"items": [{"type": "message", "role": "user", "content": "z" * 400_000}]}
            for _ in range(20):  # 8 MB into a 4 MB store: B's last 20 requests
                assert (await http.post("/v1/conversations", json=flood, headers=b)).status_code == 200
            assert (await http.get(f"/v1/responses/{kept}", headers=a)).status_code == 200
            assert (await http.get(f"/v1/conversations/{conversation}/items", headers=a)).json()["data"][0]["content"][0]["text"] == "A's"
            again = await http.post("/v1/responses", json={"model": "gpt-oss-replay", "input": "x"}, headers=b)
            assert again.status_code == 429  # B's counter was not evicted with its conversations

    asyncio.run(attack())
    assert store.stats()["bytes"] <= 4 << 20

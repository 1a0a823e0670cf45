"""Liveness and readiness apart: `/health` is 200 while the process serves, `/ready` only
when every model can take requests; `/v1/models` says each model's state. (The same on a
real engine that is still loading: tests/deployments/test_readiness_e2e.py.)"""

from __future__ import annotations

import httpx
import openai

from serve_app.config import AuthConfig
from serve_app.engines.replay import ReplayBackend
from serve_app.server.app import ServedModel, ServerSettings, Unavailable, create_app
from tests.support.servers import uvicorn_server


def test_ready_only_when_every_model_is_and_health_meanwhile():
    states: dict[str, Unavailable | None] = {
        "a": Unavailable("loading", "UPDATING"),
        "b": Unavailable("unavailable", "DEPLOY_FAILED"),
        "c": None,
    }

    async def unavailable(model: str) -> Unavailable | None:
        return states[model]

    backend = ReplayBackend()
    auth = AuthConfig(keys=[{"tenant": "t", "key_env": "KEY"}])
    app = create_app(
        [ServedModel(name, backend, unavailable=unavailable) for name in states],
        ServerSettings(auth=auth),
        environ={"KEY": "sk-test-0123456789"},
    )
    with uvicorn_server(app) as url, httpx.Client(timeout=30) as http:
        root = url.removesuffix("/v1")
        health, loading = http.get(f"{root}/health"), http.get(f"{root}/ready")
        listed = http.get(f"{url}/models", headers={"Authorization": "Bearer sk-test-0123456789"})
        one = http.get(f"{url}/models/a", headers={"Authorization": "Bearer sk-test-0123456789"})
        sdk = openai.OpenAI(base_url=url, api_key="sk-test-0123456789").models.list().data
        states.update(a=None, b=None)
        ready = http.get(f"{root}/ready")
        refused = http.get(f"{url}/models")
    assert health.status_code == 200  # alive while models load
    assert loading.status_code == 503
    assert loading.json() == {
        "status": "not_ready",
        "models": {
            "a": {"status": "loading", "reason": "UPDATING"},
            "b": {"status": "unavailable", "reason": "DEPLOY_FAILED"},
            "c": {"status": "ready"},
        },
    }
    assert [(m["id"], m["status"]) for m in listed.json()["data"]] == [("a", "loading"), ("b", "unavailable"), ("c", "ready")]
    assert one.json()["status"] == "loading"
    assert one.json()["reason"] == "UPDATING"
    assert one.json()["object"] == "model"
    assert [(m.id, m.model_extra["status"]) for m in sdk] == [
        ("a", "loading"),
        ("b", "unavailable"),
        ("c", "ready"),
    ]  # the SDK's Model keeps it
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"
    assert refused.status_code == 401  # readiness is open (as liveness); the API is not


def test_models_without_an_availability_source_are_ready():
    app = create_app([ServedModel("m", ReplayBackend())])
    with uvicorn_server(app) as url, httpx.Client(timeout=30) as http:
        answer = http.get(url.removesuffix("/v1") + "/ready")
    assert answer.status_code == 200
    assert answer.json() == {"status": "ready", "models": {"m": {"status": "ready"}}}

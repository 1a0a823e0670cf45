"""`service_tier` -> the engine's request priority, and the tier each response reports.

In-process here (a token source that records what the engine was asked); vLLM ordering its
waiting requests by these priorities is shown on the real engine in
tests/engines/test_vllm_backend.py, and the tier's way through Serve's two ingress replicas to a real
engine in tests/deployments/test_vllm_e2e.py.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from serve_app.api.service_tier import engine_priority, served_tier
from serve_app.server.app import ServedModel, create_app
from tests.core.test_encrypted_reasoning import Recording
from tests.deployments.test_metrics import Recorder
from tests.support.contract import check_stream, parse_sse


@pytest.fixture
def app(replay_backend):
    tiered, untiered = Recording(replay_backend), Recording(replay_backend)
    recorder = Recorder()
    models = [ServedModel("tiered", tiered, tiered=True), ServedModel("fcfs", untiered)]
    with TestClient(create_app(models, metrics=recorder)) as http:
        yield http, {"tiered": tiered, "fcfs": untiered}, recorder


@pytest.mark.parametrize(
    ("requested", "tier"),
    [(None, "default"), ("auto", "default"), ("default", "default"), ("scale", "default"), ("flex", "flex"), ("priority", "priority")],
)
def test_a_tiered_engine_serves_the_tier_asked_for(app, requested, tier):
    http, sources, recorder = app
    body = {"model": "tiered", "input": "hello", **({"service_tier": requested} if requested else {})}
    response = http.post("/v1/responses", json=body).json()
    assert response["service_tier"] == tier
    assert sources["tiered"].requests[response["id"]].priority == engine_priority(tier)
    assert recorder.outcomes[-1].service_tier == tier
    # Stored with it: a later GET (from any replica: the store is shared) says the same.
    assert http.get(f"/v1/responses/{response['id']}").json()["service_tier"] == tier


@pytest.mark.parametrize("requested", ["flex", "priority", "auto"])
def test_an_fcfs_engine_serves_every_tier_as_default(app, requested):
    http, sources, _ = app
    response = http.post("/v1/responses", json={"model": "fcfs", "input": "hello", "service_tier": requested}).json()
    assert response["service_tier"] == "default"
    assert sources["fcfs"].requests[response["id"]].priority == 0


def test_the_stream_reports_the_tier_from_its_first_event(app):
    http, sources, _ = app
    events = parse_sse(http.post("/v1/responses", json={"model": "tiered", "input": "hi", "stream": True, "service_tier": "flex"}).content)
    check_stream(events)
    snapshots = [event["response"] for event in events if "response" in event]
    assert [s["type"] for s in events if "response" in s] == ["response.created", "response.in_progress", "response.completed"]
    assert {s["service_tier"] for s in snapshots} == {"flex"}
    assert sources["tiered"].requests[snapshots[-1]["id"]].priority == engine_priority("flex")


def test_a_background_response_keeps_its_tier(app):
    http, sources, _ = app
    created = http.post("/v1/responses", json={"model": "tiered", "input": "later", "background": True, "service_tier": "flex"}).json()
    assert created["service_tier"] == "flex"
    events = parse_sse(http.get(f"/v1/responses/{created['id']}", params={"stream": "true"}).content)
    check_stream(events)
    assert events[-1]["response"]["service_tier"] == "flex"
    assert sources["tiered"].requests[created["id"]].priority == engine_priority("flex")


def test_priorities_order_the_tiers_around_vllms_default():
    assert engine_priority("priority") < engine_priority("default") == 0 < engine_priority("flex")
    assert served_tier("priority", tiered=False) == "default"

"""The stateful endpoints through a real Serve cluster: 2 ingress replicas behind Serve's
HTTP proxy sharing the embedded store deployment (tests/deployments/conftest.py `serve_url`). With a
store per replica about half of these follow-ups and GETs failed; every one must pass."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.support import stateful_scenarios
from tests.support.clients import HAVE_VERCEL_AI, vercel_ai
from tests.support.contract import parse_sse


def test_two_ingress_replicas_behind_the_proxy(serve_url):
    from ray import serve

    status = serve.status().applications["responses"]
    ingress = status.deployments["ResponsesIngress"]
    assert ingress.status == "HEALTHY"
    assert ingress.replica_states.get("RUNNING") == 2
    assert status.deployments["ResponseStore"].replica_states.get("RUNNING") == 1


@pytest.mark.parametrize("scenario", stateful_scenarios.SCENARIOS, ids=lambda f: f.__name__)
def test_stateful_scenario(serve_url, scenario):
    scenario(serve_url)


def test_a_turn_deleted_on_one_replica_breaks_the_chain_the_other_has_cached(ingress_urls):
    """Each ingress replica caches the finished turns it reads (`TurnCache`); a deletion made
    through the other replica must still break every chain through that turn."""
    first_replica, second_replica = ingress_urls
    with httpx.Client(timeout=60) as http:

        def create(url: str, **body) -> dict:
            reply = http.post(f"{url}/responses", json={"model": "gpt-oss-replay", **body})
            assert reply.status_code == 200, reply.text
            return reply.json()

        one = create(first_replica, input="cached turn one")
        two = create(first_replica, input="cached turn two", previous_response_id=one["id"])
        create(first_replica, input="reads the chain", previous_response_id=two["id"])  # both cached there now
        assert http.delete(f"{second_replica}/responses/{one['id']}").status_code == 200
        refused = http.post(f"{first_replica}/responses", json={"model": "gpt-oss-replay", "input": "x", "previous_response_id": two["id"]})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "previous_response_not_found"


def test_both_replicas_served_the_conversations(serve_url, tmp_path_factory):
    """The scenarios above really crossed replicas: each ingress replica's log names
    responses it created (so a per-replica store would have failed them). Replicas that
    earlier tests killed have logs too, so only this scenario's responses count."""
    ours = stateful_scenarios.conversations_from_any_replica(serve_url, n=10)
    logs = list(tmp_path_factory.getbasetemp().glob("**/logs/serve/replica_responses_ResponsesIngress_*.log"))
    created = [set(re.findall(r"response (resp_[0-9a-f]+): model=", log.read_text(errors="replace"))) for log in logs]
    served = [ids & ours for ids in created if ids & ours]
    assert len(served) == 2, [len(ids) for ids in served]
    assert set().union(*served) == ours


@pytest.fixture(scope="module")
def redis_serve_url(serve_url, redis_server):
    """A second app in the same cluster, 2 ingress replicas on the store Redis; the
    password reaches the replicas through the environment only."""
    from ray import serve

    from deployments.builder import build_app

    env = {"env_vars": {"REDIS_PASSWORD": redis_server.password}}
    args = {
        "models": [{"name": "gpt-oss-replay", "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}}],
        "ingress": {"num_replicas": 2, "max_ongoing_requests": 1024, "ray_actor_options": {"num_cpus": 0, "runtime_env": env}},
        "store": {"type": "redis", "url": redis_server.url, "key_prefix": "e2e-redis:"},
    }
    serve.run(build_app(args), name="responses-redis", route_prefix="/redis")
    try:
        yield serve_url.replace("/v1", "/redis/v1")
    finally:
        serve.delete("responses-redis")


@pytest.mark.parametrize(
    "scenario",
    [stateful_scenarios.conversations_from_any_replica, stateful_scenarios.delete_then_404, stateful_scenarios.input_items_paging],
    ids=lambda f: f.__name__,
)
def test_stateful_scenario_on_redis(redis_serve_url, scenario):
    scenario(redis_serve_url)


def test_redis_keys_have_the_prefix_and_a_ttl(redis_serve_url, redis_server):
    import redis

    from serve_app.server.auth import ANONYMOUS
    from serve_app.state.tenancy import tenant_prefix

    stateful_scenarios.two_turns(stateful_scenarios.OpenAI(base_url=redis_serve_url, api_key="unused"), "ttl")
    client = redis.Redis.from_url(redis_server.url, password=redis_server.password)
    # The open app's one tenant: its keys live under its prefix (serve_app/state/tenancy.py).
    keys = list(client.scan_iter(f"e2e-redis:{tenant_prefix(ANONYMOUS)}response:*"))
    assert len(keys) >= 2
    assert all(0 < client.pttl(key) <= 30 * 24 * 3600 * 1000 for key in keys)
    client.close()


def test_embedded_store_replica_killed_then_replaced(serve_url):
    """The store replica dies: stateful calls get 503 store_unavailable at once (no hang),
    stateless ones still work; Serve replaces it and everything works again — without what
    was stored before (the embedded store's limit; Redis keeps it)."""
    import time

    import openai
    import ray
    from ray import serve

    sdk = stateful_scenarios.OpenAI(base_url=serve_url, api_key="unused", max_retries=0, timeout=60)
    before = sdk.responses.create(model=stateful_scenarios.MODEL, input="before the store dies")
    store = serve.get_deployment_handle("ResponseStore", app_name="responses")
    actor_name = store.stats.remote().result(timeout_s=30)["actor_name"]
    ray.kill(ray.get_actor(actor_name, namespace="serve"), no_restart=True)

    with pytest.raises(openai.InternalServerError) as error:
        sdk.responses.retrieve(before.id)
    assert error.value.status_code == 503
    assert error.value.body["code"] == "store_unavailable"
    assert error.value.response.headers["retry-after"] == "1"
    assert sdk.responses.create(model=stateful_scenarios.MODEL, input="stateless", store=False).output_text == "stateless"
    # A stream that cannot be stored still ends with its terminal event (failed, saying why).
    with httpx.Client(timeout=60) as http:
        body = {"model": stateful_scenarios.MODEL, "input": "stream me", "stream": True}
        events = parse_sse(http.post(f"{serve_url}/responses", json=body).content)
    assert events[-1]["type"] == "response.failed"
    assert "could not be stored" in events[-1]["response"]["error"]["message"]

    deadline = time.monotonic() + 90
    while True:
        try:
            _, second = stateful_scenarios.two_turns(sdk, "after the store came back")
            break
        except openai.InternalServerError:
            assert time.monotonic() < deadline, "the store deployment was not replaced"
            time.sleep(1)
    assert sdk.responses.retrieve(second.id).output_text == second.output_text
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(before.id)


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
def test_an_item_reference_is_resolved_on_the_other_replica(ingress_urls, model):
    """A tool turn stored by one ingress replica; its reasoning and call named by reference in a
    request to the other: one read of the shared store finds them."""
    first_replica, second_replica = ingress_urls
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
    with httpx.Client(timeout=60) as http:
        first = http.post(f"{first_replica}/responses", json={"model": model, "input": "call lookup {}", "tools": [lookup]}).json()
        refs = [{"type": "item_reference", "id": item["id"]} for item in first["output"]]
        call = first["output"][-1]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "from the other replica"}
        second = http.post(f"{second_replica}/responses", json={"model": model, "input": [*refs, output], "tools": [lookup]})
        assert second.status_code == 200, second.text
        assert second.json()["output"][-1]["content"][0]["text"] == "Tool lookup returned: from the other replica"
        unknown = http.post(f"{second_replica}/responses", json={"model": model, "input": [{"id": call["id"] + "0"}]})
        assert unknown.status_code == 404


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
def test_a_compaction_made_on_one_replica_is_read_on_the_other(ingress_urls, model):
    """Compacted by one ingress replica (a chain it stored), sent back to the other: the
    replicas share the keys that seal it, and the summary carries the fact."""
    first_replica, second_replica = ingress_urls
    with httpx.Client(timeout=60) as http:
        first = http.post(f"{first_replica}/responses", json={"model": model, "input": "Remember: the ferry leaves at 7.\nhi"}).json()
        compact = http.post(f"{first_replica}/responses/compact", json={"model": model, "previous_response_id": first["id"]})
        assert compact.status_code == 200, compact.text
        window = compact.json()["output"]
        assert window[-1]["type"] == "compaction"
        recall = http.post(
            f"{second_replica}/responses",
            json={"model": model, "input": [*window, {"role": "user", "content": "What should you remember?"}]},
        )
        assert recall.status_code == 200, recall.text
        assert recall.json()["output"][-1]["content"][0]["text"] == "Remember: the ferry leaves at 7."


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
@pytest.mark.parametrize("scenario", ["generate-store", "stream-store", "stream-stateless"])
def test_the_vercel_ai_sdk_through_the_proxy(serve_url, model, scenario):
    """The real Vercel AI SDK's multi-step tool loop through Serve's proxy: each step may land
    on either ingress replica (tests/clients/vercel_ai.mjs)."""
    if not HAVE_VERCEL_AI:
        pytest.skip("the Vercel AI SDK is not installed (make install: tests/clients/package.json)")
    run = vercel_ai(serve_url, model, scenario, "sk-unused")
    assert run["ok"], run
    assert run["result"]["text"] == "Tool lookup returned: sunny in Paris"

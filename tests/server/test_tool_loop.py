"""The tool loop in one process (no Ray): real MCP servers on loopback, the replay models
calling them, every stream checked against the event contract and the SDK's accumulator."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import threading

import httpx
import pytest

from serve_app.config import ToolsConfig
from serve_app.engines.replay import ReplayBackend, ReplayConfig
from serve_app.runtime.metrics import NoMetrics
from serve_app.server.app import ServedModel, ServerSettings, create_app, server_tool_runtime
from serve_app.state import MemoryStore
from tests.support.contract import check_stream, parse_sse
from tests.support.mcp_servers import CONTROL_SPELLINGS, TOKEN, mcp_servers, mcp_tool
from tests.support.sdk_scenarios import client
from tests.support.servers import uvicorn_server, wait_until

CALL_ECHO = 'call lab.echo {"text": "hi"}'
LOOPBACK = ["http://127.0.0.1:*/*", "http://mcp.test:*/*"]


async def resolve_test_names(host: str, port: int) -> list:
    """`mcp.test` is the loopback test server under a name; `rebind.test` too (never named)."""
    if host in ("mcp.test", "rebind.test"):
        return [ipaddress.ip_address("127.0.0.1")]
    raise OSError(f"no such host {host}")


@pytest.fixture(scope="module")
def servers():
    with mcp_servers() as running:
        yield running


@pytest.fixture
def record(servers):
    servers.clear()
    return servers.record


def app_with(tools: dict, store: MemoryStore | None = None, step_delay_ms: float = 0.0, several_calls: bool = False):
    """The app with both replay models; `several_calls`: their scripts that make several
    calls in one response (tests/support/several_calls.py)."""
    from serve_app.config import ModelConfig
    from serve_app.engines import make_backend
    from serve_app.runtime.models import served_model
    from tests.conftest import QWEN3_REPLAY
    from tests.support.several_calls import harmony_calls_in_turn, qwen3_calls_at_once

    config = ToolsConfig.model_validate(tools)
    qwen3 = ModelConfig.model_validate(QWEN3_REPLAY)
    replay = ReplayConfig(step_delay_s=step_delay_ms / 1000)
    models = [
        ServedModel("gpt-oss-replay", ReplayBackend(replay, harmony_calls_in_turn) if several_calls else ReplayBackend(replay)),
        served_model(qwen3, ReplayBackend(script=qwen3_calls_at_once) if several_calls else make_backend(qwen3.backend)),
    ]
    runtime = server_tool_runtime(config, NoMetrics(), resolver=resolve_test_names)
    return create_app(models, store=store, server_tools=runtime)


@pytest.fixture(scope="module")
def store():
    return MemoryStore()


@pytest.fixture(scope="module")
def url(store):
    with uvicorn_server(app_with({"mcp": {"allowed_urls": LOOPBACK, "call_timeout_s": 2, "max_output_bytes": 4096}}, store)) as base:
        yield base


def post(url: str, body: dict, **extra) -> httpx.Response:
    with httpx.Client(timeout=60) as http:
        return http.post(f"{url}/responses", json={**body, **extra})


def stream(url: str, body: dict):
    response = post(url, body, stream=True)
    assert response.status_code == 200, response.text
    events = parse_sse(response.content)
    return check_stream(events), events


def stored_texts(store: MemoryStore) -> list[str]:
    """Every value the store holds (responses, event logs, conversations), as text."""
    values = [entry.value for entry in store._entries.values()]
    return [b.decode("utf-8", "replace") for value in values for b in (value if isinstance(value, list) else [value])]


def never(url: str, **options) -> dict:
    return mcp_tool(url, require_approval="never", **options)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
@pytest.mark.parametrize("transport", ["streamable", "sse"])
def test_a_call_runs_inside_the_response(url, servers, record, model, transport):
    body = {"model": model, "input": CALL_ECHO, "tools": [never(getattr(servers, transport))]}
    terminal, events = stream(url, body)
    kinds = [item.type for item in terminal.output]
    assert kinds == ["mcp_list_tools", "reasoning", "mcp_call", "reasoning", "message"]
    listing, _, call, _, answer = terminal.output
    assert {tool.name for tool in listing.tools} >= {"echo", "fail", "hang", "delete", "lookup"}
    assert (call.server_label, call.name, json.loads(call.arguments), call.output, call.status) == (
        "lab",
        "echo",
        {"text": "hi"},
        "hi",
        "completed",
    )
    assert answer.content[0].text == "Tool lab.echo returned: hi"
    assert record.calls == [("echo", {"text": "hi"})]
    # Completed only after the tool returned: the call's events, in the SDK's order.
    call_events = [e["type"] for e in events if e.get("item_id") == call.id or e.get("item", {}).get("id") == call.id]
    assert call_events[:2] == ["response.output_item.added", "response.mcp_call.in_progress"]
    assert call_events[-3:] == ["response.mcp_call_arguments.done", "response.mcp_call.completed", "response.output_item.done"]
    # One usage total over both generations; the second prompt found the first prompt and its
    # completion in the engine's prefix cache (all but the tool's message and a partial block).
    usage = terminal.usage
    assert usage.input_tokens_details.cached_tokens >= usage.input_tokens / 2 - 48
    # Streaming and not: the same items.
    record.clear()
    whole = post(url, body).json()
    assert [item["type"] for item in whole["output"]] == kinds
    assert whole["output"][2]["output"] == "hi"
    assert record.calls == [("echo", {"text": "hi"})]


def test_the_sdk_accumulates_the_stream(url, servers, record):
    sdk = client(url)
    with sdk.responses.stream(model="gpt-oss-replay", input=CALL_ECHO, tools=[never(servers.streamable)]) as events:
        seen = [event.type for event in events]
        final = events.get_final_response()
    assert "response.mcp_call.completed" in seen
    assert final.output_text == "Tool lab.echo returned: hi"
    assert final.tools[0].type == "mcp"
    assert final.tools[0].headers is None


def test_tools_are_listed_once_per_conversation(url, servers, record):
    body = {"model": "gpt-oss-replay", "tools": [never(servers.streamable)]}
    first = post(url, body, input=CALL_ECHO).json()
    assert record.methods.count("tools/list") == 1
    second = post(url, body, input='call lab.echo {"text": "again"}', previous_response_id=first["id"]).json()
    assert "mcp_list_tools" not in [item["type"] for item in second["output"]]
    assert record.methods.count("tools/list") == 1
    assert record.calls[-1] == ("echo", {"text": "again"})
    # Stateless: the listing sent back counts as well.
    history = [{"role": "user", "content": CALL_ECHO}, *first["output"], {"role": "user", "content": 'call lab.echo {"text": "3"}'}]
    third = post(url, body, input=history, store=False).json()
    assert third["output"][-1]["content"][0]["text"] == "Tool lab.echo returned: 3"
    assert record.methods.count("tools/list") == 1


def test_a_failing_tool_is_an_error_the_model_reads(url, servers, record):
    terminal, _ = stream(url, {"model": "gpt-oss-replay", "input": 'call lab.fail {"text": "x"}', "tools": [never(servers.streamable)]})
    call = terminal.output[2]
    assert call.status == "failed"
    assert call.output is None
    assert call.error.type == "mcp_tool_execution_error"
    assert terminal.status == "completed"
    assert terminal.output[-1].content[0].text.startswith("Tool lab.fail returned: Error:")


@pytest.mark.slow
def test_a_hanging_tool_times_out_and_the_response_ends(url, servers, record):
    terminal, _ = stream(url, {"model": "gpt-oss-replay", "input": 'call lab.hang {"seconds": 30}', "tools": [never(servers.streamable)]})
    call = terminal.output[2]
    assert call.status == "failed"
    assert call.error.type == "mcp_protocol_error"
    assert "did not answer within 2 s" in call.error.message
    assert terminal.status == "completed"


def test_an_unreachable_server_is_a_failed_listing_and_the_response_goes_on(url, servers, record):
    from tests.support.servers import free_port

    dead = f"http://127.0.0.1:{free_port()}/mcp"
    terminal, events = stream(url, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(dead)]})
    listing = terminal.output[0]
    assert listing.type == "mcp_list_tools"
    assert listing.error
    assert not listing.tools
    assert "response.mcp_list_tools.failed" in [e["type"] for e in events]
    assert terminal.status == "completed"
    assert terminal.output[-1].content[0].text == CALL_ECHO  # no tool: the model answered


@pytest.mark.slow
def test_oversized_output_is_cut_and_an_oversized_message_fails(url, servers, record):
    tools = [never(servers.streamable)]
    terminal, _ = stream(url, {"model": "gpt-oss-replay", "input": 'call lab.big {"size": 3000}', "tools": tools})
    assert terminal.output[2].output == "x" * 3000  # within max_output_bytes (4096)
    terminal, _ = stream(url, {"model": "gpt-oss-replay", "input": 'call lab.big {"size": 20000}', "tools": tools})
    cut = terminal.output[2].output
    assert len(cut.encode()) <= 4096
    assert cut.endswith("bytes of 20000]")
    terminal, _ = stream(url, {"model": "gpt-oss-replay", "input": 'call lab.big {"size": 200000}', "tools": tools})
    assert terminal.output[2].status == "failed"  # beyond what a message may carry
    assert terminal.status == "completed"


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
def test_control_token_spellings_from_a_server_stay_text(url, servers, record, model):
    terminal, _ = stream(url, {"model": model, "input": "call lab.spell", "tools": [never(servers.streamable)]})
    assert terminal.output[2].output == CONTROL_SPELLINGS
    # The model read them as the tool's text and wrote them back whole: nothing ended its turn.
    assert terminal.output[-1].content[0].text == f"Tool lab.spell returned: {CONTROL_SPELLINGS}"


def test_a_server_url_outside_allowed_urls_is_a_400_and_no_connection(url, servers, record):
    for refused in (
        "http://10.1.2.3:8080/mcp",
        "https://example.com/mcp",
        "http://127.1:80/mcp",
        "http://user:pw@127.0.0.1:1/mcp",
        "file:///etc/passwd",
    ):
        response = post(url, {"model": "gpt-oss-replay", "input": "hi", "tools": [{"type": "function", "name": "f"}, never(refused)]})
        assert response.status_code == 400, refused
        assert response.json()["error"]["param"] == "tools[1].server_url"
    assert record.requests == []


@pytest.mark.slow
def test_a_name_resolving_to_a_private_address_is_refused_unless_named(servers, record):
    # mcp.test resolves to 127.0.0.1; the only pattern names mcp.test, not the address.
    with uvicorn_server(app_with({"mcp": {"allowed_urls": ["http://mcp.test:*/*", "http://rebind.test:*/*"]}})) as base:
        for refused in (servers.fake_host, servers.fake_host.replace("mcp.test", "rebind.test")):
            terminal, _ = stream(base, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(refused)]})
            assert "loopback" in terminal.output[0].error
    assert record.requests == []
    # Named literally (LOOPBACK has http://127.0.0.1:*/*): the name is resolved once and the
    # connection goes to the address that was checked.
    with uvicorn_server(app_with({"mcp": {"allowed_urls": LOOPBACK}})) as base:
        terminal, _ = stream(base, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(servers.fake_host)]})
    assert terminal.output[2].output == "hi"
    assert record.requests[0][2]["host"].startswith("mcp.test:")


def test_a_redirect_off_the_origin_is_not_followed(url, servers, record):
    terminal, _ = stream(url, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(servers.redirect)]})
    assert terminal.output[0].error
    assert terminal.status == "completed"
    assert servers.redirect_record.requests
    assert record.requests == []  # the target never heard of it


@pytest.mark.slow
def test_a_redirect_within_the_origin_to_a_path_off_allowed_urls_is_not_followed(servers, record):
    moved = servers.moved_record
    with uvicorn_server(app_with({"mcp": {"allowed_urls": [servers.moved]}})) as base:  # that path only
        terminal, _ = stream(base, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(servers.moved)]})
    assert "redirected" in terminal.output[0].error
    assert "allowed_urls" in terminal.output[0].error
    assert terminal.status == "completed"
    assert moved.requests
    assert {path for _, path, _ in moved.requests} == {"/mcp"}
    # Where a pattern allows the new path, the same redirect is followed.
    moved.clear()
    with uvicorn_server(app_with({"mcp": {"allowed_urls": [servers.moved.removesuffix("mcp") + "*"]}})) as base:
        terminal, _ = stream(base, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(servers.moved)]})
    assert terminal.output[2].output == "hi"
    assert "/moved/mcp" in {path for _, path, _ in moved.requests}


def test_a_built_in_tools_configured_server_is_followed_on_its_own_origin(servers, record):
    """The operator's tool server (a built-in tool's `url`) is reached whatever its path: a
    redirect on its origin is followed, as the SDK follows one."""
    import asyncio

    from serve_app.tools.builtin.transport import McpTransport
    from serve_app.tools.mcp_client import McpLimits, result_text

    async def call() -> str:
        transport = McpTransport(servers.moved, McpLimits(call_timeout_s=10))
        try:
            return result_text((await transport.call("echo", {"text": "hi"}, {}, None)).result, 1000)
        finally:
            await transport.aclose()

    assert asyncio.run(call()) == "hi"
    assert "/moved/mcp" in {path for _, path, _ in servers.moved_record.requests}


@pytest.mark.slow
def test_headers_go_to_their_server_only_and_are_never_kept(url, servers, record, store, caplog):
    auth = servers.auth_record
    auth.clear()
    tool = never(servers.auth, headers={"X-Api-Key": "hdr-" + TOKEN}, authorization=TOKEN)
    with caplog.at_level(logging.DEBUG):
        body = {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [tool, never(servers.streamable, label="other")]}
        streamed = post(url, body, stream=True)
        done = post(url, body).json()
        background = post(url, body, background=True).json()
        sdk = client(url)
        final = sdk.responses.retrieve(background["id"])
        while final.status in ("queued", "in_progress"):
            final = sdk.responses.retrieve(background["id"])
        log = httpx.get(f"{url}/responses/{background['id']}?stream=true", timeout=30)
    assert done["output"][-1]["content"][0]["text"] == "Tool lab.echo returned: hi"
    assert all(
        headers.get("authorization") == f"Bearer {TOKEN}" and headers.get("x-api-key") == "hdr-" + TOKEN for _, _, headers in auth.requests
    )
    assert not any("authorization" in headers or "x-api-key" in headers for _, _, headers in record.requests)  # the other server
    kept = [
        streamed.text,
        json.dumps(done),
        httpx.get(f"{url}/responses/{done['id']}", timeout=30).text,
        httpx.get(f"{url}/responses/{done['id']}/input_items", timeout=30).text,
        log.text,
        final.model_dump_json(),
        caplog.text,
        *stored_texts(store),
    ]
    assert not [text for text in kept if TOKEN in text]
    # Without the token the server refuses; the listing says so.
    refused, _ = stream(url, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(servers.auth)]})
    assert "401" in refused.output[0].error


def test_a_key_in_the_server_url_is_never_logged(url, servers, caplog):
    """Some MCP services take their key in the URL: the logs name a server by its origin only,
    and an error naming the URL (httpx's HTTP 401) is cut to it too."""
    secret_url = servers.auth + f"?key={TOKEN}"  # (user info in a server_url is a 400)
    with caplog.at_level(logging.DEBUG):
        refused, _ = stream(url, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(secret_url)]})
    assert refused.output[0].type == "mcp_list_tools"
    assert refused.output[0].error
    assert "MCP" in caplog.text
    assert TOKEN not in caplog.text


@pytest.mark.slow
def test_approval_is_asked_by_default_and_the_server_sees_exactly_the_approved_calls(url, servers, record):
    tools = [mcp_tool(servers.streamable)]  # require_approval unset: OpenAI's default, always
    asked = post(url, {"model": "gpt-oss-replay", "input": 'call lab.delete {"id": "a"}', "tools": tools}).json()
    request = asked["output"][-1]
    assert request["type"] == "mcp_approval_request"
    assert request["name"] == "delete"
    assert json.loads(request["arguments"]) == {"id": "a"}
    assert asked["status"] == "completed"
    assert record.calls == []
    approve = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
    ran = post(url, {"model": "gpt-oss-replay", "input": [approve], "tools": tools, "previous_response_id": asked["id"]}).json()
    call = next(item for item in ran["output"] if item["type"] == "mcp_call")
    assert call["approval_request_id"] == request["id"]
    assert call["output"] == "deleted a"
    assert ran["output"][-1]["content"][0]["text"] == "Tool lab.delete returned: deleted a"
    assert record.calls == [("delete", {"id": "a"})]
    # The same approval again runs nothing.
    again = post(url, {"model": "gpt-oss-replay", "input": [approve], "tools": tools, "previous_response_id": ran["id"]}).json()
    assert "mcp_call" not in [item["type"] for item in again["output"]]
    assert record.calls == [("delete", {"id": "a"})]


def test_a_denied_call_is_never_sent_and_the_model_is_told(url, servers, record):
    tools = [mcp_tool(servers.streamable, require_approval="always")]
    asked = post(url, {"model": "gpt-oss-replay", "input": 'call lab.echo {"text": "no"}', "tools": tools}).json()
    deny = {"type": "mcp_approval_response", "approval_request_id": asked["output"][-1]["id"], "approve": False, "reason": "not now"}
    told = post(url, {"model": "gpt-oss-replay", "input": [deny], "tools": tools, "previous_response_id": asked["id"]}).json()
    assert record.calls == []
    assert "mcp_call" not in [item["type"] for item in told["output"]]
    assert told["output"][-1]["content"][0]["text"].startswith("Tool lab.echo returned: The user did not approve this call")


def test_stateless_approval_with_both_items_in_the_input(url, servers, record):
    tools = [mcp_tool(servers.streamable)]
    user = {"role": "user", "content": 'call lab.delete {"id": "s"}'}
    asked = post(url, {"model": "gpt-oss-replay", "input": [user], "tools": tools, "store": False}).json()
    request = asked["output"][-1]
    approve = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
    ran = post(url, {"model": "gpt-oss-replay", "input": [user, *asked["output"], approve], "tools": tools, "store": False}).json()
    assert record.calls == [("delete", {"id": "s"})]
    assert ran["output"][0]["approval_request_id"] == request["id"]
    # An approval of a request that is not in the conversation is a 400.
    forged = {"type": "mcp_approval_response", "approval_request_id": "mcpr_nope", "approve": True}
    assert post(url, {"model": "gpt-oss-replay", "input": [user, forged], "tools": tools}).status_code == 400


def test_approval_filters(url, servers, record):
    tools = [mcp_tool(servers.streamable, require_approval={"never": {"read_only": True}})]
    looked = post(url, {"model": "gpt-oss-replay", "input": 'call lab.lookup {"id": "1"}', "tools": tools}).json()
    assert looked["output"][2]["type"] == "mcp_call"
    assert record.calls == [("lookup", {"id": "1"})]
    asked = post(url, {"model": "gpt-oss-replay", "input": 'call lab.delete {"id": "1"}', "tools": tools}).json()
    assert asked["output"][-1]["type"] == "mcp_approval_request"
    assert len(record.calls) == 1


def test_allowed_tools_hide_the_others(url, servers, record):
    tools = [never(servers.streamable, allowed_tools=["echo"])]
    answer = post(url, {"model": "gpt-oss-replay", "input": 'call lab.delete {"id": "x"}', "tools": tools}).json()
    assert [item["type"] for item in answer["output"]] == ["mcp_list_tools", "reasoning", "message"]  # not offered: not called
    assert record.calls == []


def test_max_tool_calls_answers_further_calls_not_run(url, servers, record):
    answer = post(url, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(servers.streamable)], "max_tool_calls": 0}).json()
    call = answer["output"][2]
    assert call["status"] == "failed"
    assert "max_tool_calls" in json.dumps(call["error"])
    assert record.calls == []
    assert answer["max_tool_calls"] == 0
    assert answer["output"][-1]["content"][0]["text"].startswith("Tool lab.echo returned: Error: Not run")


def test_max_output_tokens_is_a_budget_over_all_rounds(url, servers, record):
    whole = post(url, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(servers.streamable)]}).json()
    budget = whole["usage"]["output_tokens"] - 3  # ends inside the second round's answer
    cut = post(
        url, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(servers.streamable)], "max_output_tokens": budget}
    ).json()
    assert cut["status"] == "incomplete"
    assert cut["usage"]["output_tokens"] == budget
    assert cut["output"][2]["type"] == "mcp_call"
    assert cut["output"][2]["status"] == "completed"


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
def test_tool_choice_forces_a_call_with_arguments_of_the_tools_schema(url, servers, record, model):
    choice = {"type": "mcp", "server_label": "lab", "name": "echo"}
    answer = post(url, {"model": model, "input": "hello", "tools": [never(servers.streamable)], "tool_choice": choice}).json()
    call = answer["output"][2]
    assert call["type"] == "mcp_call"
    assert call["name"] == "echo"
    assert set(json.loads(call["arguments"])) == {"text"}
    assert answer["output"][-1]["type"] == "message"
    assert len(record.calls) == 1  # forced once, not every round
    # Without a name: a call of one of the server's tools the request allows, with its arguments' schema.
    record.clear()
    only = never(servers.streamable, allowed_tools=["zone"])
    answer = post(url, {"model": model, "input": "hello", "tools": [only], "tool_choice": {"type": "mcp", "server_label": "lab"}}).json()
    call = answer["output"][2]
    assert call["type"] == "mcp_call"
    assert call["name"] == "zone"
    assert json.loads(call["arguments"])["zone"] in ("UTC", "CET")
    assert record.calls == [("zone", json.loads(call["arguments"]))]
    assert (
        post(
            url, {"model": "gpt-oss-replay", "input": "x", "tools": [never(servers.streamable)], "tool_choice": {**choice, "name": "nope"}}
        ).status_code
        == 400
    )


def test_a_function_call_ends_the_response_as_before(url, servers, record):
    tools = [{"type": "function", "name": "lookup_city", "parameters": {"type": "object", "properties": {}}}, never(servers.streamable)]
    answer = post(url, {"model": "gpt-oss-replay", "input": "call lookup_city", "tools": tools}).json()
    assert [item["type"] for item in answer["output"]] == ["mcp_list_tools", "reasoning", "function_call"]
    assert record.calls == []


def test_cancelling_the_stream_mid_call_cancels_the_tool_call(url, servers, record):
    body = {"model": "gpt-oss-replay", "input": 'call lab.hang {"seconds": 1.5}', "tools": [never(servers.streamable)], "stream": True}
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{url}/responses", json=body) as response:
        for line in response.iter_lines():
            if "response.mcp_call_arguments.done" in line:
                break  # the call is running: go away
    deadline = threading.Event()
    for _ in range(100):
        if record.cancelled:
            break
        deadline.wait(0.05)
    assert record.calls == [("hang", {"seconds": 1.5})]
    assert record.cancelled == ["hang"]


def test_background_cancel_mid_call(url, servers, record):
    sdk = client(url)
    started = sdk.responses.create(
        model="gpt-oss-replay", input='call lab.hang {"seconds": 1.5}', tools=[never(servers.streamable)], background=True
    )
    for _ in range(200):
        if record.calls:
            break
        threading.Event().wait(0.02)
    cancelled = sdk.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    call = next(item for item in cancelled.output if item.type == "mcp_call")
    assert call.status == "incomplete"
    assert call.output is None
    for _ in range(100):
        if record.cancelled:
            break
        threading.Event().wait(0.05)
    assert record.cancelled == ["hang"]
    # Sent back, the unfinished call tells the model it did not finish (not that it returned nothing).
    history = [
        {"role": "user", "content": 'call lab.hang {"seconds": 1.5}'},
        *[item.model_dump(exclude_none=True) for item in cancelled.output],
    ]
    answer = post(url, {"model": "gpt-oss-replay", "input": history, "tools": [never(servers.streamable)], "store": False}).json()
    assert (
        answer["output"][-1]["content"][0]["text"] == "Tool lab.hang returned: Not finished: the response ended before the tool returned."
    )


def test_websocket_mode_runs_the_loop(url, servers, record):
    sdk = client(url)
    with sdk.responses.connect() as connection:
        connection.response.create(model="gpt-oss-replay", input=CALL_ECHO, tools=[never(servers.streamable)])
        types = []
        for event in connection:
            types.append(event.type)
            if event.type in ("response.completed", "response.failed", "error"):
                break
    assert types[-1] == "response.completed"
    assert "response.mcp_call.completed" in types
    assert record.calls == [("echo", {"text": "hi"})]


def test_a_conversation_keeps_its_listing_and_calls(url, servers, record):
    sdk = client(url)
    conversation = sdk.conversations.create()
    body = {"model": "gpt-oss-replay", "tools": [never(servers.streamable)], "conversation": conversation.id}
    post(url, body, input=CALL_ECHO)
    second = post(url, body, input='call lab.echo {"text": "2"}').json()
    assert second["output"][-1]["content"][0]["text"] == "Tool lab.echo returned: 2"
    assert record.methods.count("tools/list") == 1
    kinds = [item.type for item in sdk.conversations.items.list(conversation.id, order="asc").data]
    assert kinds.count("mcp_list_tools") == 1
    assert kinds.count("mcp_call") == 2


def test_each_call_is_reported_by_tool_and_outcome(servers, record):
    from serve_app.tools.server_tools import CallReport

    reports: list[CallReport] = []

    class Recorder(NoMetrics):
        def tool_call_finished(self, report: CallReport) -> None:
            reports.append(report)

    from tests.support.servers import free_port

    config = ToolsConfig.model_validate({"mcp": {"allowed_urls": LOOPBACK}})
    app = create_app([ServedModel("gpt-oss-replay", ReplayBackend())], ServerSettings(tools=config), metrics=Recorder())
    with uvicorn_server(app) as base:
        for command in (CALL_ECHO, 'call lab.fail {"text": "x"}'):
            post(base, {"model": "gpt-oss-replay", "input": command, "tools": [never(servers.streamable)]})
        post(base, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(servers.streamable)], "max_tool_calls": 0})
        calls = [(r.label, r.kind, r.status) for r in reports if r.kind == "mcp_call"]
        assert calls == [("lab", "mcp_call", s) for s in ("completed", "failed", "not_run")]
        called = [r for r in reports if r.kind == "mcp_call"]
        assert all(r.seconds > 0 for r in called[:2])
        assert called[2].seconds == 0
        # Each response listed the server once; a server that is down is a failed listing of its label.
        dead = never(f"http://127.0.0.1:{free_port()}/mcp", label="down")
        post(base, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(servers.streamable), dead]})
    listings = [(r.label, r.status) for r in reports if r.kind == "mcp_list_tools"]
    assert listings == [("lab", "completed")] * 4 + [("down", "failed")]
    assert all(r.seconds > 0 for r in reports if r.kind == "mcp_list_tools")


def test_a_tool_call_counts_in_the_tenants_quota(servers, record):
    """Three requests a minute: a response that runs one call counts two (the request and its
    call), so the third request is already one too many."""
    from serve_app.config import AuthConfig

    auth = AuthConfig.model_validate({"keys": [{"tenant": "t", "key_env": "T_KEY", "limits": {"requests_per_minute": 3}}]})
    key = "sk-tool-loop-0123456789abcdef"
    app = create_app(
        [ServedModel("gpt-oss-replay", ReplayBackend())],
        ServerSettings(auth=auth, tools=ToolsConfig.model_validate({"mcp": {"allowed_urls": LOOPBACK}})),
        environ={"T_KEY": key},
    )
    headers = {"Authorization": f"Bearer {key}"}
    with uvicorn_server(app) as base, httpx.Client(timeout=60, headers=headers) as http:
        ran = http.post(f"{base}/responses", json={"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [never(servers.streamable)]})
        assert ran.status_code == 200
        assert ran.json()["output"][2]["output"] == "hi"
        assert http.post(f"{base}/responses", json={"model": "gpt-oss-replay", "input": "one"}).status_code == 200
        assert http.post(f"{base}/responses", json={"model": "gpt-oss-replay", "input": "two"}).status_code == 429


@pytest.mark.slow
def test_a_server_that_accepts_and_never_answers_times_out_the_listing(servers, record):
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections are accepted by the kernel and never answered
    try:
        port = silent.getsockname()[1]
        with uvicorn_server(app_with({"mcp": {"allowed_urls": LOOPBACK, "connect_timeout_s": 1}})) as base:
            tool = never(f"http://127.0.0.1:{port}/mcp")
            terminal, _ = stream(base, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [tool]})
    finally:
        silent.close()
    assert "did not answer within 1 s" in terminal.output[0].error
    assert terminal.status == "completed"


# --- Several calls in one response: the replay scripts of tests/support/several_calls.py ---
# (gpt-oss calls one tool per round, in turn; the Qwen3-style model calls them all at once).

MEET = 'call lab.meet {"count": 2}'
LOOKUP_CITY = {"type": "function", "name": "lookup_city", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture(scope="module")
def several(store):
    with uvicorn_server(app_with({"mcp": {"allowed_urls": LOOPBACK, "call_timeout_s": 5}}, store, several_calls=True)) as base:
        yield base


def items(response, kind: str) -> list:
    return [item for item in response.output if item.type == kind]


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls_runs_a_rounds_calls_side_by_side_or_one_after_the_other(several, servers, record, parallel):
    body = {"model": "qwen3-replay", "input": f"{MEET}\n{MEET}", "tools": [never(servers.streamable)], "parallel_tool_calls": parallel}
    terminal, _ = stream(several, body)
    assert [item.type for item in terminal.output] == ["mcp_list_tools", "reasoning", "mcp_call", "mcp_call", "reasoning", "message"]
    # `meet` answers "met" only to calls that were running at one time.
    assert [call.output for call in items(terminal, "mcp_call")] == (["met", "met"] if parallel else ["alone", "alone"])
    assert record.calls == [("meet", {"count": 2})] * 2
    assert terminal.parallel_tool_calls is parallel


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "kinds"),
    [
        ("qwen3-replay", ["mcp_list_tools", "reasoning", "mcp_call", "function_call"]),  # one round
        ("gpt-oss-replay", ["mcp_list_tools", "reasoning", "mcp_call", "reasoning", "function_call"]),  # one call a round
    ],
)
def test_a_function_call_after_a_server_call_ends_the_response_once_that_ran(several, servers, record, model, kinds):
    tools = [LOOKUP_CITY, never(servers.streamable)]
    terminal, _ = stream(several, {"model": model, "input": f"{CALL_ECHO}\ncall lookup_city", "tools": tools})
    assert [item.type for item in terminal.output] == kinds
    assert terminal.status == "completed"
    (call,), (function,) = items(terminal, "mcp_call"), items(terminal, "function_call")
    assert (call.status, call.output, record.calls) == ("completed", "hi", [("echo", {"text": "hi"})])
    # The client runs its function; the model goes on from both outputs, nothing runs again.
    output = {"type": "function_call_output", "call_id": function.call_id, "output": "Paris"}
    answer = post(several, {"model": model, "input": [output], "tools": tools, "previous_response_id": terminal.id}).json()
    assert [item["type"] for item in answer["output"]] == ["reasoning", "message"]
    assert answer["output"][-1]["content"][0]["text"] == "Tool lookup_city returned: Paris"
    assert len(record.calls) == 1


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
def test_max_tool_calls_counts_every_call_of_the_response(several, servers, record, model):
    body = {"model": model, "input": 'call lab.echo {"text": "1"}\ncall lab.echo {"text": "2"}', "tools": [never(servers.streamable)]}
    whole, _ = stream(several, body)
    assert [call.output for call in items(whole, "mcp_call")] == ["1", "2"]
    assert whole.output[-1].content[0].text == "Tool lab.echo returned: 2"
    record.clear()
    capped, _ = stream(several, {**body, "max_tool_calls": 1})
    ran, refused = items(capped, "mcp_call")
    assert (ran.status, ran.output) == ("completed", "1")
    assert record.calls == [("echo", {"text": "1"})]
    assert refused.status == "failed"
    assert "max_tool_calls" in refused.error.model_dump_json()
    assert refused.output is None
    assert capped.output[-1].content[0].text.startswith("Tool lab.echo returned: Error: Not run")


def test_of_two_approval_requests_the_server_sees_exactly_the_approved_call(several, servers, record):
    tools = [mcp_tool(servers.streamable)]
    asked = post(several, {"model": "qwen3-replay", "input": 'call lab.delete {"id": "a"}\ncall lab.delete {"id": "b"}', "tools": tools})
    requests = [item for item in asked.json()["output"] if item["type"] == "mcp_approval_request"]
    assert [json.loads(request["arguments"]) for request in requests] == [{"id": "a"}, {"id": "b"}]
    assert record.calls == []
    answers = [
        {"type": "mcp_approval_response", "approval_request_id": requests[0]["id"], "approve": True},
        {"type": "mcp_approval_response", "approval_request_id": requests[1]["id"], "approve": False},
    ]
    ran = post(several, {"model": "qwen3-replay", "input": answers, "tools": tools, "previous_response_id": asked.json()["id"]}).json()
    assert record.calls == [("delete", {"id": "a"})]
    calls = [item for item in ran["output"] if item["type"] == "mcp_call"]
    assert [(call["approval_request_id"], call["output"]) for call in calls] == [(requests[0]["id"], "deleted a")]
    assert ran["output"][-1]["type"] == "message"
    assert ran["status"] == "completed"


@pytest.mark.slow
def test_approvals_one_round_after_the_other(several, servers, record):
    """gpt-oss asks for one call a round: approving it runs it and the model goes on to ask
    for the next; denying that one tells the model, which answers."""
    tools = [mcp_tool(servers.streamable)]
    body = {"model": "gpt-oss-replay", "tools": tools}
    asked = post(several, body, input='call lab.delete {"id": "a"}\ncall lab.delete {"id": "b"}').json()
    first = asked["output"][-1]
    approve = {"type": "mcp_approval_response", "approval_request_id": first["id"], "approve": True}
    again = post(several, body, input=[approve], previous_response_id=asked["id"]).json()
    assert [item["type"] for item in again["output"]] == ["mcp_call", "reasoning", "mcp_approval_request"]
    assert record.calls == [("delete", {"id": "a"})]
    assert json.loads(again["output"][-1]["arguments"]) == {"id": "b"}
    deny = {"type": "mcp_approval_response", "approval_request_id": again["output"][-1]["id"], "approve": False}
    told = post(several, body, input=[deny], previous_response_id=again["id"]).json()
    assert record.calls == [("delete", {"id": "a"})]
    assert told["output"][-1]["content"][0]["text"].startswith("Tool lab.delete returned: The user did not approve this call")


class EndingBackend(ReplayBackend):
    """Notes how each engine request ended: the finish reason of its last batch, None when it
    was closed before its last batch (aborted)."""

    def __init__(self, config: ReplayConfig) -> None:
        super().__init__(config)
        self.ended: dict[str, str | None] = {}

    async def generate(self, request):
        self.ended[request.request_id] = None
        async with contextlib.aclosing(super().generate(request)) as batches:
            async for batch in batches:
                self.ended[request.request_id] = batch.finish_reason
                yield batch


@pytest.mark.slow
def test_a_client_gone_in_the_next_round_aborts_that_rounds_engine_request(servers, record):
    """The second round answers with the tool's long output (a few hundred engine steps); the
    client leaves at its first event, and that engine request is aborted there."""
    backend = EndingBackend(ReplayConfig(step_delay_s=0.005))
    config = ToolsConfig.model_validate({"mcp": {"allowed_urls": LOOPBACK}})
    body = {"model": "gpt-oss-replay", "input": 'call lab.big {"size": 4000}', "tools": [never(servers.streamable)]}
    with uvicorn_server(create_app([ServedModel("gpt-oss-replay", backend)], ServerSettings(tools=config))) as base:
        whole = post(base, body).json()
        assert whole["output"][-1]["content"][0]["text"] == "Tool lab.big returned: " + "x" * 4000
        assert backend.ended == {whole["id"]: "stop", f"{whole['id']}-2": "stop"}
        with httpx.Client(timeout=30) as http, http.stream("POST", f"{base}/responses", json={**body, "stream": True}) as response:
            lines = response.iter_lines()
            for line in lines:
                if "response.mcp_call.completed" in line:
                    break
            for line in lines:
                if "response.output_item.added" in line:
                    break  # the next round generates: go away
        assert wait_until(lambda: backend.num_running() == 0, timeout_s=20)
    cut = next(response_id for response_id in backend.ended if response_id.endswith("-2") and response_id != f"{whole['id']}-2")
    assert backend.ended[cut] is None
    assert backend.ended[cut.removesuffix("-2")] == "stop"


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
def test_context_management_compacts_between_tool_rounds(url, servers, record, model):
    """A tool's output takes the next round's prompt over `compact_threshold`: the response
    compacts there (an output item after the call), the round reads the summary and its own
    call and output, and answers; a later turn reads the compaction (and the fact it kept)."""
    first = post(url, {"model": model, "input": "Remember: the vault code is 0451.\n" + "word " * 150}).json()  # ~700-token prompts
    body = {
        "model": model,
        "input": 'call lab.big {"size": 4000}',
        "previous_response_id": first["id"],
        "tools": [never(servers.streamable)],
        "context_management": [{"type": "compaction", "compact_threshold": 1000}],
    }
    terminal, events = stream(url, body)
    kinds = [item.type for item in terminal.output]
    assert kinds.index("mcp_call") < kinds.index("compaction") < len(kinds) - 1, kinds
    assert terminal.output[-1].content[0].text == "Tool lab.big returned: " + "x" * 4000
    assert "response.compaction.compacting" in [e["type"] for e in events]
    later = post(url, {"model": model, "input": "What should you remember?", "previous_response_id": terminal.id}).json()
    assert later["output"][-1]["content"][0]["text"] == "Remember: the vault code is 0451."


class _AcknowledgingReplay(ReplayBackend):
    """An engine replica whose first tokens are slow: each generation acknowledged first."""

    async def generate(self, request):
        from serve_app.core.tokens import TokenBatch

        yield TokenBatch.acknowledgement()
        async for batch in super().generate(request):
            yield batch


@pytest.mark.anyio
async def test_a_rounds_next_generation_counts_its_prompt_from_its_tokens_not_its_acknowledgement(servers):
    """The tool round's figures (bench.tool_loop, metrics) come from the next generation's
    first batch of tokens; an acknowledgement before it carries no prompt count."""
    from cryptography.fernet import Fernet

    from serve_app.api.request import ResponsesRequest
    from serve_app.core.encrypted_reasoning import ReasoningCipher
    from serve_app.runtime.run import run_turn, start_turn
    from serve_app.state import ResponseStore

    runtime = server_tool_runtime(ToolsConfig.model_validate({"mcp": {"allowed_urls": LOOPBACK}}), NoMetrics())
    model = ServedModel("gpt-oss-replay", _AcknowledgingReplay())
    request = ResponsesRequest.model_validate(
        {"model": model.name, "input": CALL_ECHO, "tools": [never(servers.streamable)], "store": False}
    )
    request, _ = runtime.admit(request)
    turn = await start_turn(
        request, model, ResponseStore(MemoryStore(), "test"), None, ReasoningCipher([Fernet.generate_key()]), server_tools=runtime
    )
    async for _ in run_turn(turn, ResponseStore(MemoryStore(), "test")):
        pass
    assert turn.stream.response.status == "completed"
    (tool_round,) = turn.trace.tool_rounds
    # Replay counts the whole prompt as cached but its last token; the second prompt holds the first.
    assert tool_round.prompt_tokens > turn.stream.response.usage.input_tokens / 2
    assert tool_round.cached_tokens > 0

"""A hostile client against the request's MCP servers, in one process: what a request may make
the server send, and to how many servers. Real MCP servers on loopback record what reached them."""

from __future__ import annotations

import httpx
import pytest

from serve_app.config import ToolsConfig
from serve_app.engines.replay import ReplayBackend
from serve_app.runtime.metrics import NoMetrics
from serve_app.server.app import ServedModel, create_app, server_tool_runtime
from serve_app.tools.remote_mcp import MAX_SERVERS
from tests.support.mcp_servers import mcp_servers, mcp_tool
from tests.support.servers import uvicorn_server

CALL_ECHO = 'call lab.echo {"text": "hi"}'


@pytest.fixture(scope="module")
def servers():
    with mcp_servers() as running:
        yield running


@pytest.fixture(scope="module")
def url():
    config = ToolsConfig.model_validate({"mcp": {"allowed_urls": ["http://127.0.0.1:*/*"], "call_timeout_s": 5}})
    app = create_app([ServedModel("gpt-oss-replay", ReplayBackend())], server_tools=server_tool_runtime(config, NoMetrics()))
    with uvicorn_server(app) as base:
        yield base


def post(url: str, body: dict) -> httpx.Response:
    with httpx.Client(timeout=60) as http:
        return http.post(f"{url}/responses", json=body)


@pytest.mark.parametrize(
    "name",
    [
        "Host",  # another virtual host behind the allowed address: the allow-list is by URL, not by address
        "host",
        "X-Forwarded-Host",
        "X-Forwarded-For",  # who sent it: the server's own connection, not the request's say
        "Forwarded",
        "X-Real-IP",
        "Content-Length",  # framing: the HTTP client's
        "Transfer-Encoding",
        "Connection",
        "Upgrade",
        "Proxy-Authorization",
        "Mcp-Session-Id",  # the MCP protocol's: another client's session at that server
        "MCP-Protocol-Version",
        "Content-Type",
        "Accept",
    ],
)
def test_a_request_cannot_set_the_connections_own_headers(url, servers, name):
    servers.clear()
    tool = mcp_tool(servers.streamable, require_approval="never", headers={name: "admin.internal"})
    response = post(url, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [tool]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tools[0]"
    assert "set by the server's MCP client" in error["message"]
    assert "admin.internal" not in response.text  # a header's value is never echoed
    assert servers.record.requests == []  # nothing was sent anywhere


def test_the_headers_a_request_may_set_reach_its_server(url, servers):
    servers.clear()
    headers = {"X-Api-Key": "k-123", "Authorization": "Bearer t", "Cookie": "a=b", "User-Agent": "agent/1"}
    tool = mcp_tool(servers.streamable, require_approval="never", headers=headers)
    response = post(url, {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [tool]})
    assert response.status_code == 200, response.text
    assert response.json()["output"][-1]["content"][0]["text"] == "Tool lab.echo returned: hi"
    sent = [seen for _, _, seen in servers.record.requests]
    assert sent
    assert all(seen["host"] == servers.streamable.split("/")[2] for seen in sent)
    assert all(seen["x-api-key"] == "k-123" and seen["cookie"] == "a=b" for seen in sent)


def test_a_request_names_a_bounded_number_of_mcp_servers(url, servers):
    """Each server named is a connection and a listing held for the response: 500 of them (the
    request's tool limit allows that many) opened 500 connections at once from one request."""
    servers.clear()
    tools = [mcp_tool(servers.streamable, label=f"l{index}", require_approval="never") for index in range(MAX_SERVERS + 1)]
    response = post(url, {"model": "gpt-oss-replay", "input": "hi", "tools": tools})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "array_above_max_length"
    assert f"at most {MAX_SERVERS} MCP servers" in response.text
    assert servers.record.requests == []
    allowed = post(url, {"model": "gpt-oss-replay", "input": 'call l0.echo {"text": "hi"}', "tools": tools[:MAX_SERVERS]})
    assert allowed.status_code == 200
    assert allowed.json()["output"][-1]["content"][0]["text"] == "Tool l0.echo returned: hi"

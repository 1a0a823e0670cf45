"""`POST /v1/responses/input_tokens` with server-side tools, in one process (no Ray): the count
is the prompt of the response's first engine request, the tools the model is offered
included (`file_search`, MCP, `web_search`, `code_interpreter`), on both families — the
`usage.input_tokens` of the same request's response, which the replay models answer in one
generation. An MCP server not listed yet in the conversation is not contacted: its tools
are not counted (the response lists them first), and once its listing is in the
conversation the count is exact again."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from serve_app.config import FilesConfig, ModelConfig, ToolsConfig, VectorStoresConfig
from serve_app.config.files import BlobConfig
from serve_app.engines import make_backend
from serve_app.engines.replay import ReplayBackend
from serve_app.runtime.models import served_model
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.state import MemoryStore
from tests.conftest import QWEN3_REPLAY
from tests.support.mcp_servers import mcp_servers, mcp_tool
from tests.support.servers import uvicorn_server
from tests.support.vector_stores import ingested

pytestmark = pytest.mark.slow  # a server, an MCP server, a tokenizer: seconds

MODELS = ["gpt-oss-replay", "qwen3-replay"]
QUESTION = "What do the notes say about zebras?"
NEVER_CALLED = "http://127.0.0.1:9/mcp"  # the built-in tools' servers: offered, never called by these requests


@pytest.fixture(scope="module")
def mcp():
    with mcp_servers() as running:
        yield running


@pytest.fixture(scope="module")
def server(tmp_path_factory, mcp):
    root: Path = tmp_path_factory.mktemp("input-tokens")
    qwen3 = ModelConfig.model_validate(QWEN3_REPLAY)
    models = [ServedModel("gpt-oss-replay", ReplayBackend()), served_model(qwen3, make_backend(qwen3.backend))]
    tools = ToolsConfig.model_validate(
        {
            "mcp": {"allowed_urls": ["http://127.0.0.1:*/*"]},
            "builtin": {"python": {"url": NEVER_CALLED}, "browser": {"url": NEVER_CALLED}},
        }
    )
    settings = ServerSettings(
        tools=tools,
        files=FilesConfig(blob=BlobConfig(path=str(root / "blobs"))),
        vector_stores=VectorStoresConfig(directory=str(root / "index")),
    )
    with uvicorn_server(create_app(models, settings, store=MemoryStore())) as url:
        yield url


@pytest.fixture(scope="module")
def vector_store(server) -> str:
    client = openai.OpenAI(base_url=server, api_key="none", max_retries=0, timeout=60)
    notes = client.files.create(file=("notes.txt", io.BytesIO(b"Zebras migrate in July.")), purpose="assistants")
    vector_store = client.vector_stores.create(name="notes", file_ids=[notes.id])
    return ingested(client, vector_store.id).id


def _post(server: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{server}{path}", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def count(server: str, body: dict[str, Any]) -> int:
    return int(_post(server, "/responses/input_tokens", body)["input_tokens"])


def respond(server: str, body: dict[str, Any]) -> dict[str, Any]:
    response = _post(server, "/responses", body)
    assert response["status"] == "completed", response
    return response


def _tools(kind: str, vector_store: str) -> list[dict[str, Any]]:
    return {
        "file_search": [{"type": "file_search", "vector_store_ids": [vector_store], "max_num_results": 4}],
        "web_search": [{"type": "web_search"}],
        "code_interpreter": [{"type": "code_interpreter", "container": {"type": "auto"}}],
        "all": [
            {"type": "file_search", "vector_store_ids": [vector_store]},
            {"type": "web_search"},
            {"type": "code_interpreter", "container": {"type": "auto"}},
            {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
        ],
    }[kind]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("kind", ["file_search", "web_search", "code_interpreter", "all"])
def test_the_count_is_the_prompt_the_response_had(server, vector_store, model, kind):
    body = {"model": model, "input": QUESTION, "tools": _tools(kind, vector_store)}
    counted = count(server, body)
    response = respond(server, body)
    assert [item["type"] for item in response["output"]][-1] == "message"  # answered in one generation
    assert counted == response["usage"]["input_tokens"]
    assert counted > count(server, {"model": model, "input": QUESTION}) + 20  # the offered tool is in it


@pytest.mark.parametrize("model", MODELS)
def test_an_mcp_servers_tools_are_counted_once_its_listing_is_in_the_conversation(server, mcp, model):
    """The first request names a server not listed yet: the response lists it (an
    `mcp_list_tools` item) and then prompts with its tools; the count, which contacts no
    server, has them not. The next turn has the listing in its conversation: exact again."""
    tools = [mcp_tool(mcp.streamable, require_approval="never")]
    first = {"model": model, "input": QUESTION, "tools": tools}
    mcp.clear()
    counted = count(server, first)
    assert mcp.record.methods == []  # the count made no connection
    response = respond(server, first)
    assert response["output"][0]["type"] == "mcp_list_tools"
    assert counted < response["usage"]["input_tokens"]  # the listed tools were not counted
    follow = {"model": model, "input": "And in August?", "tools": tools, "previous_response_id": response["id"]}
    mcp.clear()
    counted = count(server, follow)
    assert mcp.record.methods == []
    answer = respond(server, follow)
    assert "mcp_list_tools" not in [item["type"] for item in answer["output"]]  # listed already: not again
    assert counted == answer["usage"]["input_tokens"]

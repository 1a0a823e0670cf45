"""Tenancy of vector stores through HTTP and WebSocket, in one process (no Ray):

- a `file_search` tool naming a vector store that is not the caller's (another tenant's, a
  made-up id) is a 404 naming `tools[i].vector_store_ids[j]` before anything is generated,
  stored or charged: `POST /v1/responses` (streamed or not, in the background too), a
  WebSocket `response.create`, `POST /v1/responses/input_tokens`;
- a tenant's files waiting for ingestion or being ingested on a replica are at most its
  share of the replica's queue (`vector_stores.ingest_queue_per_tenant`): past it, a 429
  with `Retry-After` and nothing recorded, while another tenant's attach is taken and
  ingested."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import openai
import pytest

from serve_app.config import AuthConfig, FilesConfig, VectorStoresConfig
from serve_app.config.files import BlobConfig
from serve_app.engines.replay import ReplayBackend
from serve_app.retrieval.embeddings import HashingEmbedder, Vectors
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.state import MemoryStore
from tests.support import socket_scenarios
from tests.support.contract import parse_sse
from tests.support.servers import uvicorn_server

MODEL = "gpt-oss-replay"
KEYS = {"alice": "sk-alice-0123456789abcdef", "bob": "sk-bob-0123456789abcdef"}
TOKENS_PER_MINUTE = 10_000_000
AUTH = AuthConfig.model_validate(
    {
        "keys": [
            {"tenant": "alice", "key_env": "ALICE"},
            {"tenant": "bob", "key_env": "BOB", "limits": {"tokens_per_minute": TOKENS_PER_MINUTE}},
        ]
    }
)
SEARCH = 'call file_search {"query": "zebras"}'
FUNCTION = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
HELD = b"HOLD: this file is ingested when the test lets it. " * 4


class CountingBackend(ReplayBackend):
    """The replay model, counting its generations."""

    def __init__(self) -> None:
        super().__init__()
        self.generations = 0

    async def generate(self, request):
        self.generations += 1
        async for batch in super().generate(request):
            yield batch


class GatedEmbedder(HashingEmbedder):
    """The hashing model; a text with HOLD waits until the test sets `gate` (a file stays at work)."""

    def __init__(self) -> None:
        super().__init__(64)
        self.gate = threading.Event()

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if any("HOLD" in text for text in texts):
            await asyncio.to_thread(self.gate.wait, 120)
        return await super().embed(texts)


@pytest.fixture(scope="module")
def backend() -> CountingBackend:
    return CountingBackend()


@pytest.fixture(scope="module")
def embedder() -> GatedEmbedder:
    return GatedEmbedder()


@pytest.fixture(scope="module")
def server(tmp_path_factory, backend, embedder):
    root: Path = tmp_path_factory.mktemp("vs-tenancy")
    settings = ServerSettings(
        auth=AUTH,
        files=FilesConfig(blob=BlobConfig(path=str(root / "blobs"))),
        vector_stores=VectorStoresConfig(directory=str(root / "index"), ingest_queue=10, ingest_queue_per_tenant=2, ingest_workers=3),
    )
    app = create_app(
        [ServedModel(MODEL, backend)],
        settings,
        store=MemoryStore(clock=lambda: 1000.0),  # quotas never refill: what a request was charged shows
        environ={name.upper(): key for name, key in KEYS.items()},
        embedder=embedder,
    )
    with uvicorn_server(app) as url:
        yield url
    embedder.gate.set()


def sdk(url: str, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=KEYS[tenant], max_retries=0, timeout=60)


def _post(url: str, path: str, body: dict, tenant: str = "bob") -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers={"Authorization": f"Bearer {KEYS[tenant]}"}, timeout=60)


@pytest.fixture(scope="module")
def stores(server) -> dict[str, str]:
    return {tenant: sdk(server, tenant).vector_stores.create(name=f"{tenant}'s").id for tenant in KEYS}


def _searched(answer: httpx.Response) -> dict:
    """The `file_search_call` of a response that ran (streamed or not)."""
    assert answer.status_code == 200, answer.text
    response = (
        parse_sse(answer.content)[-1]["response"] if answer.headers["content-type"].startswith("text/event-stream") else answer.json()
    )
    assert response["status"] == "completed"
    return next(item for item in response["output"] if item["type"] == "file_search_call")


@pytest.mark.parametrize("whose", ["another tenant's", "made up"])
def test_a_file_search_of_a_store_not_the_callers_is_a_404_before_anything_runs(server, stores, backend, whose) -> None:
    foreign = stores["alice"] if whose == "another tenant's" else "vs_madeup0123456789abcdef"
    conversation = sdk(server, "bob").conversations.create().id
    honest = {"model": MODEL, "input": SEARCH, "tools": [{"type": "file_search", "vector_store_ids": [stores["bob"]]}]}
    first = _post(server, "/responses", honest)
    assert _searched(first)["status"] == "completed"  # bob's own store is searched
    left = int(first.headers["x-ratelimit-remaining-tokens"]) - first.json()["usage"]["total_tokens"]
    generations = backend.generations
    asked = {
        **honest,
        "conversation": conversation,
        "tools": [FUNCTION, {"type": "file_search", "vector_store_ids": [stores["bob"], foreign]}],
    }
    for path, body in [
        ("/responses", asked),
        ("/responses", {**asked, "stream": True}),
        ("/responses", {**asked, "background": True}),
        ("/responses/input_tokens", asked),
    ]:
        refused = _post(server, path, body)
        assert refused.status_code == 404, (path, body, refused.text)
        error = refused.json()["error"]
        assert error == {
            "message": f"No vector store found with id '{foreign}'.",
            "type": "invalid_request_error",
            "param": "tools[1].vector_store_ids[1]",
            "code": "not_found",
        }
    assert backend.generations == generations  # nothing generated
    assert sdk(server, "bob").conversations.items.list(conversation).data == []  # nothing stored
    again = _post(server, "/responses", {**honest, "stream": True})
    assert int(again.headers["x-ratelimit-remaining-tokens"]) == left  # nothing charged
    assert _searched(again)["status"] == "completed"


def test_the_sdk_gets_its_not_found_error(server, stores) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        sdk(server, "alice").responses.create(
            model=MODEL, input=SEARCH, tools=[{"type": "file_search", "vector_store_ids": [stores["bob"]]}]
        )
    assert refused.value.body["param"] == "tools[0].vector_store_ids[0]"


def test_a_websocket_response_create_is_refused_and_the_connection_goes_on(server, stores, backend) -> None:
    headers = {"Authorization": f"Bearer {KEYS['bob']}"}
    with socket_scenarios.socket(server, headers) as connection:
        generations = backend.generations
        socket_scenarios.create(
            connection, model=MODEL, input=SEARCH, tools=[{"type": "file_search", "vector_store_ids": [stores["alice"]]}]
        )
        (error,) = socket_scenarios.until_end(connection)
        assert (error["type"], error["status"]) == ("error", 404)
        assert (error["error"]["code"], error["error"]["param"]) == ("not_found", "tools[0].vector_store_ids[0]")
        assert backend.generations == generations
        socket_scenarios.create(connection, model=MODEL, input=SEARCH, tools=[{"type": "file_search", "vector_store_ids": [stores["bob"]]}])
        events = socket_scenarios.response_events(socket_scenarios.until_end(connection))
        assert events[-1]["type"] == "response.completed"
        assert any(item["type"] == "file_search_call" for item in events[-1]["response"]["output"])


def _upload(client: openai.OpenAI, name: str, data: bytes) -> str:
    return client.files.create(file=(name, io.BytesIO(data)), purpose="assistants").id


def _until_ingested(client: openai.OpenAI, vector_store_id: str, file_id: str) -> str:
    for _ in range(600):  # polled as clients poll, at most a minute
        status = client.vector_stores.files.retrieve(file_id, vector_store_id=vector_store_id).status
        if status != "in_progress":
            return status
        time.sleep(0.1)
    raise AssertionError("ingestion did not finish")


@pytest.mark.slow  # files ingested: the chunking tokenizer loads
def test_a_tenant_past_its_ingestion_share_is_refused_while_another_is_ingested(server, stores, embedder) -> None:
    alice, bob = sdk(server, "alice"), sdk(server, "bob")
    held = [_upload(alice, f"held-{n}.txt", HELD) for n in range(3)]
    for file_id in held[:2]:
        assert alice.vector_stores.files.create(stores["alice"], file_id=file_id).status == "in_progress"
    with pytest.raises(openai.RateLimitError) as refused:
        alice.vector_stores.files.create(stores["alice"], file_id=held[2])
    assert refused.value.response.headers["retry-after"] == "5"
    assert refused.value.body["code"] == "rate_limit_exceeded"
    assert "vector_stores.ingest_queue_per_tenant" in refused.value.body["message"]
    with pytest.raises(openai.RateLimitError):  # a batch too, all of its files or none
        alice.vector_stores.file_batches.create(stores["alice"], file_ids=held[2:])
    assert {f.id for f in alice.vector_stores.files.list(stores["alice"]).data} == set(held[:2])  # nothing recorded
    # bob is served while alice's files hold her whole share
    zebras = _upload(bob, "zebras.txt", b"Plains zebras migrate across the Serengeti in July.")
    assert bob.vector_stores.files.create(stores["bob"], file_id=zebras).status == "in_progress"
    assert _until_ingested(bob, stores["bob"], zebras) == "completed"
    assert bob.vector_stores.search(stores["bob"], query="zebras").data[0].filename == "zebras.txt"
    embedder.gate.set()
    assert [_until_ingested(alice, stores["alice"], file_id) for file_id in held[:2]] == ["completed", "completed"]
    # her places are back
    assert alice.vector_stores.files.create(stores["alice"], file_id=held[2]).status == "in_progress"
    assert _until_ingested(alice, stores["alice"], held[2]) == "completed"
    assert json.loads(alice.vector_stores.with_raw_response.retrieve(stores["alice"]).text)["file_counts"]["completed"] == 3

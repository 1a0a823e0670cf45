"""Vector stores and `file_search` through HTTP in one process (no Ray), with the `openai`
SDK: files uploaded, a vector store built from them, searched (hybrid, filters, ranking
options), and responses that answer with `file_search` and `file_citation` annotations on
both replay models; tenancy (another tenant's store is a 404, in a `file_search` tool too) and deletes."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.responses import ResponseFileSearchToolCall

from serve_app.config import AuthConfig, FilesConfig, ModelConfig, VectorStoresConfig
from serve_app.config.files import BlobConfig
from serve_app.engines import make_backend
from serve_app.engines.replay import ReplayBackend
from serve_app.runtime.models import served_model
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.state import MemoryStore
from tests.conftest import QWEN3_REPLAY
from tests.support.contract import check_stream, parse_sse
from tests.support.pdfs import text_pdf
from tests.support.servers import uvicorn_server
from tests.support.vector_stores import ingested

pytestmark = pytest.mark.slow  # a server, a tokenizer and several files: seconds

MODELS = ["gpt-oss-replay", "qwen3-replay"]
KEYS = {"alice": "sk-alice-0123456789abcdef", "bob": "sk-bob-0123456789abcdef"}
AUTH = AuthConfig.model_validate({"keys": [{"tenant": name, "key_env": name.upper()} for name in KEYS]})
DOCUMENTS = {
    "zebras.txt": b"Plains zebras migrate across the Serengeti in July, following the rains and fresh grass.",
    "budget.md": b"# Budget\n\nThe marketing budget for 2025 is four million euros, approved by the board in March.",
}
PDF_TEXT = "The Kubernetes liveness probe restarts a pod after three failed checks."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("vs")
    qwen3 = ModelConfig.model_validate(QWEN3_REPLAY)
    models = [ServedModel("gpt-oss-replay", ReplayBackend()), served_model(qwen3, make_backend(qwen3.backend))]
    settings = ServerSettings(
        auth=AUTH,
        files=FilesConfig(blob=BlobConfig(path=str(root / "blobs"))),
        vector_stores=VectorStoresConfig(directory=str(root / "index")),
    )
    app = create_app(models, settings, store=MemoryStore(), environ={name.upper(): key for name, key in KEYS.items()})
    with uvicorn_server(app) as url:
        yield url


def sdk(url: str, tenant: str = "alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=KEYS[tenant], max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def store(server):
    client = sdk(server)
    files = [client.files.create(file=(name, io.BytesIO(data)), purpose="assistants") for name, data in DOCUMENTS.items()]
    pdf = client.files.create(file=("probes.pdf", io.BytesIO(text_pdf([PDF_TEXT]))), purpose="assistants")
    vector_store = client.vector_stores.create(name="docs", file_ids=[f.id for f in files])
    batch = client.vector_stores.file_batches.create(
        vector_store.id, files=[{"file_id": pdf.id, "attributes": {"kind": "pdf", "year": 2024}}]
    )
    ingested(client, vector_store.id)
    assert client.vector_stores.file_batches.retrieve(batch.id, vector_store_id=vector_store.id).status == "completed"
    return {"id": vector_store.id, "files": {f.filename: f.id for f in [*files, pdf]}}


def test_a_store_built_from_several_files_is_searched(server, store) -> None:
    client = sdk(server)
    vector_store = client.vector_stores.retrieve(store["id"])
    assert (vector_store.file_counts.completed, vector_store.file_counts.total, vector_store.status) == (3, 3, "completed")
    assert vector_store.usage_bytes > 0
    listed = client.vector_stores.files.list(store["id"])
    assert {f.id for f in listed.data} == set(store["files"].values())
    assert all(f.status == "completed" and f.chunking_strategy.type == "static" for f in listed.data)
    page = client.vector_stores.search(store["id"], query="When do zebras migrate?")
    assert page.data[0].filename == "zebras.txt"
    assert "Serengeti" in page.data[0].content[0].text
    assert 0 < page.data[0].score <= 1
    pdf_only = client.vector_stores.search(store["id"], query="zebras", filters={"key": "kind", "type": "eq", "value": "pdf"})
    assert [r.filename for r in pdf_only.data] == ["probes.pdf"]
    semantic = client.vector_stores.search(
        store["id"],
        query="liveness probe",
        ranking_options={"score_threshold": 0.0, "hybrid_search": {"embedding_weight": 1, "text_weight": 0}},
    )
    assert semantic.data[0].filename == "probes.pdf"


def test_another_tenant_sees_no_store_of_alice(server, store) -> None:
    bob = sdk(server, "bob")
    for call in (
        lambda: bob.vector_stores.retrieve(store["id"]),
        lambda: bob.vector_stores.search(store["id"], query="zebras"),
        lambda: bob.vector_stores.files.list(store["id"]),
        lambda: bob.vector_stores.delete(store["id"]),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert bob.vector_stores.list().data == []
    # a file_search of alice's store by bob is refused before it runs (tests/server/test_file_search_tenancy.py)
    with pytest.raises(openai.NotFoundError) as refused:
        bob.responses.create(
            model="gpt-oss-replay",
            input='call file_search {"query": "zebras"}',
            tools=[{"type": "file_search", "vector_store_ids": [store["id"]]}],
        )
    assert refused.value.body["param"] == "tools[0].vector_store_ids[0]"


def test_a_file_the_tenant_does_not_have_is_never_attached_nor_queued(server, store) -> None:
    """Another tenant's file or a made-up id is a 404 before anything is recorded or queued
    (it used to be accepted `in_progress` and fail in the replica's shared ingestion queue)."""
    bob = sdk(server, "bob")
    alices = store["files"]["zebras.txt"]
    mine = bob.vector_stores.create(name="bob's")
    for call in (
        lambda: bob.vector_stores.files.create(vector_store_id=mine.id, file_id=alices),
        lambda: bob.vector_stores.file_batches.create(vector_store_id=mine.id, file_ids=["file-made-up"]),
        lambda: bob.vector_stores.create(name="x", file_ids=[alices]),
    ):
        with pytest.raises(openai.NotFoundError) as error:
            call()
        assert error.value.body["param"] == "file_id"
    assert bob.vector_stores.files.list(mine.id).data == []
    assert [v.id for v in bob.vector_stores.list().data] == [mine.id]
    bob.vector_stores.delete(mine.id)


@pytest.mark.parametrize("model", MODELS)
def test_a_response_answers_with_file_search_and_cites_the_files(server, store, model: str) -> None:
    body = {
        "model": model,
        "input": 'call file_search {"query": "When do zebras migrate?"}',
        "tools": [{"type": "file_search", "vector_store_ids": [store["id"]], "max_num_results": 2}],
        "include": ["file_search_call.results"],
        "stream": True,
    }
    raw = httpx.post(f"{server}/responses", json=body, headers={"Authorization": f"Bearer {KEYS['alice']}"}, timeout=60).content
    terminal = check_stream(parse_sse(raw))
    call = next(item for item in terminal.output if item.type == "file_search_call")
    assert isinstance(call, ResponseFileSearchToolCall)
    assert call.id.startswith("fs_")
    assert call.status == "completed"
    assert call.queries == ["When do zebras migrate?"]
    assert call.results is not None
    assert 1 <= len(call.results) <= 2
    assert call.results[0].filename == "zebras.txt"
    answer = terminal.output[-1]
    assert answer.type == "message"
    text = answer.content[0]
    assert "Serengeti" in text.text
    assert "【" not in text.text
    citations = [a for a in text.annotations if a.type == "file_citation"]
    assert citations
    assert citations[0].file_id == store["files"]["zebras.txt"]
    assert citations[0].filename == "zebras.txt"
    assert 0 <= citations[0].index <= len(text.text)
    # the same request, not streamed, answers the same; results only when included
    plain = sdk(server).responses.create(**{k: v for k, v in body.items() if k not in ("stream", "include")})
    plain_call = next(item for item in plain.output if item.type == "file_search_call")
    assert plain_call.results is None
    assert plain.output_text == text.text


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("choice", [{"type": "file_search"}, "required"], ids=["hosted", "required"])
def test_tool_choice_forces_a_search_the_user_did_not_ask_for(server, store, model: str, choice) -> None:
    """`tool_choice: {"type": "file_search"}` (or `required` with file_search the only tool)
    is a search, once: the replay models obey the engine constraint as a model must (their
    script would answer: the input names no call), then answer from what they read."""
    client = sdk(server)
    tools = [{"type": "file_search", "vector_store_ids": [store["id"]]}]
    response = client.responses.create(model=model, input="When do zebras migrate?", tools=tools, tool_choice=choice)
    assert [item.type for item in response.output if item.type != "reasoning"] == ["file_search_call", "message"]
    assert response.output[-1].type == "message"
    echoed = response.tool_choice if isinstance(response.tool_choice, str) else response.tool_choice.model_dump(exclude_none=True)
    assert echoed == choice  # the request's choice, not the call it became
    unforced = client.responses.create(model=model, input="When do zebras migrate?", tools=tools)
    assert [item.type for item in unforced.output if item.type != "reasoning"] == ["message"]


def test_deleting_a_file_and_a_store_removes_their_index_entries(server) -> None:
    client = sdk(server)
    file = client.files.create(file=("tmp.txt", io.BytesIO(b"Quokkas live on Rottnest Island.")), purpose="assistants")
    vector_store = client.vector_stores.create(name="tmp", file_ids=[file.id])
    ingested(client, vector_store.id)
    assert client.vector_stores.search(vector_store.id, query="quokkas").data
    assert client.vector_stores.files.delete(file.id, vector_store_id=vector_store.id).deleted
    assert client.vector_stores.search(vector_store.id, query="quokkas").data == []
    # deleting the uploaded file takes it out of every store that held it
    client.vector_stores.files.create(vector_store.id, file_id=file.id)
    ingested(client, vector_store.id)
    assert client.vector_stores.search(vector_store.id, query="quokkas").data
    assert client.files.delete(file.id).deleted
    assert client.vector_stores.search(vector_store.id, query="quokkas").data == []
    assert client.vector_stores.files.list(vector_store.id).data == []
    assert client.vector_stores.delete(vector_store.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.search(vector_store.id, query="quokkas")


@pytest.mark.parametrize("model", MODELS)
def test_the_agents_sdk_file_search_tool_unmodified(server, store, model: str) -> None:
    """The Agents SDK's own `FileSearchTool` (with `include_search_results`): its run sees the
    search item and the cited answer, and a second turn resends the history (a
    `file_search_call` input item) as the SDK does."""
    import asyncio

    from agents import Agent, FileSearchTool, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)

    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=server, api_key=KEYS["alice"], max_retries=0, timeout=60)
        tool = FileSearchTool(vector_store_ids=[store["id"]], max_num_results=3, include_search_results=True)
        agent = Agent(
            name="librarian",
            instructions="Answer from the files.",
            model=OpenAIResponsesModel(model=model, openai_client=client),
            tools=[tool],
        )
        first = await Runner.run(agent, 'call file_search {"query": "marketing budget 2025"}')
        calls = [item.raw_item for item in first.new_items if getattr(item.raw_item, "type", None) == "file_search_call"]
        assert calls
        assert calls[0].status == "completed"
        assert calls[0].results
        assert calls[0].results[0].filename == "budget.md"
        assert "four million euros" in first.final_output
        second = await Runner.run(agent, [*first.to_input_list(), {"role": "user", "content": "Thanks!"}])
        assert second.final_output == "Thanks!"
        await client.close()

    asyncio.run(main())


def test_a_vector_index_out_of_reach_is_a_503_with_retry_after(tmp_path: Path) -> None:
    """A pgvector index whose PostgreSQL does not answer: the search route answers a 503 with
    Retry-After within the pool's wait (not a hang, not a 500), naming no address of the server;
    a response's `file_search` call fails with that message and the response still completes."""
    socket_dir = tmp_path / "no-server"  # where no PostgreSQL listens
    socket_dir.mkdir()
    settings = ServerSettings(
        files=FilesConfig(blob=BlobConfig(path=str(tmp_path / "blobs"))),
        vector_stores=VectorStoresConfig(index="pgvector", url=f"postgresql://vectors@/vectors?host={socket_dir}", pool_timeout_s=0.3),
    )
    app = create_app([ServedModel("gpt-oss-replay", ReplayBackend())], settings, store=MemoryStore())
    with uvicorn_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        vector_store = http.post("/vector_stores", json={"name": "docs"}).json()
        answer = http.post(f"/vector_stores/{vector_store['id']}/search", json={"query": "zebras"})
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == "1"
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "vector_index_unavailable")
        assert str(socket_dir) not in answer.text
        tools = [{"type": "file_search", "vector_store_ids": [vector_store["id"]]}]
        response = http.post(
            "/responses", json={"model": "gpt-oss-replay", "input": 'call file_search {"query": "zebras"}', "tools": tools}
        )
        assert response.status_code == 200
        (call,) = [item for item in response.json()["output"] if item["type"] == "file_search_call"]
        assert call["status"] == "failed"

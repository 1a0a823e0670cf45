"""Vector stores and `file_search` through Serve: two ingress replicas, each request of a
client on the other one. Files uploaded on one replica are ingested by the replica that took
the attach, searched from the other, and answered with citations on both replay models."""

from __future__ import annotations

import io
import time

import httpx
import pytest

from tests.support.contract import check_stream, parse_sse
from tests.support.sdk_scenarios import client
from tests.support.vector_stores import ingested

MODELS = ["gpt-oss-replay", "qwen3-replay"]


@pytest.fixture(scope="module")
def store(ingress_urls):
    first, second = (client(url) for url in ingress_urls[:2])
    files = [
        first.files.create(file=("zebras.txt", io.BytesIO(b"Plains zebras migrate across the Serengeti in July.")), purpose="assistants"),
        second.files.create(file=("budget.md", io.BytesIO(b"The marketing budget for 2025 is four million euros.")), purpose="assistants"),
    ]
    vector_store = first.vector_stores.create(name="docs", file_ids=[f.id for f in files])
    for _ in range(1200):  # the replica that took the attach ingests; the other reads the statuses
        if second.vector_stores.retrieve(vector_store.id).file_counts.completed == 2:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(second.vector_stores.retrieve(vector_store.id))
    return vector_store.id


def test_a_store_made_on_one_replica_is_searched_on_the_other(ingress_urls, store) -> None:
    for url in ingress_urls[:2]:
        page = client(url).vector_stores.search(store, query="When do zebras migrate?")
        assert page.data[0].filename == "zebras.txt"


@pytest.mark.parametrize("model", MODELS)
def test_file_search_answers_with_citations_through_serve(ingress_urls, store, model: str) -> None:
    body = {
        "model": model,
        "input": 'call file_search {"query": "marketing budget"}',
        "tools": [{"type": "file_search", "vector_store_ids": [store]}],
        "include": ["file_search_call.results"],
        "stream": True,
    }
    for url in ingress_urls[:2]:
        response = httpx.post(f"{url}/responses", json=body, timeout=120)
        assert response.status_code == 200, response.text
        terminal = check_stream(parse_sse(response.content))
        (call,) = [item for item in terminal.output if item.type == "file_search_call"]
        assert call.status == "completed"
        assert call.results[0].filename == "budget.md"
        part = terminal.output[-1].content[0]
        assert "four million euros" in part.text
        assert any(a.type == "file_citation" and a.filename == "budget.md" for a in part.annotations)


def test_a_batch_cancelled_on_the_other_replica_leaves_none_of_its_cancelled_files_searchable(ingress_urls) -> None:
    """A batch queued on one replica and cancelled through the other: each file ends
    `completed` and searchable or `cancelled` and not, whenever the cancel landed."""
    first, second = (client(url) for url in ingress_urls[:2])
    notes = [
        first.files.create(
            file=(f"herons-{n}.txt", io.BytesIO(f"Heron census {n}: lake {n} counted {7 * n} herons.".encode())), purpose="assistants"
        )
        for n in range(8)
    ]
    vector_store = first.vector_stores.create(name="cancelled")
    batch = first.vector_stores.file_batches.create(vector_store.id, file_ids=[note.id for note in notes])
    cancelled = second.vector_stores.file_batches.cancel(batch.id, vector_store_id=vector_store.id)
    assert cancelled.status in ("cancelled", "completed")  # completed: every file was ingested before the cancel
    ingested(second, vector_store.id, timeout_s=120)
    files = {file.id: file.status for file in second.vector_stores.files.list(vector_store.id, limit=100)}
    assert set(files.values()) <= {"completed", "cancelled"}
    for url in ingress_urls[:2]:
        page = client(url).vector_stores.search(vector_store.id, query="heron census lake herons", max_num_results=50)
        assert {hit.file_id for hit in page.data} == {file_id for file_id, status in files.items() if status == "completed"}


@pytest.mark.parametrize("model", MODELS)
def test_input_tokens_on_one_replica_is_the_prompt_of_the_response_on_the_other(ingress_urls, store, model: str) -> None:
    body = {"model": model, "input": "What is the marketing budget?", "tools": [{"type": "file_search", "vector_store_ids": [store]}]}
    counted = httpx.post(f"{ingress_urls[0]}/responses/input_tokens", json=body, timeout=120)
    assert counted.status_code == 200, counted.text
    response = httpx.post(f"{ingress_urls[1]}/responses", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert counted.json()["input_tokens"] == response.json()["usage"]["input_tokens"]

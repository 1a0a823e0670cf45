"""`EmbeddingServer`: the embedding model of vector stores (`vector_stores.embedding.type:
vllm`) on vLLM's pooling runner, a deployment of its own that every ingress replica reaches
through a handle (`HandleEmbedder`), as the engines are reached."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from ray.serve.handle import DeploymentHandle

from deployments import use_serve_logging
from serve_app.config import EmbeddingConfig
from serve_app.engines.embeddings import VllmEmbedder
from serve_app.retrieval.embeddings import EmbeddingUnavailable, Vectors

MAX_TEXTS_PER_CALL = 256  # a call's texts travel as one Ray object: a file's chunks are sent in batches of this


class EmbeddingServer:
    def __init__(self, config: dict[str, Any]) -> None:
        use_serve_logging()
        embedding = EmbeddingConfig.model_validate(config)
        assert embedding.model is not None  # the config requires it
        self.embedder = VllmEmbedder(
            embedding.model, dimensions=embedding.dimensions, max_model_len=embedding.max_model_len, dtype=embedding.dtype
        )
        self.embedder.start()

    async def embed(self, texts: list[str]) -> np.ndarray:
        return await self.embedder.embed(texts)

    def __del__(self) -> None:
        self.embedder.shutdown()


class HandleEmbedder:
    """retrieval's `Embedder` over the `EmbeddingServer` deployment."""

    def __init__(self, handle: DeploymentHandle[EmbeddingServer], model: str, dimensions: int) -> None:
        self.handle, self.model, self.dimensions = handle, model, dimensions

    async def embed(self, texts: Sequence[str]) -> Vectors:
        parts: list[np.ndarray] = []
        try:
            for first in range(0, len(texts), MAX_TEXTS_PER_CALL):
                part: np.ndarray = await self.handle.embed.remote(list(texts[first : first + MAX_TEXTS_PER_CALL]))
                parts.append(part)
        except EmbeddingUnavailable:
            raise
        except Exception as exc:  # the deployment is down or refused
            raise EmbeddingUnavailable(f"{type(exc).__name__}: {exc}") from exc
        if not parts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        vectors: Vectors = np.concatenate(parts).astype(np.float32)
        return vectors

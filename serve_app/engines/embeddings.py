"""Embeddings from a served model: vLLM's pooling runner (`runner="pooling"`, `convert="embed"`:
a causal LM such as SmolLM2 is pooled into one vector per text, as vLLM's own `/v1/embeddings`
does), behind retrieval's `Embedder` interface. A dedicated embedding model (the GPU
configs' choice) is loaded the same way.

Texts are truncated to the model's length (`truncate_prompt_tokens`); each text is one
engine request, all of a call's requests in flight together, so the engine batches them.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from serve_app.engines.allocator import drop_allocator_env
from serve_app.engines.owner import mark_owner
from serve_app.engines.vllm import DEFAULT_CPU_KVCACHE_SPACE_GIB
from serve_app.retrieval.embeddings import EmbeddingUnavailable, Vectors

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

_REQUESTS = itertools.count()


class VllmEmbedder:
    """`Embedder` of a model on vLLM's pooling runner, in this process (an embedding
    deployment's replica, or a test). `start()` loads it (seconds to minutes)."""

    def __init__(self, model: str, *, dimensions: int, max_model_len: int = 2048, dtype: str = "auto", device: str = "cpu") -> None:
        self.model, self.dimensions = model, dimensions
        self.max_model_len, self.dtype, self.device = max_model_len, dtype, device
        self.engine: AsyncLLM | None = None

    def start(self) -> None:
        if self.engine is not None:
            return
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_SPACE_GIB)
        drop_allocator_env()
        mark_owner()  # vLLM's processes end with this one (engines/owner.py)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from serve_app.families.smollm2 import resolve_model_path

        path = resolve_model_path(self.model)
        options: dict[str, Any] = {"model": path, "runner": "pooling", "convert": "embed", "max_model_len": self.max_model_len}
        args = AsyncEngineArgs(**options, dtype=self.dtype, enforce_eager=True)  # type: ignore[arg-type]  # the config's dtype, checked by vLLM
        self.engine = AsyncLLM.from_engine_args(args)
        hidden = int(self.engine.model_config.get_hidden_size())
        if hidden != self.dimensions:
            self.shutdown()
            raise ValueError(f"model {self.model!r} embeds into {hidden} dimensions, the config says {self.dimensions}")

    async def _one(self, engine: Any, text: str) -> np.ndarray:
        from vllm import PoolingParams

        final = None
        async for output in engine.encode(
            text,
            PoolingParams(task="embed"),
            request_id=f"embed-{os.getpid()}-{next(_REQUESTS)}",
            tokenization_kwargs={"truncation": True, "max_length": self.max_model_len},
        ):
            final = output
        if final is None:
            raise EmbeddingUnavailable("the engine returned nothing")
        vector = np.asarray(final.outputs.data, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm > 0 else vector

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if self.engine is None:
            raise EmbeddingUnavailable("the embedding model is not loaded")
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        try:
            vectors = await asyncio.gather(*(self._one(self.engine, text) for text in texts))
        except EmbeddingUnavailable:
            raise
        except Exception as exc:  # the engine died or refused: the caller reports it
            raise EmbeddingUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return np.stack(vectors)

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

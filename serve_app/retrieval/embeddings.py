"""Embedding models: what turns chunks and queries into vectors. One interface (`Embedder`);
the config names the model: the hashing model below (tests, the demo) or a served model on
vLLM's pooling runner (serve_app/engines/embeddings.py).

`HashingEmbedder` is not a language model and does not pretend to be: it hashes a text's
lower-cased words and their character trigrams into a fixed number of signed buckets
(the "hashing trick"), weighs them by log term frequency and normalises the vector. Texts
that share words, or parts of words (plurals, inflections, typos), are close; synonyms
are not. It is deterministic, needs no weights and runs anywhere, so retrieval is tested
end to end and the demo answers from documents on a machine without a model.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]  # (texts, dimensions), each row of unit length

_WORD = re.compile(r"\w+", re.UNICODE)
MAX_EMBED_CHARS = 32_000  # of one text: a chunk is at most 4096 tokens


class Embedder(Protocol):
    model: str
    dimensions: int

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """One unit vector per text. Raises `EmbeddingUnavailable` when the model cannot answer."""
        ...


class EmbeddingUnavailable(Exception):
    """The embedding model could not answer (the message says why)."""


def _features(text: str) -> Counter[str]:
    features: Counter[str] = Counter()
    for word in _WORD.findall(text.lower()[:MAX_EMBED_CHARS]):
        features["w:" + word] += 2
        padded = f"<{word}>"
        for i in range(len(padded) - 2):
            features["g:" + padded[i : i + 3]] += 1
    return features


def hashing_vector(text: str, dimensions: int) -> npt.NDArray[np.float32]:
    vector = np.zeros(dimensions, dtype=np.float32)
    for feature, count in _features(text).items():
        digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
        bucket = int.from_bytes(digest[:4], "little") % dimensions
        sign = 1.0 if digest[4] & 1 else -1.0
        vector[bucket] += sign * (1.0 + math.log(count))
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


class HashingEmbedder:
    """The deterministic hashing model (`model: hashing`): see the module's docstring."""

    def __init__(self, dimensions: int = 384) -> None:
        if dimensions < 8:
            raise ValueError("dimensions must be >= 8")
        self.model = f"hashing-{dimensions}"
        self.dimensions = dimensions

    def embed_now(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        return np.stack([hashing_vector(text, self.dimensions) for text in texts])

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """In a worker thread when there is more than a query: hashing a file's chunks takes milliseconds each."""
        if len(texts) <= 1:
            return self.embed_now(texts)
        return await asyncio.to_thread(self.embed_now, texts)

"""The index of vector stores' chunks, behind one interface (`VectorIndex`), with hybrid
retrieval: a semantic ranking (cosine similarity of embeddings) and a keyword ranking (BM25)
fused by reciprocal rank fusion.

`EmbeddedIndex`, the default: one index per vector store (a `namespace`: the tenant and the
store id) in a directory of its own under the configured root:
- `chunks.sqlite`: the chunks (file, text, attributes) and their vectors, the source of truth;
- `vectors-N.usearch`: the usearch HNSW index of version N, written atomically after a change
  (for a store of more than 2000 chunks, when it grew or shrank by a tenth since the last
  one; a process that finds no file of the current version builds it from the database);
- the BM25 index (bm25s) is built in memory from the chunks when first searched after a change.
Writes take an exclusive file lock, so several processes on one node (ingress replicas)
share a directory safely; each process notices another's change by the version and reloads.
A cluster whose replicas run on several nodes needs that directory on shared storage (a
ReadWriteMany volume), or a server index.

Hybrid retrieval (`Ranking`): each ranker proposes its best `candidates`; a chunk's fused
score is `(we / (60 + rank_e) + wt / (60 + rank_t)) / ((we + wt) / 61)`, in (0, 1], 1 for a
chunk first in both (OpenAI's `hybrid_search.embedding_weight` / `text_weight`; a weight of
0 turns a ranker off, and the score is then that ranker's own: the cosine similarity, or the
BM25 score over the best's). `score_threshold` drops results below it. Filters
(api/filters.py) apply before ranking: the semantic ranking is then exact over the
chunks they keep.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import re
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import bm25s
import numpy as np
from usearch.index import Index

from serve_app.api.errors import APIError, retry_after
from serve_app.api.filters import Filter
from serve_app.retrieval.embeddings import Vectors

RRF_K = 60
_WORD = re.compile(r"\w+", re.UNICODE)
# Words too common to tell chunks apart (a short English list: BM25's IDF does the rest).
_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "from",
        "has",
        "have",
        "he",
        "her",
        "his",
        "i",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "she",
        "that",
        "the",
        "their",
        "them",
        "they",
        "this",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    ]
)


def keywords(text: str) -> list[str]:
    """The words BM25 counts: lower-cased, without stop words."""
    return [word for word in _WORD.findall(text.lower()) if word not in _STOPWORDS]


@dataclass(frozen=True, slots=True)
class IndexedChunk:
    file_id: str
    filename: str
    chunk_index: int
    text: str
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Hit:
    file_id: str
    filename: str
    chunk_index: int
    text: str
    attributes: dict[str, Any]
    score: float


@dataclass(frozen=True, slots=True)
class Ranking:
    embedding_weight: float = 1.0
    text_weight: float = 1.0
    score_threshold: float = 0.0
    candidates: int = 100  # each ranker's best, fused

    def __post_init__(self) -> None:
        if self.embedding_weight < 0 or self.text_weight < 0 or self.embedding_weight + self.text_weight <= 0:
            raise ValueError("ranking weights are >= 0 and not both 0")


class IndexUnavailable(APIError):
    """The index did not answer in time, or could not be reached (a server index): a 503 with
    `Retry-After`, naming no address or detail of the server."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status_code=503, code="vector_index_unavailable", type="server_error")
        retry_after(self, 1)


class VectorIndex(Protocol):
    async def add(self, namespace: str, chunks: Sequence[IndexedChunk], vectors: Vectors) -> None:
        """Add a file's chunks (one vector per chunk); a file added again replaces its chunks."""
        ...

    async def remove_file(self, namespace: str, file_id: str) -> int:
        """Remove a file's chunks; how many there were."""
        ...

    async def set_attributes(self, namespace: str, file_id: str, attributes: dict[str, Any]) -> None: ...

    async def drop(self, namespace: str) -> None:
        """Remove the namespace's index and everything in it."""
        ...

    async def count(self, namespace: str) -> int: ...

    async def search(
        self, namespace: str, query: str, vector: Vectors, *, max_results: int, ranking: Ranking, filters: Filter | None = None
    ) -> list[Hit]:
        """The best chunks for the query (`vector`: its embedding, one row), best first."""
        ...

    async def aclose(self) -> None:
        """Let go of what the index holds on the running event loop (connections); it may be used again."""
        ...


def fuse(semantic: Sequence[tuple[int, float]], keyword: Sequence[tuple[int, float]], ranking: Ranking) -> list[tuple[int, float]]:
    """Reciprocal rank fusion of two rankings (best first) of (key, score): (key, fused score), best first."""
    we, wt = ranking.embedding_weight, ranking.text_weight
    if wt == 0:
        return [(key, max(0.0, min(1.0, score))) for key, score in semantic]
    if we == 0:
        best = keyword[0][1] if keyword else 1.0
        return [(key, score / best if best > 0 else 0.0) for key, score in keyword]
    fused: dict[int, float] = {}
    for rank, (key, _) in enumerate(semantic, 1):
        fused[key] = fused.get(key, 0.0) + we / (RRF_K + rank)
    for rank, (key, _) in enumerate(keyword, 1):
        fused[key] = fused.get(key, 0.0) + wt / (RRF_K + rank)
    top = (we + wt) / (RRF_K + 1)
    return sorted(((key, score / top) for key, score in fused.items()), key=lambda item: (-item[1], item[0]))


_SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    key INTEGER PRIMARY KEY, file_id TEXT NOT NULL, filename TEXT NOT NULL, chunk_index INTEGER NOT NULL,
    text TEXT NOT NULL, attributes TEXT NOT NULL, vector BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_file ON chunks (file_id);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('version', 0);
"""


class _Shard:
    """One namespace's index in this process: a copy of the directory's state at `version`."""

    def __init__(self, directory: Path, dimensions: int) -> None:
        self.directory = directory
        self.dimensions = dimensions
        self.lock = threading.Lock()
        self.version = -1
        self.keys = np.zeros(0, dtype=np.int64)
        self.vectors = np.zeros((0, dimensions), dtype=np.float32)
        self.rows: dict[int, tuple[str, str, int, str, dict[str, Any]]] = {}
        self.vector_index: Index | None = None
        self.bm25: bm25s.BM25 | None = None
        self._saved_rows = 0  # rows in the last vectors file written

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        self.directory.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.directory / "chunks.sqlite", timeout=30.0)
        try:
            db.executescript(_SCHEMA)
            yield db
        finally:
            db.close()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """An exclusive write across processes, on a copy brought up to date first; the caller
        applies its change to the database and to this copy (`_apply`), then the version goes
        up and the vectors are written under it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "lock", "a+") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            with self._db() as db:
                self._refresh(db)
                yield db
                db.execute("UPDATE meta SET value = value + 1 WHERE name = 'version'")
                db.commit()
                self.version = int(db.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()[0])
                self._save()

    def _save(self) -> None:
        """The vectors of this version, written whole when the store is small or has changed by
        a tenth since the last write; other processes build the rest from the database."""
        assert self.vector_index is not None
        if len(self.keys) > 2000 and abs(len(self.keys) - self._saved_rows) < max(1, len(self.keys) // 10):
            return
        path = self.directory / f"vectors-{self.version}.usearch"
        partial = path.with_suffix(".part")
        self.vector_index.save(str(partial))
        partial.replace(path)
        self._saved_rows = len(self.keys)
        for old in self.directory.glob("vectors-*.usearch"):
            if old != path:
                old.unlink(missing_ok=True)

    def _refresh(self, db: sqlite3.Connection) -> None:
        version = int(db.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()[0])
        if version == self.version:
            return
        rows = db.execute("SELECT key, file_id, filename, chunk_index, text, attributes, vector FROM chunks ORDER BY key").fetchall()
        self.keys = np.array([row[0] for row in rows], dtype=np.int64)
        self.vectors = (
            np.stack([np.frombuffer(row[6], dtype=np.float32) for row in rows])
            if rows
            else np.zeros((0, self.dimensions), dtype=np.float32)
        )
        self.rows = {row[0]: (row[1], row[2], row[3], row[4], json.loads(row[5])) for row in rows}
        path = self.directory / f"vectors-{version}.usearch"
        index: Index | None = None
        if path.exists():
            with contextlib.suppress(Exception):
                index = Index.restore(str(path))
        if index is None or len(index) != len(rows):
            index = Index(ndim=self.dimensions, metric="cos", dtype="f32")
            if rows:
                index.add(self.keys.astype(np.uint64), self.vectors)
        self.vector_index = index
        self.bm25 = None  # built when searched
        self.version = version

    def _apply(self, removed: Sequence[int], added: dict[int, tuple[str, str, int, str, dict[str, Any]]], vectors: np.ndarray) -> None:
        """This copy, changed as the database was: rows removed and added."""
        assert self.vector_index is not None
        if removed:
            gone = set(removed)
            keep = np.array([int(key) not in gone for key in self.keys], dtype=bool)
            self.keys, self.vectors = self.keys[keep], self.vectors[keep]
            for key in removed:
                self.rows.pop(key, None)
            self.vector_index.remove(np.array(removed, dtype=np.uint64))
        if added:
            new_keys = np.array(list(added), dtype=np.int64)
            self.keys = np.concatenate([self.keys, new_keys])
            self.vectors = np.concatenate([self.vectors, vectors.astype(np.float32)]) if len(self.vectors) else vectors.astype(np.float32)
            self.rows.update(added)
            self.vector_index.add(new_keys.astype(np.uint64), vectors.astype(np.float32))
        self.bm25 = None

    def refresh(self) -> None:
        with self._db() as db:
            self._refresh(db)

    def add(self, chunks: Sequence[IndexedChunk], vectors: Vectors) -> None:
        if vectors.shape != (len(chunks), self.dimensions):
            raise ValueError(f"{len(chunks)} chunks need {len(chunks)} vectors of {self.dimensions} dimensions, not {vectors.shape}")
        with self._writing() as db:
            removed: list[int] = []
            for file_id in {chunk.file_id for chunk in chunks}:
                removed += [row[0] for row in db.execute("SELECT key FROM chunks WHERE file_id = ?", (file_id,))]
                db.execute("DELETE FROM chunks WHERE file_id = ?", (file_id,))
            added: dict[int, tuple[str, str, int, str, dict[str, Any]]] = {}
            for chunk, vector in zip(chunks, vectors, strict=True):
                cursor = db.execute(
                    "INSERT INTO chunks (file_id, filename, chunk_index, text, attributes, vector) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        chunk.file_id,
                        chunk.filename,
                        chunk.chunk_index,
                        chunk.text,
                        json.dumps(chunk.attributes),
                        np.asarray(vector, dtype=np.float32).tobytes(),
                    ),
                )
                assert cursor.lastrowid is not None
                added[cursor.lastrowid] = (chunk.file_id, chunk.filename, chunk.chunk_index, chunk.text, dict(chunk.attributes))
            self._apply(removed, added, np.asarray(vectors, dtype=np.float32))

    def remove_file(self, file_id: str) -> int:
        with self._writing() as db:
            removed = [row[0] for row in db.execute("SELECT key FROM chunks WHERE file_id = ?", (file_id,))]
            db.execute("DELETE FROM chunks WHERE file_id = ?", (file_id,))
            self._apply(removed, {}, np.zeros((0, self.dimensions), dtype=np.float32))
            return len(removed)

    def set_attributes(self, file_id: str, attributes: dict[str, Any]) -> None:
        with self._writing() as db:
            db.execute("UPDATE chunks SET attributes = ? WHERE file_id = ?", (json.dumps(attributes), file_id))
            for key, row in self.rows.items():
                if row[0] == file_id:
                    self.rows[key] = (*row[:4], dict(attributes))

    def count(self) -> int:
        self.refresh()
        return len(self.rows)

    def search(self, query: str, vector: Vectors, max_results: int, ranking: Ranking, filters: Filter | None) -> list[Hit]:
        self.refresh()
        if not self.rows:
            return []
        allowed: np.ndarray | None = None
        if filters is not None:
            allowed = np.array([filters.matches(self.rows[int(key)][4]) for key in self.keys], dtype=bool)
            if not allowed.any():
                return []
        wanted = max(ranking.candidates, max_results)
        semantic = self._semantic(np.asarray(vector, dtype=np.float32).reshape(-1), wanted, allowed) if ranking.embedding_weight else []
        keyword = self._keyword(query, wanted, allowed) if ranking.text_weight else []
        hits: list[Hit] = []
        for key, score in fuse(semantic, keyword, ranking):
            if score < ranking.score_threshold or len(hits) == max_results:
                break
            file_id, filename, chunk_index, text, attributes = self.rows[key]
            hits.append(Hit(file_id, filename, chunk_index, text, attributes, round(score, 6)))
        return hits

    def _semantic(self, vector: np.ndarray, wanted: int, allowed: np.ndarray | None) -> list[tuple[int, float]]:
        if allowed is None and self.vector_index is not None and len(self.vector_index) > 0:
            matches = self.vector_index.search(vector, min(wanted, len(self.vector_index)))
            return [(int(key), 1.0 - float(distance)) for key, distance in zip(matches.keys, matches.distances, strict=True)]
        rows = np.flatnonzero(allowed) if allowed is not None else np.arange(len(self.keys))
        norms = np.linalg.norm(self.vectors[rows], axis=1) * (float(np.linalg.norm(vector)) or 1.0)
        scores = (self.vectors[rows] @ vector) / np.where(norms > 0, norms, 1.0)
        order = np.argsort(-scores, kind="stable")[:wanted]
        return [(int(self.keys[rows[i]]), float(scores[i])) for i in order]

    def _keyword(self, query: str, wanted: int, allowed: np.ndarray | None) -> list[tuple[int, float]]:
        words = keywords(query)
        if not words:
            return []
        if self.bm25 is None:
            self.bm25 = bm25s.BM25()
            self.bm25.index([keywords(self.rows[int(key)][3]) or [""] for key in self.keys], show_progress=False)
        k = min(wanted, len(self.keys))
        mask = allowed.astype(np.float32) if allowed is not None else None
        documents, scores = self.bm25.retrieve([words], k=k, show_progress=False, weight_mask=mask)
        return [(int(self.keys[int(d)]), float(s)) for d, s in zip(documents[0], scores[0], strict=True) if s > 0]


class EmbeddedIndex:
    """`VectorIndex` in a local directory (see the module's docstring); work runs in threads."""

    def __init__(self, directory: str | Path, dimensions: int, *, max_open: int = 64) -> None:
        self.directory = Path(directory)
        self.dimensions = dimensions
        self.max_open = max_open
        self._shards: OrderedDict[str, _Shard] = OrderedDict()
        self._guard = threading.Lock()

    def _path(self, namespace: str) -> Path:
        return self.directory / hashlib.sha256(namespace.encode()).hexdigest()[:32]

    def _shard(self, namespace: str) -> _Shard:
        with self._guard:
            shard = self._shards.get(namespace)
            if shard is None:
                shard = self._shards[namespace] = _Shard(self._path(namespace), self.dimensions)
                while len(self._shards) > self.max_open:
                    self._shards.popitem(last=False)
            self._shards.move_to_end(namespace)
            return shard

    async def _run(self, namespace: str, work: Any, *args: Any) -> Any:
        shard = self._shard(namespace)

        def locked() -> Any:
            with shard.lock:
                return work(shard, *args)

        return await asyncio.to_thread(locked)

    async def add(self, namespace: str, chunks: Sequence[IndexedChunk], vectors: Vectors) -> None:
        await self._run(namespace, _Shard.add, chunks, vectors)

    async def remove_file(self, namespace: str, file_id: str) -> int:
        return int(await self._run(namespace, _Shard.remove_file, file_id))

    async def set_attributes(self, namespace: str, file_id: str, attributes: dict[str, Any]) -> None:
        await self._run(namespace, _Shard.set_attributes, file_id, attributes)

    async def count(self, namespace: str) -> int:
        if not (self._path(namespace) / "chunks.sqlite").exists():
            return 0
        return int(await self._run(namespace, _Shard.count))

    async def search(
        self, namespace: str, query: str, vector: Vectors, *, max_results: int, ranking: Ranking, filters: Filter | None = None
    ) -> list[Hit]:
        if not (self._path(namespace) / "chunks.sqlite").exists():
            return []
        hits: list[Hit] = await self._run(namespace, _Shard.search, query, vector, max_results, ranking, filters)
        return hits

    async def aclose(self) -> None:
        """Nothing to let go: the files are opened per call."""

    async def drop(self, namespace: str) -> None:
        path = self._path(namespace)
        with self._guard:
            self._shards.pop(namespace, None)

        def remove() -> None:
            import shutil

            shutil.rmtree(path, ignore_errors=True)

        await asyncio.to_thread(remove)

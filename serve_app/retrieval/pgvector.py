"""`VectorIndex` on PostgreSQL with pgvector: the server index for clusters, which every
ingress replica on every node reaches (the embedded index needs one directory for all).

One table holds every store's chunks (`namespace`: the tenant and the store id), with an
HNSW index over the embeddings (cosine) and a GIN index over the words (`tsvector` of the
'simple' configuration: no stemming, as the embedded index's BM25). Search is the embedded
index's hybrid: a semantic ranking (pgvector's `<=>`), a keyword ranking (`ts_rank_cd` of the
query's words, any of them: PostgreSQL's full-text ranking stands in for BM25), fused by
reciprocal rank fusion (`index.fuse`); filters are translated into SQL on the `attributes`
JSONB with the semantics of api/filters.py. Every statement is parameterised."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg

from serve_app.api.filters import ComparisonFilter, CompoundFilter, Filter
from serve_app.retrieval.embeddings import Vectors
from serve_app.retrieval.index import Hit, IndexedChunk, Ranking, fuse, keywords

_ORDER_OPERATORS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


def filter_sql(node: Filter) -> tuple[str, list[Any]]:
    """A WHERE clause (and its parameters) equal to `node.matches(attributes)`."""
    if isinstance(node, CompoundFilter):
        parts = [filter_sql(child) for child in node.filters]
        joiner = " AND " if node.type == "and" else " OR "
        return "(" + joiner.join(sql for sql, _ in parts) + ")", [p for _, params in parts for p in params]
    assert isinstance(node, ComparisonFilter)
    key, value = node.key, node.value
    if node.type in ("in", "nin"):
        values = value if isinstance(value, list) else [value]
        options = " OR ".join(["attributes -> %s = %s::jsonb"] * len(values)) or "FALSE"
        params: list[Any] = [p for v in values for p in (key, json.dumps(v))]
        found = f"({options})"
        return (f"(attributes ? %s AND {found})" if node.type == "in" else f"(attributes ? %s AND NOT {found})"), [key, *params]
    if isinstance(value, list):
        return "FALSE", []
    if node.type == "eq":
        return "(attributes -> %s = %s::jsonb)", [key, json.dumps(value)]
    if node.type == "ne":
        return "(attributes ? %s AND attributes -> %s <> %s::jsonb)", [key, key, json.dumps(value)]
    if isinstance(value, bool):
        return "FALSE", []
    kind = "string" if isinstance(value, str) else "number"
    operator = _ORDER_OPERATORS[node.type]
    return f"(jsonb_typeof(attributes -> %s) = %s AND attributes -> %s {operator} %s::jsonb)", [key, kind, key, json.dumps(value)]


def _vector(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{float(x):.7g}" for x in np.asarray(vector, dtype=np.float32).reshape(-1)) + "]"


class PgVectorIndex:
    """`VectorIndex` in a PostgreSQL database with the pgvector extension (`url`: a libpq URL;
    `table`: the chunks' table, made at the first use)."""

    def __init__(
        self, url: str, dimensions: int, *, table: str = "vector_store_chunks", timeout_s: float = 30.0, password: str | None = None
    ) -> None:
        if not table.isidentifier():
            raise ValueError(f"not a table name: {table!r}")
        self.url, self.dimensions, self.table, self.timeout_s = url, dimensions, table, timeout_s
        self._password = password
        self._schema = asyncio.Lock()
        self._ready = False

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        connection = await psycopg.AsyncConnection.connect(
            self.url, connect_timeout=int(self.timeout_s), autocommit=False, password=self._password
        )
        await connection.execute(f"SET statement_timeout = {int(self.timeout_s * 1000)}")
        if not self._ready:
            async with self._schema:
                if not self._ready:
                    await self._make_schema(connection)
        return connection

    async def _make_schema(self, connection: psycopg.AsyncConnection[Any]) -> None:
        """The table and its indexes, once: concurrent makers (replicas) take turns."""
        t = self.table
        await connection.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (t,))
        await connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
        await connection.execute(
            f"CREATE TABLE IF NOT EXISTS {t} (key BIGSERIAL PRIMARY KEY, namespace TEXT NOT NULL, file_id TEXT NOT NULL, "
            f"filename TEXT NOT NULL, chunk_index INTEGER NOT NULL, text TEXT NOT NULL, attributes JSONB NOT NULL, "
            f"embedding vector({self.dimensions}) NOT NULL, words tsvector GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED)"
        )
        await connection.execute(f"CREATE INDEX IF NOT EXISTS {t}_file ON {t} (namespace, file_id)")
        await connection.execute(f"CREATE INDEX IF NOT EXISTS {t}_embedding ON {t} USING hnsw (embedding vector_cosine_ops)")
        await connection.execute(f"CREATE INDEX IF NOT EXISTS {t}_words ON {t} USING gin (words)")
        await connection.commit()
        self._ready = True

    async def add(self, namespace: str, chunks: Sequence[IndexedChunk], vectors: Vectors) -> None:
        if vectors.shape != (len(chunks), self.dimensions):
            raise ValueError(f"{len(chunks)} chunks need {len(chunks)} vectors of {self.dimensions} dimensions, not {vectors.shape}")
        async with await self._connect() as connection:
            for file_id in {chunk.file_id for chunk in chunks}:
                await connection.execute(f"DELETE FROM {self.table} WHERE namespace = %s AND file_id = %s", (namespace, file_id))
            async with connection.cursor() as cursor:
                await cursor.executemany(
                    f"INSERT INTO {self.table} (namespace, file_id, filename, chunk_index, text, attributes, embedding) "
                    "VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s::vector)",
                    [
                        (namespace, c.file_id, c.filename, c.chunk_index, c.text.replace("\x00", ""), json.dumps(c.attributes), _vector(v))
                        for c, v in zip(chunks, vectors, strict=True)
                    ],
                )
            await connection.commit()

    async def remove_file(self, namespace: str, file_id: str) -> int:
        async with await self._connect() as connection:
            cursor = await connection.execute(f"DELETE FROM {self.table} WHERE namespace = %s AND file_id = %s", (namespace, file_id))
            await connection.commit()
            return cursor.rowcount

    async def set_attributes(self, namespace: str, file_id: str, attributes: dict[str, Any]) -> None:
        async with await self._connect() as connection:
            await connection.execute(
                f"UPDATE {self.table} SET attributes = %s::jsonb WHERE namespace = %s AND file_id = %s",
                (json.dumps(attributes), namespace, file_id),
            )
            await connection.commit()

    async def drop(self, namespace: str) -> None:
        async with await self._connect() as connection:
            await connection.execute(f"DELETE FROM {self.table} WHERE namespace = %s", (namespace,))
            await connection.commit()

    async def count(self, namespace: str) -> int:
        async with await self._connect() as connection:
            row = await (await connection.execute(f"SELECT count(*) FROM {self.table} WHERE namespace = %s", (namespace,))).fetchone()
            return int(row[0]) if row else 0

    async def search(
        self, namespace: str, query: str, vector: Vectors, *, max_results: int, ranking: Ranking, filters: Filter | None = None
    ) -> list[Hit]:
        where, params = ("namespace = %s", [namespace])
        if filters is not None:
            clause, extra = filter_sql(filters)
            where, params = f"{where} AND {clause}", [*params, *extra]
        wanted = max(ranking.candidates, max_results)
        rows: dict[int, tuple[str, str, int, str, dict[str, Any]]] = {}
        semantic: list[tuple[int, float]] = []
        keyword: list[tuple[int, float]] = []
        columns = "key, file_id, filename, chunk_index, text, attributes"
        async with await self._connect() as connection:
            if ranking.embedding_weight:
                target = _vector(vector)
                result = await connection.execute(
                    f"SELECT {columns}, 1 - (embedding <=> %s::vector) FROM {self.table} WHERE {where} "
                    "ORDER BY embedding <=> %s::vector LIMIT %s",
                    [target, *params, target, wanted],
                )
                for key, *row, score in await result.fetchall():
                    rows[key] = (row[0], row[1], row[2], row[3], row[4])
                    semantic.append((key, float(score)))
            words = keywords(query)
            if ranking.text_weight and words:
                text_query = " or ".join(words)
                result = await connection.execute(
                    f"SELECT {columns}, ts_rank_cd(words, q) FROM {self.table}, websearch_to_tsquery('simple', %s) q "
                    f"WHERE {where} AND words @@ q ORDER BY 7 DESC, key LIMIT %s",
                    [text_query, *params, wanted],
                )
                for key, *row, score in await result.fetchall():
                    rows[key] = (row[0], row[1], row[2], row[3], row[4])
                    keyword.append((key, float(score)))
        hits: list[Hit] = []
        for key, score in fuse(semantic, keyword, ranking):
            if score < ranking.score_threshold or len(hits) == max_results:
                break
            file_id, filename, chunk_index, text, attributes = rows[key]
            hits.append(Hit(file_id, filename, chunk_index, text, attributes, round(score, 6)))
        return hits

"""`VectorIndex` on PostgreSQL with pgvector: the server index for clusters, which every
ingress replica on every node reaches (the embedded index needs one directory for all).

One table holds every store's chunks (`namespace`: the tenant and the store id), with an
HNSW index over the embeddings (cosine) and a GIN index over each chunk's words (`tsvector`
of the 'simple' configuration: no stemming, as the embedded index's BM25) together with a
term of its own namespace, so that a word is looked up in one store's chunks, not in every
tenant's. Search is the embedded index's hybrid, each half through its index and bounded:
- semantic: pgvector's `<=>` through the HNSW index (`hnsw.ef_search` raised to the
  candidates asked for: pgvector's default of 40 would cut them to 40);
- keywords: for each of the query's first `MAX_QUERY_WORDS` distinct words, at most
  `candidates` chunks that hold it, through the GIN index; a chunk's score is the sum of the
  IDF of the words whose candidates it is among (BM25 with term frequencies left out), the
  IDF from the word's count of chunks counted up to that bound — exact for the rare words
  that tell chunks apart, a floor for common ones, which are sampled rather than ranked;
fused by reciprocal rank fusion (`index.fuse`); the rows of the fused best are read last.
Filters are translated into SQL on the `attributes` JSONB with the semantics of
api/filters.py. Every statement is parameterised.

Connections come from a bounded pool per index (so per replica: `PoolLimits`); a wait for
one, a connection that fails and a statement past its timeout are `IndexUnavailable` (503
with Retry-After), never a hang. The pool belongs to the event loop that opened it: a call
on another loop (an app's next lifespan) opens a new one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout, TooManyRequests

from serve_app.api.filters import ComparisonFilter, CompoundFilter, Filter
from serve_app.retrieval.embeddings import Vectors
from serve_app.retrieval.index import Hit, IndexedChunk, IndexUnavailable, Ranking, fuse, keywords

logger = logging.getLogger(__name__)
_ORDER_OPERATORS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
MAX_QUERY_WORDS = 32  # distinct words of a query the keyword half looks up
MAX_EF_SEARCH = 1000  # pgvector's bound of hnsw.ef_search
# A chunk's words and its namespace's own term, `'ns ' || md5(namespace)` (no word of the
# 'simple' parser holds a space): the expression of the GIN index, which queries repeat.
_TERMS = "(words || array_to_tsvector(ARRAY['ns ' || md5(namespace)]))"
_NAMESPACE_TERM = "quote_literal('ns ' || md5(%s))::tsquery"


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


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """One index's connections (per replica): at least `min_size` kept open, at most
    `max_size`; a call waits at most `timeout_s` for one, and at most `max_waiting` calls
    wait (past it a call fails at once)."""

    min_size: int = 1
    max_size: int = 4
    timeout_s: float = 5.0
    max_waiting: int = 256

    def __post_init__(self) -> None:
        if not 0 <= self.min_size <= self.max_size or self.max_size < 1 or self.timeout_s <= 0 or self.max_waiting < 1:
            raise ValueError(f"not a pool's limits: {self}")


class PgVectorIndex:
    """`VectorIndex` in a PostgreSQL database with the pgvector extension (`url`: a libpq URL;
    `table`: the chunks' table, made at the first use; `timeout_s`: each statement's)."""

    def __init__(
        self,
        url: str,
        dimensions: int,
        *,
        table: str = "vector_store_chunks",
        timeout_s: float = 30.0,
        password: str | None = None,
        pool: PoolLimits | None = None,
    ) -> None:
        if not table.isidentifier():
            raise ValueError(f"not a table name: {table!r}")
        self.url, self.dimensions, self.table, self.timeout_s = url, dimensions, table, timeout_s
        self.pool_limits = pool or PoolLimits()
        self.application_name = f"responses-serve-{table}"  # what PostgreSQL shows of its connections (pg_stat_activity)
        self._password = password
        self._ready = False  # the table and its indexes are there
        self._pool: AsyncConnectionPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Task[None] | None = None
        self._closer: asyncio.Task[None] | None = None

    # -- connections --
    def _new_pool(self) -> AsyncConnectionPool:
        limits = self.pool_limits
        return AsyncConnectionPool(
            self.url,
            kwargs={
                "password": self._password,
                "connect_timeout": max(2, math.ceil(limits.timeout_s)),
                "options": f"-c statement_timeout={int(self.timeout_s * 1000)}",
                "application_name": self.application_name,
            },
            min_size=limits.min_size,
            max_size=limits.max_size,
            timeout=limits.timeout_s,
            max_waiting=limits.max_waiting,
            check=AsyncConnectionPool.check_connection,  # a connection PostgreSQL dropped is replaced, not handed out
            name=self.application_name,
            open=False,
        )

    async def _open(self, pool: AsyncConnectionPool) -> None:
        await pool.open(wait=False)
        if not self._ready:
            async with pool.connection() as connection:
                await self._make_schema(connection)

    async def _ready_pool(self) -> AsyncConnectionPool:
        """This loop's pool, open, with the table made: callers that come at once share one opening."""
        loop = asyncio.get_running_loop()
        if self._pool is None or self._loop is not loop:
            self._pool, self._loop, self._opening = self._new_pool(), loop, None
            self._closer = loop.create_task(_close_with_the_loop(self._pool))
        opening = self._opening
        if opening is None or (opening.done() and (opening.cancelled() or opening.exception() is not None)):
            opening = self._opening = loop.create_task(self._open(self._pool))
        await asyncio.shield(opening)
        return self._pool

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection in a transaction (committed when the block ends, rolled back if
        it raises); PostgreSQL out of reach, the pool exhausted or a statement timed out:
        `IndexUnavailable`."""
        limits = self.pool_limits
        try:
            pool = await self._ready_pool()
            async with pool.connection() as connection:
                yield connection
        except TooManyRequests:
            raise IndexUnavailable(
                f"This server is waiting for the vector index on more than {limits.max_waiting} calls; retry later."
            ) from None
        except PoolTimeout:
            raise IndexUnavailable(
                f"No connection to the vector index within {limits.timeout_s:g} s "
                f"(all {limits.max_size} of this server's were busy, or PostgreSQL did not answer); retry later."
            ) from None
        except psycopg.errors.QueryCanceled:
            raise IndexUnavailable(f"The vector index took more than {self.timeout_s:g} s to answer; retry later.") from None
        except psycopg.OperationalError as exc:  # the reason for the operator, not for the client
            logger.warning("pgvector index %s: %s", self.table, exc)
            raise IndexUnavailable("The vector index (PostgreSQL) could not be reached; retry later.") from None

    def pool_stats(self) -> dict[str, int]:
        """The pool's counters (psycopg_pool's `get_stats`: requests_num, requests_queued,
        requests_waiting, connections_num, pool_size, ...); empty before the first call."""
        return self._pool.get_stats() if self._pool is not None else {}

    async def aclose(self) -> None:
        """Close this loop's pool (its connections); a later call opens a new one."""
        pool, closer, self._pool, self._opening, self._closer = self._pool, self._closer, None, None, None
        if pool is not None and self._loop is asyncio.get_running_loop():
            await pool.close()
            if closer is not None:
                closer.cancel()

    async def _make_schema(self, connection: psycopg.AsyncConnection[Any]) -> None:
        """The table and its indexes, once: concurrent makers (replicas) take turns. A table
        made before the keyword index held the namespace gets the new GIN index (built once,
        while writes to the table wait) and loses the old one."""
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
        # A small pending list: a search scans all of it, and ingestion flushes it often.
        await connection.execute(f"CREATE INDEX IF NOT EXISTS {t}_terms ON {t} USING gin ({_TERMS}) WITH (gin_pending_list_limit = 256)")
        await connection.execute(f"DROP INDEX IF EXISTS {t}_words")
        await connection.commit()
        self._ready = True

    # -- writes --
    async def add(self, namespace: str, chunks: Sequence[IndexedChunk], vectors: Vectors) -> None:
        if vectors.shape != (len(chunks), self.dimensions):
            raise ValueError(f"{len(chunks)} chunks need {len(chunks)} vectors of {self.dimensions} dimensions, not {vectors.shape}")
        async with self._connection() as connection:
            for file_id in {chunk.file_id for chunk in chunks}:
                await connection.execute(f"DELETE FROM {self.table} WHERE namespace = %s AND file_id = %s", (namespace, file_id))
            async with connection.cursor() as cursor:  # one pipeline: PostgreSQL's HNSW inserts are the time
                await cursor.executemany(
                    f"INSERT INTO {self.table} (namespace, file_id, filename, chunk_index, text, attributes, embedding) "
                    "VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s::vector)",
                    [
                        (namespace, c.file_id, c.filename, c.chunk_index, c.text.replace("\x00", ""), json.dumps(c.attributes), _vector(v))
                        for c, v in zip(chunks, vectors, strict=True)
                    ],
                )

    async def remove_file(self, namespace: str, file_id: str) -> int:
        async with self._connection() as connection:
            cursor = await connection.execute(f"DELETE FROM {self.table} WHERE namespace = %s AND file_id = %s", (namespace, file_id))
            return cursor.rowcount

    async def set_attributes(self, namespace: str, file_id: str, attributes: dict[str, Any]) -> None:
        async with self._connection() as connection:
            await connection.execute(
                f"UPDATE {self.table} SET attributes = %s::jsonb WHERE namespace = %s AND file_id = %s",
                (json.dumps(attributes), namespace, file_id),
            )

    async def drop(self, namespace: str) -> None:
        async with self._connection() as connection:
            await connection.execute(f"DELETE FROM {self.table} WHERE namespace = %s", (namespace,))

    async def count(self, namespace: str) -> int:
        async with self._connection() as connection:
            row = await (await connection.execute(f"SELECT count(*) FROM {self.table} WHERE namespace = %s", (namespace,))).fetchone()
            return int(row[0]) if row else 0

    # -- search --
    def semantic_statement(self, namespace: str, vector: Vectors, wanted: int, filters: Filter | None) -> tuple[str, list[Any]]:
        """The semantic half: (key, cosine similarity) of the `wanted` nearest, through the HNSW index."""
        where, params = _where(namespace, filters)
        target = _vector(vector)
        return (
            f"SELECT key, 1 - (embedding <=> %s::vector) FROM {self.table} WHERE {where} ORDER BY embedding <=> %s::vector LIMIT %s",
            [target, *params, target, wanted],
        )

    def keyword_statement(self, namespace: str, words: Sequence[str], wanted: int, filters: Filter | None) -> tuple[str, list[Any]]:
        """The keyword half: (key, score) of the best `wanted`, from at most `wanted` chunks per
        word through the GIN index (see the module's docstring). The store is the index's own
        term, so no other index serves the lookup: run it with sequential scans off (`search`),
        which PostgreSQL's planner prefers for a table of a few thousand rows, reading every row
        for a rare word."""
        clause, params = filter_sql(filters) if filters is not None else ("TRUE", [])
        return (
            "WITH q AS (SELECT n, tq FROM unnest(%s::text[]) WITH ORDINALITY AS u(w, n), plainto_tsquery('simple', w) AS tq "
            "WHERE numnode(tq) > 0), "
            "hits AS MATERIALIZED (SELECT q.n, c.key FROM q CROSS JOIN LATERAL "
            f"(SELECT key, namespace FROM {self.table} WHERE {_TERMS} @@ (q.tq && {_NAMESPACE_TERM}) AND {clause} LIMIT %s) c "
            "WHERE c.namespace = %s), "
            "weights AS (SELECT n, ln(1 + %s::float8 / count(*)) AS idf FROM hits GROUP BY n) "
            "SELECT key, sum(idf) AS score FROM hits JOIN weights USING (n) GROUP BY key ORDER BY score DESC, key LIMIT %s",
            [list(words), namespace, *params, wanted, namespace, wanted, wanted],
        )

    async def search(
        self, namespace: str, query: str, vector: Vectors, *, max_results: int, ranking: Ranking, filters: Filter | None = None
    ) -> list[Hit]:
        wanted = max(ranking.candidates, max_results)
        words = list(dict.fromkeys(keywords(query)))[:MAX_QUERY_WORDS]
        semantic: list[tuple[int, float]] = []
        keyword: list[tuple[int, float]] = []
        async with self._connection() as connection:
            if ranking.embedding_weight:
                # The HNSW scan returns at most ef_search rows (pgvector's default: 40).
                await connection.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(min(MAX_EF_SEARCH, max(40, wanted))),))
                result = await connection.execute(*self.semantic_statement(namespace, vector, wanted, filters))
                semantic = [(key, float(score)) for key, score in await result.fetchall()]
            if ranking.text_weight and words:
                await connection.execute("SELECT set_config('enable_seqscan', 'off', true)")  # the GIN index, however small the table
                result = await connection.execute(*self.keyword_statement(namespace, words, wanted, filters))
                keyword = [(key, float(score)) for key, score in await result.fetchall()]
            best: list[tuple[int, float]] = []
            for key, score in fuse(semantic, keyword, ranking):
                if score < ranking.score_threshold or len(best) == max_results:
                    break
                best.append((key, score))
            if not best:
                return []
            result = await connection.execute(
                f"SELECT key, file_id, filename, chunk_index, text, attributes FROM {self.table} WHERE namespace = %s AND key = ANY(%s)",
                (namespace, [key for key, _ in best]),
            )
            rows = {row[0]: row[1:] for row in await result.fetchall()}
        hits: list[Hit] = []
        for key, score in best:
            if key in rows:  # else removed meanwhile
                file_id, filename, chunk_index, text, attributes = rows[key]
                hits.append(Hit(file_id, filename, chunk_index, text, attributes, round(score, 6)))
        return hits


async def _close_with_the_loop(pool: AsyncConnectionPool) -> None:
    """Wait until cancelled, then close `pool`: a loop that ends with the pool open (its app
    never ran `aclose`) cancels every task, and a pool worker cancelled in the middle of its
    work swallows that and waits for more; closing the pool ends it, so the loop's end does
    not wait forever."""
    try:
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await pool.close(timeout=1.0)


def _where(namespace: str, filters: Filter | None) -> tuple[str, list[Any]]:
    if filters is None:
        return "namespace = %s", [namespace]
    clause, params = filter_sql(filters)
    return f"namespace = %s AND {clause}", [namespace, *params]

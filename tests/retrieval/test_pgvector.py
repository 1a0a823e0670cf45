"""The pgvector index against a real PostgreSQL (the `pgserver` wheel's): its bounded
connection pool (more searches than connections are served, an exhausted pool or an
unreachable server is a 503 within the wait), each half of a search through its index
(`EXPLAIN`) and bounded, the keyword half's ranking, and a table of the earlier schema
migrated at first use."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from serve_app.retrieval.embeddings import HashingEmbedder
from serve_app.retrieval.index import IndexedChunk, IndexUnavailable, Ranking
from serve_app.retrieval.pgvector import PgVectorIndex, PoolLimits
from tests.support.postgres_server import postgres

EMBEDDER = HashingEmbedder(32)
NS = "team-a/vs_1"
ZEBRA = "The zebra migration crosses the Mara river in July."


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with postgres() as url:
        yield url


_TABLES = iter(range(1_000_000))


def _index(url: str, **kwargs: Any) -> PgVectorIndex:
    return PgVectorIndex(url, EMBEDDER.dimensions, table=f"pool_{next(_TABLES)}", **kwargs)


async def _add(index: PgVectorIndex, texts: list[str], file_id: str = "file-a", namespace: str = NS) -> None:
    chunks = [IndexedChunk(file_id, f"{file_id}.txt", i, text) for i, text in enumerate(texts)]
    await index.add(namespace, chunks, EMBEDDER.embed_now(texts))


async def _search(index: PgVectorIndex, query: str, namespace: str = NS, **kwargs: Any) -> list:
    ranking = kwargs.pop("ranking", Ranking())
    return await index.search(namespace, query, EMBEDDER.embed_now([query]), max_results=kwargs.pop("k", 3), ranking=ranking, **kwargs)


async def _connections(url: str, index: PgVectorIndex) -> int:
    """Connections the server holds for `index`'s pool (by their application_name)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
        result = await connection.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (index.application_name,))
        row = await result.fetchone()
        assert row is not None
        return int(row[0])


# -- the pool --------------------------------------------------------------------------------


def test_a_pool_of_two_serves_ten_concurrent_searches(pg_url: str) -> None:
    index = _index(pg_url, pool=PoolLimits(min_size=1, max_size=2, timeout_s=60))

    async def main() -> None:
        await _add(index, [ZEBRA, "Quarterly revenue grew by twelve percent."])
        results = await asyncio.gather(*(_search(index, "zebra river", k=1) for _ in range(10)))
        assert [hits[0].text for hits in results] == [ZEBRA] * 10
        stats = index.pool_stats()
        assert stats["requests_num"] >= 11  # the add and every search took a connection of the pool
        assert stats["requests_queued"] >= 8  # at most 2 at a time: the others waited for one
        assert stats["connections_num"] <= 2
        assert await _connections(pg_url, index) <= 2
        await index.aclose()
        assert await _connections(pg_url, index) == 0

    asyncio.run(main())


async def _holding(index: PgVectorIndex, release: asyncio.Event) -> asyncio.Task[None]:
    """A task holding one of the pool's connections until `release` is set (a long call)."""
    held = asyncio.Event()

    async def hold() -> None:
        async with index._connection():
            held.set()
            await release.wait()

    holder = asyncio.create_task(hold())
    await held.wait()
    return holder


def test_an_exhausted_pool_is_a_503_after_its_timeout_then_serves_again(pg_url: str) -> None:
    index = _index(pg_url, pool=PoolLimits(min_size=0, max_size=1, timeout_s=0.2))

    async def main() -> None:
        await _add(index, [ZEBRA])
        release = asyncio.Event()
        holder = await _holding(index, release)
        with pytest.raises(IndexUnavailable) as waited:
            await _search(index, "zebra")
        error = waited.value
        assert (error.status_code, error.code, error.type) == (503, "vector_index_unavailable", "server_error")
        assert error.headers["retry-after"] == "1"
        assert "within 0.2 s" in error.message
        assert "all 1 of this server's were busy" in error.message
        assert pg_url not in error.message
        release.set()
        await holder
        assert [hit.text for hit in await _search(index, "zebra")] == [ZEBRA]
        await index.aclose()

    asyncio.run(main())


def test_calls_past_the_waiting_bound_are_a_503_at_once(pg_url: str) -> None:
    index = _index(pg_url, pool=PoolLimits(min_size=0, max_size=1, timeout_s=60, max_waiting=1))

    async def main() -> None:
        await _add(index, [ZEBRA])
        release = asyncio.Event()
        holder = await _holding(index, release)
        waiter = asyncio.create_task(_search(index, "zebra"))  # the one call allowed to wait
        while index.pool_stats().get("requests_waiting", 0) < 1:
            await asyncio.sleep(0.01)
        with pytest.raises(IndexUnavailable, match="more than 1 calls") as refused:  # one more: refused, not queued
            await _search(index, "zebra")
        assert refused.value.status_code == 503
        release.set()
        await holder
        assert [hit.text for hit in await waiter] == [ZEBRA]
        await index.aclose()

    asyncio.run(main())


def test_an_unreachable_server_is_a_503_within_the_wait(tmp_path) -> None:
    url = f"postgresql://vectors@/vectors?host={tmp_path}"  # a socket directory where no server listens
    index = PgVectorIndex(url, EMBEDDER.dimensions, pool=PoolLimits(min_size=0, max_size=2, timeout_s=0.3))

    async def main() -> None:
        for call in (_search(index, "zebra"), index.count(NS), index.remove_file(NS, "file-a")):
            with pytest.raises(IndexUnavailable) as failed:
                await call
            assert failed.value.status_code == 503
            assert str(tmp_path) not in failed.value.message
        await index.aclose()

    asyncio.run(main())


def test_a_statement_past_its_timeout_is_a_503(pg_url: str) -> None:
    index = _index(pg_url, timeout_s=0.2)

    async def main() -> None:
        await _add(index, [ZEBRA])
        with pytest.raises(IndexUnavailable, match=r"more than 0\.2 s"):
            async with index._connection() as connection:
                await connection.execute("SELECT pg_sleep(5)")
        assert [hit.text for hit in await _search(index, "zebra")] == [ZEBRA]  # the connection was given back, usable
        await index.aclose()

    asyncio.run(main())


def test_the_pool_follows_the_event_loop(pg_url: str) -> None:
    """An app's next lifespan runs on a new loop: the index opens a pool there."""
    index = _index(pg_url)
    asyncio.run(_add(index, [ZEBRA]))
    assert [hit.text for hit in asyncio.run(_search(index, "zebra"))] == [ZEBRA]

    async def close() -> None:
        await _search(index, "zebra")
        await index.aclose()

    asyncio.run(close())


# -- each half through its index, bounded ------------------------------------------------------


def _words(number: int) -> str:
    """Chunk `number`'s text: the word `common` in every chunk, `often` in every third, a word of
    its own, and `twin` in chunks 500 and 501."""
    twin = "twin" if number in (500, 501) else "single"
    return " ".join(["common", "often" if number % 3 == 0 else "seldom", f"own{number}", twin, "filler text about nothing"])


@pytest.fixture(scope="module")
def filled(pg_url: str) -> Iterator[PgVectorIndex]:
    """An index of 800 chunks in one store (a few in another), analysed: enough for PostgreSQL's
    planner to choose the HNSW index over a sort of every row."""
    index = _index(pg_url)

    async def fill() -> None:
        texts = [_words(n) for n in range(800)]
        for first in range(0, len(texts), 200):
            await _add(index, texts[first : first + 200], file_id=f"file-{first}")
        await _add(index, ["quartz rare"], file_id="file-other", namespace="team-b/vs_2")
        async with index._connection() as connection:
            await connection.execute(f"ANALYZE {index.table}")
        await index.aclose()

    asyncio.run(fill())
    return index


async def _plan(index: PgVectorIndex, statement: tuple[str, list[Any]], *, analyze: bool = False, seqscan: bool = True) -> dict[str, Any]:
    """PostgreSQL's plan of `statement` (`seqscan`: off, as `search` runs the keyword half)."""
    sql, params = statement
    options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
    async with index._connection() as connection:
        if not seqscan:
            await connection.execute("SET LOCAL enable_seqscan = off")
        result = await connection.execute(f"EXPLAIN ({options}) {sql}", params)
        row = await result.fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return plan[0]["Plan"]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_the_semantic_half_goes_through_the_hnsw_index(filled: PgVectorIndex) -> None:
    vector = EMBEDDER.embed_now(["own7 common"])
    plan = asyncio.run(_plan(filled, filled.semantic_statement(NS, vector, 100, None)))
    scans = [node for node in _nodes(plan) if node.get("Relation Name") == filled.table]
    assert [(node["Node Type"], node.get("Index Name")) for node in scans] == [("Index Scan", f"{filled.table}_embedding")]


def test_the_keyword_half_goes_through_the_gin_index_and_reads_at_most_its_bound_per_word(filled: PgVectorIndex) -> None:
    statement = filled.keyword_statement(NS, ["common", "often", "own7"], 50, None)
    plan = asyncio.run(_plan(filled, statement, analyze=True, seqscan=False))
    nodes = list(_nodes(plan))
    assert not [node for node in nodes if node["Node Type"] == "Seq Scan"], nodes
    (index_scan,) = [node for node in nodes if node["Node Type"] == "Bitmap Index Scan"]
    assert index_scan["Index Name"] == f"{filled.table}_terms"
    (heap,) = [node for node in nodes if node["Node Type"] == "Bitmap Heap Scan"]
    assert heap["Actual Loops"] == 3  # once per word
    assert heap["Actual Rows"] <= 50  # per loop: `common` is in all 800 chunks, `often` in 267, yet at most 50 each are read


def test_a_rare_word_outranks_common_ones_and_stores_stay_apart(filled: PgVectorIndex) -> None:
    keywords_only = Ranking(embedding_weight=0.0)

    async def main() -> None:
        (first, second, *rest) = await _search(filled, "common twin own500", k=10, ranking=keywords_only)
        assert (first.text, second.text) == (_words(500), _words(501))  # two rare words, then one
        assert first.score == 1.0 > second.score > rest[0].score
        assert len(rest) == 8
        assert all("common" in hit.text for hit in rest)
        assert await _search(filled, "rare", ranking=keywords_only) == []  # only team-b's store holds it
        assert [hit.text for hit in await _search(filled, "rare", namespace="team-b/vs_2", ranking=keywords_only)] == ["quartz rare"]
        assert await _search(filled, "___ the and", ranking=keywords_only) == []  # no word to look up
        await filled.aclose()

    asyncio.run(main())


def test_a_semantic_search_returns_every_candidate_it_asks_for(filled: PgVectorIndex) -> None:
    """pgvector's HNSW scan stops at `hnsw.ef_search` rows (40 by default): the index raises it
    to the candidates asked for."""

    async def main() -> list:
        hits = await _search(filled, "own7 common", k=50, ranking=Ranking(text_weight=0.0, candidates=50))
        await filled.aclose()
        return hits

    assert len(asyncio.run(main())) == 50


# -- migration ---------------------------------------------------------------------------------

_EARLIER_SCHEMA = [  # the table as the index made it before the keyword index held the namespace
    "CREATE EXTENSION IF NOT EXISTS vector",
    "CREATE TABLE {t} (key BIGSERIAL PRIMARY KEY, namespace TEXT NOT NULL, file_id TEXT NOT NULL, filename TEXT NOT NULL, "
    "chunk_index INTEGER NOT NULL, text TEXT NOT NULL, attributes JSONB NOT NULL, embedding vector({d}) NOT NULL, "
    "words tsvector GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED)",
    "CREATE INDEX {t}_file ON {t} (namespace, file_id)",
    "CREATE INDEX {t}_embedding ON {t} USING hnsw (embedding vector_cosine_ops)",
    "CREATE INDEX {t}_words ON {t} USING gin (words)",
]


def test_a_table_of_the_earlier_schema_is_migrated_at_first_use(pg_url: str) -> None:
    table = f"earlier_{next(_TABLES)}"
    with psycopg.connect(pg_url) as connection:
        for statement in _EARLIER_SCHEMA:
            connection.execute(statement.format(t=table, d=EMBEDDER.dimensions))
        connection.execute(
            f"INSERT INTO {table} (namespace, file_id, filename, chunk_index, text, attributes, embedding) "
            "VALUES (%s, 'file-a', 'a.txt', 0, %s, '{}', %s::vector)",
            (NS, ZEBRA, "[" + ",".join(str(float(x)) for x in EMBEDDER.embed_now([ZEBRA])[0]) + "]"),
        )
    index = PgVectorIndex(pg_url, EMBEDDER.dimensions, table=table)

    async def main() -> list:
        hits = await _search(index, "zebra", ranking=Ranking(embedding_weight=0.0))
        await index.aclose()
        return hits

    assert [hit.text for hit in asyncio.run(main())] == [ZEBRA]
    with psycopg.connect(pg_url) as connection:
        names = {row[0] for row in connection.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", (table,))}
    assert names == {f"{table}_pkey", f"{table}_file", f"{table}_embedding", f"{table}_terms"}


# -- config --------------------------------------------------------------------------------------


def test_the_config_sizes_the_pool() -> None:
    from serve_app.config import VectorStoresConfig
    from serve_app.runtime.vector_stores import vector_store_service

    config = VectorStoresConfig(
        index="pgvector",
        url="postgresql://vectors@postgres:5432/vectors",
        pool_min_size=2,
        pool_max_size=6,
        pool_timeout_s=1.5,
        pool_max_waiting=9,
        statement_timeout_s=12,
    )
    index = vector_store_service(config).index
    assert isinstance(index, PgVectorIndex)
    assert index.pool_limits == PoolLimits(min_size=2, max_size=6, timeout_s=1.5, max_waiting=9)
    assert index.timeout_s == 12
    with pytest.raises(ValueError, match="pool_min_size must be at most pool_max_size"):
        VectorStoresConfig(index="pgvector", url="postgresql://vectors@postgres/vectors", pool_min_size=5, pool_max_size=4)

"""The index behind its one interface, on both backends: the embedded one (usearch + bm25s in a
directory) and the server one (PostgreSQL with pgvector): add, search, filters, removal,
persistence, two instances on one directory or database; fusion of rankings."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.api.filters import ComparisonFilter, CompoundFilter
from serve_app.retrieval.embeddings import HashingEmbedder
from serve_app.retrieval.index import EmbeddedIndex, IndexedChunk, Ranking, VectorIndex, fuse
from tests.support.postgres_server import postgres

EMBEDDER = HashingEmbedder(128)
DOCS = {
    "file-a": ["The zebra migration crosses the Mara river in July.", "Lions hunt at dusk near the river."],
    "file-b": ["Quarterly revenue grew by twelve percent.", "The board approved the new budget for marketing."],
    "file-c": ["Kubernetes pods restart when the liveness probe fails.", "A deployment scales replicas horizontally."],
}
ATTRS = {
    "file-a": {"topic": "nature", "year": 2021},
    "file-b": {"topic": "finance", "year": 2023},
    "file-c": {"topic": "tech", "year": 2024},
}


@pytest.fixture(scope="module")
def pg_url():
    with postgres() as url:
        yield url


_TABLES = iter(range(1_000_000))


class Maker:
    """Instances of one index (`make()`), each closed by `run` when the test's loop ends (a
    pgvector index's connection pool must be closed on its own loop)."""

    def __init__(self, make: Callable[[], VectorIndex]) -> None:
        self.make, self.made = make, []

    def __call__(self) -> Any:
        index = self.make()
        self.made.append(index)
        return index

    def run(self, main: Callable[[], Awaitable[None]]) -> None:
        async def closing() -> None:
            try:
                await main()
            finally:
                for index in self.made:
                    await index.aclose()

        asyncio.run(closing())


@pytest.fixture(params=["embedded", "pgvector"])
def make_index(request, tmp_path: Path) -> Maker:
    """A maker of instances of one fresh index (the same directory or table each time)."""
    if request.param == "embedded":
        return Maker(lambda: EmbeddedIndex(tmp_path, EMBEDDER.dimensions))
    from serve_app.retrieval.pgvector import PgVectorIndex

    url, table = request.getfixturevalue("pg_url"), f"chunks_{next(_TABLES)}"
    return Maker(lambda: PgVectorIndex(url, EMBEDDER.dimensions, table=table))


async def _fill(index, ns: str = "t/vs_1") -> None:
    for file_id, texts in DOCS.items():
        chunks = [IndexedChunk(file_id, f"{file_id}.txt", i, text, ATTRS[file_id]) for i, text in enumerate(texts)]
        await index.add(ns, chunks, EMBEDDER.embed_now(texts))


async def _search(index, query: str, ns: str = "t/vs_1", **kw) -> list:
    ranking = kw.pop("ranking", Ranking())
    return await index.search(ns, query, EMBEDDER.embed_now([query]), max_results=kw.pop("k", 3), ranking=ranking, **kw)


def test_hybrid_search_finds_the_chunk_and_filters_apply(make_index) -> None:
    async def main() -> None:
        index = make_index()
        await _fill(index)
        assert await index.count("t/vs_1") == 6
        hits = await _search(index, "when do zebras cross the river?")
        assert hits[0].file_id == "file-a"
        assert "zebra" in hits[0].text
        assert 0 < hits[-1].score <= hits[0].score <= 1
        only_tech = await _search(index, "river", filters=ComparisonFilter(key="topic", type="eq", value="tech"))
        assert {h.file_id for h in only_tech} == {"file-c"}
        newer = CompoundFilter(
            type="and",
            filters=[ComparisonFilter(key="year", type="gte", value=2023), ComparisonFilter(key="topic", type="ne", value="tech")],
        )
        assert {h.file_id for h in await _search(index, "budget revenue", k=10, filters=newer)} == {"file-b"}
        assert await _search(index, "river", filters=ComparisonFilter(key="missing", type="eq", value="x")) == []
        high = await _search(index, "zebra", ranking=Ranking(score_threshold=0.99))
        assert all(h.score >= 0.99 for h in high)

    make_index.run(main)


def test_removal_drop_and_a_second_instance_on_the_same_index(make_index) -> None:
    async def main() -> None:
        writer, reader = make_index(), make_index()
        await _fill(writer)
        assert (await _search(reader, "zebra migration"))[0].file_id == "file-a"  # another process's instance sees it
        assert await writer.remove_file("t/vs_1", "file-a") == 2
        assert all(h.file_id != "file-a" for h in await _search(reader, "zebra migration", k=10))
        await writer.set_attributes("t/vs_1", "file-b", {"topic": "money"})
        hits = await _search(reader, "revenue", filters=ComparisonFilter(key="topic", type="eq", value="money"))
        assert {h.file_id for h in hits} == {"file-b"}
        assert await reader.count("t/vs_2") == 0
        assert await _search(reader, "revenue", ns="t/vs_2") == []
        await writer.drop("t/vs_1")
        assert await make_index().count("t/vs_1") == 0

    make_index.run(main)


def test_re_adding_a_file_replaces_its_chunks(make_index) -> None:
    async def main() -> None:
        index = make_index()
        await _fill(index)
        await index.add("t/vs_1", [IndexedChunk("file-a", "a.txt", 0, "only one chunk now")], EMBEDDER.embed_now(["only one chunk now"]))
        assert await index.count("t/vs_1") == 5

    make_index.run(main)


def test_vectors_of_the_wrong_shape_are_refused(make_index) -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="vectors"):
            await make_index().add("t/vs_1", [IndexedChunk("f", "f", 0, "x")], HashingEmbedder(64).embed_now(["x"]))

    make_index.run(main)


_RANKING = st.lists(st.integers(0, 30), unique=True, max_size=20)


@given(semantic=_RANKING, keyword=_RANKING)
def test_fusion_scores_are_in_0_1_and_order_by_rank(semantic: list[int], keyword: list[int]) -> None:
    fused = fuse([(k, 0.5) for k in semantic], [(k, 3.0) for k in keyword], Ranking())
    assert {k for k, _ in fused} == set(semantic) | set(keyword)
    assert all(0 < s <= 1 for _, s in fused)
    assert [s for _, s in fused] == sorted((s for _, s in fused), reverse=True)
    if semantic and keyword and semantic[0] == keyword[0]:
        assert fused[0] == (semantic[0], 1.0)


def test_filters_follow_openai_semantics() -> None:
    attrs = {"a": "x", "n": 3, "b": True}
    assert ComparisonFilter(key="n", type="in", value=[1, 3]).matches(attrs)
    assert ComparisonFilter(key="a", type="nin", value=["y"]).matches(attrs)
    assert not ComparisonFilter(key="a", type="gt", value=2).matches(attrs)  # a string against a number
    assert ComparisonFilter(key="b", type="eq", value=True).matches(attrs)
    assert not ComparisonFilter(key="n", type="eq", value=True).matches({"n": 1})  # 1 is not True
    assert CompoundFilter(
        type="or", filters=[ComparisonFilter(key="z", type="eq", value=1), ComparisonFilter(key="n", type="lte", value=3)]
    ).matches(attrs)


_ATTRIBUTES = st.fixed_dictionaries(
    {},
    optional={
        "s": st.sampled_from(["a", "b", "ab"]),
        "n": st.sampled_from([0, 1, 1.5, 2]),
        "b": st.booleans(),
    },
)
_VALUES = st.sampled_from(["a", "b", 0, 1, 1.5, True, False])
_COMPARISONS = st.builds(
    ComparisonFilter,
    key=st.sampled_from(["s", "n", "b", "z"]),
    type=st.sampled_from(["eq", "ne", "gt", "gte", "lt", "lte", "in", "nin"]),
    value=st.one_of(_VALUES, st.lists(st.sampled_from(["a", "b", 0, 1, 1.5]), min_size=1, max_size=3)),
)
_FILTERS = st.recursive(
    _COMPARISONS,
    lambda inner: st.builds(CompoundFilter, type=st.sampled_from(["and", "or"]), filters=st.lists(inner, min_size=1, max_size=3)),
    max_leaves=6,
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(attributes=st.lists(_ATTRIBUTES, min_size=1, max_size=6), filters=_FILTERS)
def test_the_server_index_filters_as_the_filters_match(pg_url, attributes, filters) -> None:
    """pgvector's SQL translation of a filter keeps exactly the files `filters.matches` keeps."""
    from serve_app.retrieval.pgvector import PgVectorIndex

    async def main() -> None:
        index = PgVectorIndex(pg_url, EMBEDDER.dimensions, table="filter_property")
        await index.drop("t/filters")
        for i, attrs in enumerate(attributes):
            await index.add("t/filters", [IndexedChunk(f"f{i}", "x", 0, "same words", attrs)], EMBEDDER.embed_now(["same words"]))
        hits = await index.search(
            "t/filters", "same words", EMBEDDER.embed_now(["same words"]), max_results=50, ranking=Ranking(), filters=filters
        )
        await index.aclose()
        assert {h.file_id for h in hits} == {f"f{i}" for i, attrs in enumerate(attributes) if filters.matches(attrs)}

    asyncio.run(main())

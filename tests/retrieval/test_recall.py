"""Retrieval quality on the generated question set (bench/file_search.py): hybrid retrieval
finds at least as many answers in its top 5 as semantic-only or keyword-only does, in the
embedded index (BM25) and in pgvector (the IDF of the words it looks up through its GIN index)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.file_search import question_set, recall_at
from serve_app.retrieval.embeddings import HashingEmbedder
from serve_app.retrieval.index import EmbeddedIndex
from tests.support.postgres_server import postgres


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["embedded", "pgvector"])
def test_hybrid_recall_at_5_is_at_least_each_ranker_alone(kind: str, tmp_path: Path) -> None:
    documents, questions = question_set()
    assert len({q.text for q in questions}) > 0.95 * len(questions)
    dimensions = HashingEmbedder().dimensions
    if kind == "embedded":
        recall = asyncio.run(recall_at(5, documents, questions, EmbeddedIndex(tmp_path, dimensions)))
    else:
        from serve_app.retrieval.pgvector import PgVectorIndex

        with postgres() as url:
            recall = asyncio.run(recall_at(5, documents, questions, PgVectorIndex(url, dimensions)))
    assert recall["hybrid"] >= recall["semantic"]
    assert recall["hybrid"] >= recall["keyword"]
    assert recall["hybrid"] > 0.5  # the set is answerable

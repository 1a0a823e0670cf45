"""Retrieval quality on the generated question set (bench/file_search.py): hybrid retrieval
finds at least as many answers in its top 5 as semantic-only or BM25-only does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.file_search import question_set, recall_at


@pytest.mark.slow
def test_hybrid_recall_at_5_is_at_least_each_ranker_alone(tmp_path: Path) -> None:
    documents, questions = question_set()
    assert len({q.text for q in questions}) > 0.95 * len(questions)
    recall = asyncio.run(recall_at(5, documents, questions, tmp_path))
    assert recall["hybrid"] >= recall["semantic"]
    assert recall["hybrid"] >= recall["bm25"]
    assert recall["hybrid"] > 0.5  # the set is answerable

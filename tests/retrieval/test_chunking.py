"""Chunking by tokens (serve_app/retrieval/chunking.py): OpenAI's auto/static strategies, for every text."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from serve_app.api.vector_stores import AUTO, ChunkingStrategy, StaticChunking
from serve_app.retrieval.chunking import chunk_spans, chunk_text, load_token_offsets


@pytest.fixture(scope="module")
def tokenizer():
    return load_token_offsets("o200k_harmony")


@given(n=st.integers(0, 5000), max_tokens=st.integers(100, 4096), data=st.data())
def test_spans_cover_every_token_with_the_overlap(n: int, max_tokens: int, data: st.DataObject) -> None:
    overlap = data.draw(st.integers(0, max_tokens // 2))
    spans = chunk_spans(n, max_tokens, overlap)
    if n == 0:
        assert spans == []
        return
    assert spans[0][0] == 0
    assert spans[-1][1] == n
    for start, end in spans:
        assert 0 < end - start <= max_tokens
    for (s1, e1), (s2, _) in itertools.pairwise(spans):
        assert e1 - s2 == overlap  # consecutive chunks share exactly the overlap
        assert e1 - s1 == max_tokens  # only the last may be shorter
        assert s2 > s1


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=1500)


@pytest.mark.slow  # the tokenizer loads in seconds
@settings(max_examples=60, deadline=None)
@given(text=_TEXT, max_tokens=st.integers(100, 300), data=st.data())
def test_chunks_are_exact_substrings_that_cover_the_text(tokenizer, text: str, max_tokens: int, data: st.DataObject) -> None:
    overlap = data.draw(st.integers(0, max_tokens // 2))
    strategy = ChunkingStrategy(type="static", static=StaticChunking(max_chunk_size_tokens=max_tokens, chunk_overlap_tokens=overlap))
    chunks = chunk_text(text, tokenizer, strategy)
    if not text:
        assert chunks == []
        return
    assert chunks[0].start == 0
    assert chunks[-1].end == len(text)
    for chunk in chunks:
        assert chunk.text == text[chunk.start : chunk.end]
        assert 0 < chunk.tokens <= max_tokens
    for a, b in itertools.pairwise(chunks):
        assert b.start <= a.end  # no gap: every character is in some chunk
        assert a.start < b.start


@pytest.mark.slow
def test_auto_is_800_tokens_overlapping_by_400(tokenizer) -> None:
    text = " ".join(f"word{i}" for i in range(3000))
    chunks = chunk_text(text, tokenizer, AUTO)
    total = len(tokenizer.offsets(text))
    assert [c.tokens for c in chunks[:-1]] == [800] * (len(chunks) - 1)
    assert len(chunks) == len(chunk_spans(total, 800, 400))
    assert AUTO.as_file_strategy() == {"type": "static", "static": {"max_chunk_size_tokens": 800, "chunk_overlap_tokens": 400}}


@pytest.mark.parametrize(
    "static",
    [
        {"max_chunk_size_tokens": 99, "chunk_overlap_tokens": 0},
        {"max_chunk_size_tokens": 4097, "chunk_overlap_tokens": 0},
        {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": 101},
        {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": -1},
    ],
)
def test_static_sizes_out_of_bounds_are_refused(static: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        ChunkingStrategy.model_validate({"type": "static", "static": static})
    with pytest.raises(ValidationError):
        ChunkingStrategy.model_validate({"type": "static"})

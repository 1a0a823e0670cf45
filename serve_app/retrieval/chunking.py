"""Chunking as OpenAI's vector stores document it, by tokens.

`chunking_strategy`: `auto` is `static` with 800-token chunks that overlap by 400; `static`
takes `max_chunk_size_tokens` (100-4096) and `chunk_overlap_tokens` (at most half of it).
Chunk k holds tokens [k*(max-overlap), k*(max-overlap)+max) of the text's tokenization: each
chunk has at most `max` tokens, consecutive chunks share exactly `overlap` tokens, the last
ends at the text's end, and the chunks cover every token. A chunk's text is the exact
substring of the text its tokens span (a token that splits a multi-byte character counts
the whole character in both neighbours), so nothing is lost or altered at a boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from serve_app.api.vector_stores import ChunkingStrategy

AUTO = ChunkingStrategy(type="auto")


class TokenOffsets(Protocol):
    """A tokenizer as chunking needs it: each token's (start, end) character offsets in `text`."""

    def offsets(self, text: str) -> Sequence[tuple[int, int]]: ...


@dataclass(frozen=True, slots=True)
class Chunk:
    index: int  # its place in the file
    text: str
    start: int  # character offsets in the file's text
    end: int
    tokens: int


def chunk_spans(num_tokens: int, max_tokens: int, overlap: int) -> list[tuple[int, int]]:
    """Token ranges [start, end) of the chunks of a text of `num_tokens` tokens."""
    if not 0 <= overlap < max_tokens:
        raise ValueError("need 0 <= overlap < max_tokens")
    stride = max_tokens - overlap
    spans: list[tuple[int, int]] = []
    start = 0
    while start < num_tokens:
        end = min(start + max_tokens, num_tokens)
        spans.append((start, end))
        if end == num_tokens:
            break
        start += stride
    return spans


def chunk_text(text: str, tokenizer: TokenOffsets, strategy: ChunkingStrategy = AUTO) -> list[Chunk]:
    """The chunks of `text` by `strategy` (none for a text without tokens)."""
    offsets = list(tokenizer.offsets(text))
    sizes = strategy.sizes
    chunks: list[Chunk] = []
    for index, (first, last) in enumerate(chunk_spans(len(offsets), sizes.max_chunk_size_tokens, sizes.chunk_overlap_tokens)):
        start = 0 if first == 0 else offsets[first][0]
        # Up to where the next token starts: the text between tokens (a normalizer's gap) is kept.
        end = len(text) if last == len(offsets) else max(offsets[last - 1][1], offsets[last][0], start)
        chunks.append(Chunk(index, text[start:end], start, end, last - first))
    return chunks


HARMONY_TOKENIZER = "o200k_harmony"


def load_token_offsets(name: str) -> HFTokenOffsets:
    """The tokenizer the config names: `o200k_harmony` (gpt-oss's, built from local files and
    read by `tokenizers` alone: seconds, not the half minute `transformers` takes), the
    built-in SmolLM2, or a hub id or folder."""
    from serve_app.families.control_tokens import text_tokenizer
    from serve_app.families.smollm2 import load_tokenizer
    from serve_app.families.vocab import ensure_harmony_tokenizer

    if name == HARMONY_TOKENIZER:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(ensure_harmony_tokenizer() / "tokenizer.json"))
        tokenizer.encode_special_tokens = True
        return HFTokenOffsets(tokenizer)
    return HFTokenOffsets(text_tokenizer(load_tokenizer(name)))


class HFTokenOffsets:
    """`TokenOffsets` of a `tokenizers.Tokenizer` (the served model's, or o200k_harmony's),
    special tokens' spellings read as text."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def offsets(self, text: str) -> Sequence[tuple[int, int]]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).offsets)

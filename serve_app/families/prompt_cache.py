"""Token ids of prompt pieces rendered before, so a conversation's next turn tokenizes only
what is new in it.

Agents send their conversation every turn (Codex with `store: false` sends it whole; a
`previous_response_id` chain or a `conversation` comes whole from the store), and only its
last items are new. Tokenizing all of it again cost ~0.8 µs a token with harmony and ~2 µs
with a chat template's tokenizer, on the ingress replica's event loop where its other
streams wait: ~0.1 and ~0.2 s for a 110k-token agent conversation, and that again for each
render `truncation: "auto"` tries. A prompt is therefore rendered as pieces whose tokens do
not depend on what is around them (a harmony message; chat-template text from one special
token to the next), and each piece is tokenized once per replica and kept here, the least
recently used going first when the budget of tokens is full.

    cache = PromptCache(max_tokens=8_000_000)
    prompt = cache.concat([(key, piece), ...], render_many)   # render_many(missing pieces)

A key is the text that decides a piece's tokens (a harmony message's JSON, a piece of a
chat-template prompt); it is kept as a 16-byte BLAKE2 digest. A kept piece counts against
the budget as its tokens plus `PIECE_OVERHEAD` (its key, array and LRU links, ~350 bytes,
in 4-byte token units), so the budget bounds the memory at 4 bytes a token however small
the pieces (a message of special tokens alone makes one piece per token).
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import cachetools

Piece = TypeVar("Piece")

# The default holds 8M tokens (~32 MB per model and ingress replica): a few dozen long agent
# conversations.
DEFAULT_MAX_TOKENS = 8_000_000
PIECE_OVERHEAD = 88


class PromptCache:
    """Token ids of rendered pieces by key, within `max_tokens` (0: nothing is kept)."""

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS, piece_overhead: int = PIECE_OVERHEAD) -> None:
        self.max_tokens = max_tokens
        self.piece_overhead = piece_overhead
        self._pieces: cachetools.LRUCache[bytes, array[int]] = cachetools.LRUCache(
            maxsize=max(max_tokens, 1), getsizeof=lambda tokens: len(tokens) + piece_overhead
        )
        self._lock = threading.Lock()  # the event loop renders, but a test or tool may use threads
        self.hit_tokens = 0  # tokens taken from the cache / tokenized, since the start
        self.rendered_tokens = 0

    def concat(
        self,
        pieces: Sequence[tuple[str, Piece]],
        render_many: Callable[[list[Piece]], Iterable[Sequence[int]]],
    ) -> list[int]:
        """The token ids of `pieces` (key, piece) one after the other; the pieces not kept are
        rendered by one call of `render_many` (their token ids, in order) and kept."""
        keys = [hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest() for key, _ in pieces]
        with self._lock:
            cached = [self._pieces.get(key) for key in keys]
        missing = [index for index, tokens in enumerate(cached) if tokens is None]
        found: dict[int, array[int]] = {index: tokens for index, tokens in enumerate(cached) if tokens is not None}
        rendered_tokens = 0
        if missing:
            rendered = render_many([pieces[index][1] for index in missing])
            with self._lock:
                for index, tokens in zip(missing, rendered, strict=True):
                    found[index] = array("I", tokens)
                    rendered_tokens += len(tokens)
                    if self.max_tokens and len(tokens) + self.piece_overhead <= self.max_tokens:
                        self._pieces[keys[index]] = found[index]
        prompt = array("I")
        for index in range(len(pieces)):
            prompt.extend(found[index])
        with self._lock:
            self.rendered_tokens += rendered_tokens
            self.hit_tokens += len(prompt) - rendered_tokens
        return prompt.tolist()

    @property
    def size(self) -> int:
        """Tokens kept now, with each piece's overhead."""
        return int(self._pieces.currsize)

"""Logprob attribution: each token's logprob goes to the output text it wrote.

Every token is parsed on its own, and its logprob goes to the delta holding the first output
text it contributes to. Tokens that contribute none report none: headers, end tokens, tags,
whitespace trimmed at an item's edges (and reasoning and call arguments: only output text has
logprobs in the API). The response stream tells this class what each token wrote (`wrote`,
before the parser sees it) and what text came out of which item (`released`), and asks it to
attribute what is settled; it appends each logprob to the message that owns it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from openai.types.responses.response_output_text import Logprob

from serve_app.core.logprobs import LogprobFormatter
from serve_app.core.tokens import TokenLogprobs
from serve_app.core.utf8 import unfinished_utf8_tail


class TextOwner(Protocol):
    """An output item text comes out of; a message keeps the logprobs of its text."""

    @property
    def kind(self) -> str: ...

    logprobs: list[Logprob]
    unsent_logprobs: list[Logprob]  # for the next delta event


@dataclass(frozen=True, slots=True)
class _PendingToken:
    """A token whose logprobs are not attributed yet, and where its bytes are in the text
    the tokens wrote (offsets from the start of the completion)."""

    token_id: int
    logprobs: TokenLogprobs
    start: int
    end: int


class LogprobAttribution:
    """One generation's tokens and the text that came out of them (a tool round's next
    generation starts over: `reset`)."""

    def __init__(self, formatter: LogprobFormatter) -> None:
        self.formatter = formatter
        self.reset()

    def reset(self) -> None:
        self._pending: list[_PendingToken] = []  # fed, not attributed yet: their text may be held
        self._written = bytearray()  # what the pending tokens wrote, from offset `_written_at`
        self._written_at = 0
        self._released: list[tuple[TextOwner, bytes]] = []  # text that came out since, in order

    def wrote(self, token_id: int, logprobs: TokenLogprobs) -> None:
        """A token about to be parsed, and its logprobs."""
        start, raw = self._written_at + len(self._written), self.formatter.token_text(token_id)
        self._written += raw
        self._pending.append(_PendingToken(token_id, logprobs, start, start + len(raw)))

    def released(self, owner: TextOwner, text: str) -> None:
        """Text that came out of `owner`, as the tokens wrote it (markers too)."""
        self._released.append((owner, text.encode()))

    def attribute(self, *, settled: bool, held_text: str = "") -> None:
        """Give the pending tokens whose bytes the released text came from their logprobs.

        The text that came out is literal text the tokens wrote, in order, with what the
        parser dropped between (headers, tags, trimmed whitespace): each piece is found in
        the pending tokens' bytes after the previous one, and a token goes with the first
        piece it overlaps. `settled` (between tokens): the parser holds only the unfinished
        character at the end and its `held_text`, so a token entirely before that and
        overlapping nothing wrote only dropped text. Otherwise (an item closes while a token
        is parsed) only tokens before the end of the last piece can be known to be dropped.
        """
        written, base = self._written, self._written_at
        consumed = base + len(written)  # offsets from the start of the completion
        if settled:
            consumed -= unfinished_utf8_tail(written) + len(held_text.encode())
        elif not self._released:
            return
        pending = self._pending
        if not self._released:  # nothing came out: drop the tokens that can no longer show
            drop = 0
            while drop < len(pending) and pending[drop].end <= consumed:
                drop += 1
            del pending[:drop]
        else:
            spans, cursor = [], 0
            for owner, piece in self._released:
                at = written.find(piece, cursor, (consumed if settled else base + len(written)) - base)
                at = cursor if at < 0 else at  # not literal (call arguments are re-serialized): assume next
                spans.append((owner, base + at, base + at + len(piece)))
                cursor = at + len(piece)
            self._released = []
            limit = consumed if settled else base + cursor
            keep: list[_PendingToken] = []
            for token in pending:
                overlaps = (owner for owner, start, end in spans if start < token.end and token.start < end)
                found = next(overlaps, None) if token.start < token.end else None  # special tokens write nothing
                if found is not None:
                    if found.kind == "message":
                        entry = self.formatter.logprob(token.token_id, token.logprobs)
                        found.logprobs.append(entry)
                        found.unsent_logprobs.append(entry)
                elif token.end > limit:
                    keep.append(token)  # its text may still come out
            self._pending = pending = keep
        # Keep the bytes from the first pending token on, and an unfinished character's from its
        # first byte: its later bytes are known to be part of it only with that byte.
        new_base = base + len(written) - unfinished_utf8_tail(written)
        if pending:
            new_base = min(new_base, pending[0].start)
        del written[: new_base - base]
        self._written_at = new_base

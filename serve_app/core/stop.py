"""Stop sequences on streamed text (`stop` of Chat Completions and Completions).

The visible text ends before the first stop sequence the model writes: the occurrence that
is complete first (the smallest end; of two ending together, the one that starts first),
which on a stream is the one seen first. `StopMatcher` finds it in text that comes in
pieces, split anywhere (a stop sequence may span several tokens): it emits text only once
it can no longer be the start of a stop sequence, and holds back just the tail that still
could (at most the longest sequence's length less one character). So any split of a text
gives the text `cut(text, stops)` gives for the whole of it.
"""

from __future__ import annotations

from collections.abc import Sequence


def _first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the stop sequence completed first in `text` starts (None: none is complete)."""
    best: tuple[int, int] | None = None  # (end, start)
    for stop in stops:
        start = text.find(stop)
        if start >= 0 and (best is None or (start + len(stop), start) < best):
            best = (start + len(stop), start)
    return None if best is None else best[1]


def cut(text: str, stops: Sequence[str]) -> str:
    """`text` up to the first stop sequence in it (all of it without one)."""
    at = _first_stop(text, stops)
    return text if at is None else text[:at]


class StopMatcher:
    """Text in pieces → the text before the first stop sequence, as soon as it is certain."""

    def __init__(self, stops: Sequence[str]) -> None:
        if not stops or not all(stops):
            raise ValueError("stop sequences must be non-empty strings")
        self._stops = tuple(stops)
        self._longest = max(map(len, stops))
        self._initials = frozenset(stop[0] for stop in stops)
        self._held = ""
        self.stopped = False

    @property
    def held_text(self) -> str:
        """Text held back: it may still become the start of a stop sequence."""
        return self._held

    def feed(self, text: str) -> str:
        """The text now certain to come before any stop sequence; once one is complete,
        `stopped` is set and the rest (this piece's and every later one's) is dropped."""
        if self.stopped:
            return ""
        text = self._held + text
        at = _first_stop(text, self._stops)
        if at is not None:
            self._held, self.stopped = "", True
            return text[:at]
        hold = len(text)
        for start in range(max(0, len(text) - self._longest + 1), len(text)):
            if text[start] in self._initials and any(stop.startswith(text[start:]) for stop in self._stops):
                hold = start  # the longest tail that may still become a stop sequence
                break
        self._held = text[hold:]
        return text[:hold]

    def finish(self) -> str:
        """The text has ended: what was held back was no stop sequence after all."""
        held, self._held = self._held, ""
        return held

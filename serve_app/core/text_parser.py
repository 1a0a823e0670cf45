"""A completion read as plain text: every token the model writes is output text, in one
message (`POST /v1/completions`: no reasoning, no calls, no channels to parse)."""

from __future__ import annotations

from collections.abc import Callable

from serve_app.core.items import ItemSink
from serve_app.core.utf8 import Utf8Decoder


class TextParser:
    """The `CompletionParser` of raw completions: tokens that write text (`writes_text`) are
    decoded by their bytes (`token_bytes`), a character split across tokens held until whole."""

    reasoning_tokens = 0

    def __init__(self, sink: ItemSink, token_bytes: Callable[[int], bytes], writes_text: Callable[[int], bool]) -> None:
        self._sink = sink
        self._token_bytes = token_bytes
        self._writes_text = writes_text
        self._decoder = Utf8Decoder()
        self._open = False

    @property
    def held_text(self) -> str:
        return ""

    def feed(self, token_ids: list[int]) -> None:
        data = b"".join(self._token_bytes(token) for token in token_ids if self._writes_text(token))
        self._add(self._decoder.decode(data))

    def end(self, truncated: bool = False) -> None:
        self._add(self._decoder.decode(b"", final=True))
        if not self._open:  # an empty completion is an empty text
            self._sink.open_message(None)
        self._sink.close_item()

    def _add(self, text: str) -> None:
        if not text:
            return
        if not self._open:
            self._sink.open_message(None)
            self._open = True
        self._sink.add_text(text)

"""Token bytes -> text for the parsers that decode bytes themselves (byte-level chat
vocabularies, harmony content), and where a character is left unfinished."""

from __future__ import annotations

import codecs


class Utf8Decoder:
    """What `codecs.getincrementaldecoder("utf-8")("replace")` gives (the bytes of a character
    not finished yet wait for the next call; bytes that are no character, or are left
    unfinished by a `final` call, become U+FFFD), in one C call when the bytes are whole
    characters: that decoder's own `decode` is Python code, ~0.5 µs a call, once per batch
    on the hot path."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = b""

    def decode(self, data: bytes, final: bool = False) -> str:
        if self._held:
            data = self._held + data
        try:
            text = data.decode()
        except UnicodeDecodeError:
            text, used = codecs.utf_8_decode(data, "replace", final)
            self._held = data[used:]
            return text
        self._held = b""
        return text


def unfinished_utf8_tail(raw: bytes | bytearray) -> int:
    """Bytes at the end of `raw` that start a UTF-8 character they do not finish."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: the character's first byte
            size = 2 if byte >= 0xC0 else 1
            size = 3 if byte >= 0xE0 else size
            size = 4 if byte >= 0xF0 else size
            return back if size > back else 0
    return 0


def cap_text(text: str, max_bytes: int) -> str:
    """`text` cut to at most `max_bytes` of UTF-8 (on a character boundary), saying so."""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= max_bytes:
        return text
    note = f"\n[output cut at {max_bytes} bytes of {len(raw)}]"
    return raw[: max(0, max_bytes - len(note))].decode("utf-8", "ignore") + note

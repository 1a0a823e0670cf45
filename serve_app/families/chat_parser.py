"""Completion parsing for chat-template models: tokens -> text -> reasoning, message and
function-call items.

Two small steps, both pure, joined by `ChatCompletionParser`:
- `Detokenizer`: token ids -> text. It holds back the bytes of a character not finished
  yet, so no character is split, replaced or emitted twice: byte-level vocabularies (most
  chat models) by joining each token's bytes into an incremental UTF-8 decoder (`utf8.py`), others
  with `tokenizers`' `DecodeStream`. A batch is decoded at once when none of its tokens can
  write a `<` (so no tag can start in it), otherwise a token at a time, so that where
  reasoning ends is known per token (`reasoning_tokens`).
- `TaggedTextParser`: text pieces -> `ItemSink` operations. It finds `<think>…</think>` and
  `<tool_call>{json}</tool_call>` however the text is cut, holding back only a suffix that
  could still become a tag; the moment it cannot, the suffix is released as text.

Rules (the same whatever the token and batch boundaries):
- The output starts inside reasoning when the prompt ends with an opened `<think>` (templates
  that think by default); otherwise a `<think>` before any other output opens reasoning.
  `</think>` ends it; so does a `<tool_call>` (a model may call a tool from its thoughts).
- A `<tool_call>` body is held until its `</tool_call>` (or the end of the output; inside a
  string of a JSON body, `</tool_call>` is the string's text) and becomes a
  `function_call` item only if it is a JSON object with a string `name` and an object
  `arguments` (a JSON string holding one is accepted too). Otherwise the whole block, tags
  included, is text of the item it interrupted: malformed calls are never lost and a call is
  never half-emitted. A body that does not start with `{` is that text at once (what follows
  is parsed as if no `<tool_call>` had come). `NS.NAME` is function NAME of namespace NS.
- Whitespace adjacent to a tag (the template's formatting: `\n\n` after `</think>`, before
  `<tool_call>`) is dropped; a prompt-opened `<think>` counts as a tag before the output.
  The start and end of the output are not tags: whitespace there is the model's text, kept
  (without parsers the message is exactly the decoded completion). Whitespace inside an
  item is kept; trailing whitespace is held until what follows decides.

vLLM's streaming parsers (`ReasoningParserManager`, `ToolParserManager`) are not used on this
path: `deepseek_r1` needs `<think>` to be a single vocabulary token (it refuses other
tokenizers), and `hermes` re-parses the whole text on every delta, drops text after the first
`<tool_call>`, and drops calls whose JSON it cannot read. Their tags and rules are the ones
mirrored here, and tests check this parser against their non-streaming extraction.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

from serve_app.core.items import ItemSink
from serve_app.core.utf8 import Utf8Decoder

logger = logging.getLogger(__name__)

State = Literal["content", "reasoning", "tool_call"]


@dataclass(frozen=True)
class Tags:
    """The tags of a model's reasoning and tool-call parsers (None: that parser is off)."""

    think: tuple[str, str] | None = None
    tool_call: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        for tag in self.all():
            # The hold-back rule below relies on it: a tag can only start at a "<".
            if not tag.startswith("<") or "<" in tag[1:]:
                raise ValueError(f"tag {tag!r} must start with '<' and hold no other '<'")

    def all(self) -> list[str]:
        return [tag for pair in (self.think, self.tool_call) if pair for tag in pair]


class TaggedTextParser:
    """Decoded completion text -> reasoning, message and function-call item operations."""

    def __init__(self, sink: ItemSink, tags: Tags, *, in_reasoning: bool = False) -> None:
        self._sink = sink
        self._tags = tags
        self.state: State = "reasoning" if in_reasoning and tags.think else "content"
        self._pending = ""  # undecided text: a possible tag prefix, or a tool-call body
        self._scanned = 0  # how much of a pending tool-call body is known to hold no end tag
        self._open: Literal["reasoning", "message"] | None = None
        self._held_space = ""  # trailing whitespace, dropped if a tag follows, else released
        self._after_tag = self.state == "reasoning"  # leading whitespace here touches a tag
        self._at_start = not in_reasoning  # nothing output yet: a `<think>` may open reasoning
        self._call_from: State = "content"

    # -- text in ---------------------------------------------------------------------------

    @property
    def may_reason(self) -> bool:
        """Whether text fed from now on may still be reasoning."""
        if not self._tags.think:
            return False
        state = self.state if self.state != "tool_call" else self._call_from  # a malformed call returns there
        return state == "reasoning" or self._at_start

    @property
    def held_text(self) -> str:
        """Text that may still come out: trailing whitespace, a possible tag, and in a call its
        start tag and body (a malformed call is text after all)."""
        if self.state == "tool_call" and self._tags.tool_call:
            return self._held_space + self._tags.tool_call[0] + self._pending
        return self._held_space + self._pending

    @property
    def undecided(self) -> bool:
        """Whether text is held back (a possible tag, or a tool-call body)."""
        return bool(self._pending) or self.state == "tool_call"

    def feed(self, text: str) -> None:
        if not self._pending and self.state != "tool_call" and "<" not in text:
            self.add_text(text)  # the common case: no tag can start or end here
            return
        text = self._pending + text
        self._pending = ""
        while text:
            if self.state == "tool_call":
                text = self._scan_call(text)
                continue
            if "<" not in text:  # the common case: no tag can start here
                self.add_text(text)
                return
            tag, at = self._first_tag(text)
            if tag is None:
                hold = self._partial_tag(text)
                self.add_text(text[: len(text) - hold])
                self._pending = text[len(text) - hold :]
                return
            self.add_text(text[:at])
            text = text[at + len(tag) :]
            self._on_tag(tag)

    def end(self) -> None:
        """The completion ended: a call without its end tag still counts if it is whole."""
        pending, self._pending = self._pending, ""
        if self.state == "tool_call":
            self._end_call(pending, closed=False)
        else:
            self.add_text(pending)  # a tag prefix that never completed is text
        if self._held_space and not (self._open is None and self._after_tag):
            self._write("")  # the end of the output is not a tag: its whitespace is text
        self._close()

    # -- tags --------------------------------------------------------------------------------

    def _tags_here(self) -> list[str]:
        think, tool_call = self._tags.think, self._tags.tool_call
        tags = [tool_call[0]] if tool_call else []
        if think and self.state == "reasoning":
            tags.append(think[1])
        elif think and self._at_start:
            tags.append(think[0])
        return tags

    def _first_tag(self, text: str) -> tuple[str | None, int]:
        first: str | None = None
        first_at = len(text)
        for tag in self._tags_here():
            at = text.find(tag, 0, first_at + len(tag))
            if 0 <= at < first_at:
                first, first_at = tag, at
        return first, first_at

    def _partial_tag(self, text: str) -> int:
        """Length of the longest suffix of `text` that a tag here could still start with."""
        tail = text[text.rfind("<") :]
        return len(tail) if any(tag.startswith(tail) for tag in self._tags_here()) else 0

    def _on_tag(self, tag: str) -> None:
        think, tool_call = self._tags.think, self._tags.tool_call
        self._at_start = False
        if think and tag == think[0]:
            self._close()  # only whitespace came before it
            self.state, self._after_tag = "reasoning", True
        elif think and tag == think[1]:
            self._close()
            self.state, self._after_tag = "content", True
        else:  # held whitespace waits: a malformed call is text, and it stood between them
            assert tool_call
            assert tag == tool_call[0]
            self._call_from, self.state = self.state, "tool_call"
            self._scanned = 0

    # -- tool calls --------------------------------------------------------------------------

    def _scan_call(self, text: str) -> str:
        """Look for the end tag of the open call; returns the text after it ("" if not yet)."""
        assert self._tags.tool_call
        start_tag, end_tag = self._tags.tool_call
        if next((char for char in text if not char.isspace()), "{") != "{":
            # No JSON object can start here: text at once, not held to the end of the output
            # (a random model's stream sat silent behind an unterminated `<tool_call>`).
            logger.warning("a tool call that does not start with a JSON object stays text: %.200r", text)
            self.state = self._call_from
            self.add_text(start_tag)
            return text
        at = text.find(end_tag, self._scanned)
        while at >= 0 and _inside_json_string(text[:at]):  # a value's text, not the end
            at = text.find(end_tag, at + 1)
        if at < 0:
            self._pending = text
            self._scanned = max(0, len(text) - len(end_tag) + 1)
            return ""
        self._end_call(text[:at], closed=True)
        return text[at + len(end_tag) :]

    def _end_call(self, body: str, *, closed: bool) -> None:
        assert self._tags.tool_call
        call = parse_tool_call(body)
        if call is None:  # not a call after all: the whole block is text where it stood
            logger.warning("a tool call that is not a JSON object with a name and object arguments stays text: %.200r", body)
            start_tag, end_tag = self._tags.tool_call
            self.state = self._call_from
            self.add_text(start_tag + body + (end_tag if closed else ""))
            return
        name, arguments = call
        namespace, _, function = name.rpartition(".")
        self._close()
        self.state, self._after_tag = "content", True
        self._sink.open_function_call(function, namespace or None)
        self._sink.add_text(arguments)
        self._sink.close_item()

    # -- items -------------------------------------------------------------------------------

    def add_text(self, text: str) -> None:
        """Text of the current state's item, known to hold no tag."""
        body = text.rstrip()
        if not body:  # whitespace only: what follows decides whether it is text
            self._held_space += text
            return
        self._write(body)
        self._held_space = text[len(body) :]

    def _write(self, body: str) -> None:
        """Write the held whitespace and `body` to the open item (opening one if needed)."""
        text, self._held_space = self._held_space + body, ""
        if self._open is None:
            if self._after_tag:  # the template's formatting after a tag, not the item's text
                text = text.lstrip()
            self._at_start = self._after_tag = False
            if self.state == "reasoning":
                self._sink.open_reasoning()
                self._open = "reasoning"
            else:
                self._sink.open_message("final_answer")
                self._open = "message"
        self._sink.add_text(text)

    def _close(self) -> None:
        if self._open is not None:
            self._sink.close_item()
            self._open = None
        self._held_space = ""


def _inside_json_string(body: str) -> bool:
    """Whether a call body that is JSON so far ends inside one of its strings. Grammars allow
    any text in a string value, `</tool_call>` too (SmolLM2 under tool_choice put it into a
    `city` string: `"Berlin}}</tool_call>...`). A body that is not JSON never is."""
    if not body.lstrip().startswith("{"):
        return False
    inside = escaped = False
    for char in body:
        if escaped:
            escaped = False
        elif char == "\\" and inside:
            escaped = True
        elif char == '"':
            inside = not inside
    return inside


def parse_tool_call(body: str) -> tuple[str, str] | None:
    """`(name, arguments JSON)` of a hermes tool-call body, or None if it is not one."""
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict):
        return None
    name, arguments = call.get("name"), call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return name, json.dumps(arguments, ensure_ascii=False)


class Detokenizer(Protocol):
    """Token ids -> text, never splitting a UTF-8 character or writing text twice."""

    def text(self, token_ids: list[int]) -> str:
        """The text the batch completes."""

    def plain_text(self, token_ids: list[int]) -> str | None:
        """`text` if no tag can start in the batch's text (no token writes a "<"); None if
        the batch needs `pieces`."""

    def pieces(self, token_ids: list[int]) -> list[str]:
        """The text each token completes ("" while a character is unfinished)."""

    def flush(self) -> str:
        """Bytes that never became a character: shown (as U+FFFD), not lost."""


class Vocabulary:
    """What detokenizing needs to know of each token of a model's vocabulary, computed once
    per model (a decode per token: ~0.2 s per 50k tokens); `detokenizer()` makes one per
    completion."""

    def __init__(self, tokenizer: Any, skip_ids: Iterable[int]) -> None:
        self._backend = backend = tokenizer.backend_tokenizer  # the Rust tokenizer of a fast tokenizer
        texts = [backend.decode([i], skip_special_tokens=False) for i in range(backend.get_vocab_size(with_added_tokens=True))]
        self.skip_ids = frozenset(skip_ids)  # special tokens that are not text (end of turn ...)
        # Tokens that need one-at-a-time handling: skipped ones, and those that write a "<"
        # (every tag starts with one; a "<" is one byte, so it always lies within one token).
        self.not_plain_ids = self.skip_ids | {i for i, text in enumerate(texts) if "<" in text}
        raw = _byte_level_bytes(backend, texts)
        self.token_bytes = None if raw is None else [b"" if i in self.skip_ids else b for i, b in enumerate(raw)]
        # Each token's own bytes, special tokens included (logprobs name every candidate).
        self._own_bytes = raw if raw is not None else [_piece_bytes(backend.id_to_token(i) or "", text) for i, text in enumerate(texts)]

    def bytes_of(self, token_id: int) -> bytes:
        """The bytes a token writes on its own (b"" for an id past the vocabulary)."""
        return self._own_bytes[token_id] if 0 <= token_id < len(self._own_bytes) else b""

    def detokenizer(self) -> Detokenizer:
        if self.token_bytes is not None:
            return ByteLevelDetokenizer(self.token_bytes, self.not_plain_ids)
        return StreamDetokenizer(self._backend, self.skip_ids, self.not_plain_ids)


def _piece_bytes(piece: str, text: str) -> bytes:
    """A SentencePiece-style token's bytes: `<0xNN>` is that byte, `▁` a space; other
    vocabularies' tokens are their decoded text."""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace("\u2581", " ").encode() if "\u2581" in piece else text.encode()


def _byte_level_bytes(backend: Any, texts: list[str]) -> list[bytes] | None:
    """The bytes each token writes, if the vocabulary is byte-level BPE (Qwen, Llama 3,
    DeepSeek, SmolLM2 ...): its decoder maps each character of a token to one byte (a token
    with a character outside that alphabet, an added token, writes its own UTF-8) and
    concatenates. None for other decoders (SentencePiece's leading space depends on the
    tokens around), or if any token's bytes disagree with the tokenizer's own decode."""
    from tokenizers.decoders import ByteLevel
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    if not isinstance(backend.decoder, ByteLevel):
        return None
    unicode_of = cast("Callable[[], dict[int, str]]", bytes_to_unicode)  # unannotated in transformers
    byte_of = {char: byte for byte, char in unicode_of().items()}
    table = []
    for token_id, text in enumerate(texts):
        token = backend.id_to_token(token_id) or ""
        try:
            raw = bytes([byte_of[char] for char in token])
        except KeyError:
            raw = token.encode()
        if raw.decode("utf-8", "replace") != text:
            logger.warning("token %d decodes to %r, not as its bytes %r: decoding with DecodeStream", token_id, text, raw)
            return None
        table.append(raw)
    return table


class ByteLevelDetokenizer:
    """A byte-level vocabulary's tokens joined as bytes and decoded as UTF-8 (`Utf8Decoder`),
    holding back only the bytes of a character not finished yet: one lookup per token and
    one C call per batch, several times cheaper than a decode call."""

    def __init__(self, token_bytes: list[bytes], not_plain_ids: frozenset[int]) -> None:
        self._bytes = token_bytes
        self._not_plain = not_plain_ids
        self._utf8 = Utf8Decoder()

    def text(self, token_ids: list[int]) -> str:
        return self._utf8.decode(b"".join(self._bytes_of(token_ids)))

    def plain_text(self, token_ids: list[int]) -> str | None:
        # Held bytes cannot hold a "<": it is a character of its own, never held.
        return self.text(token_ids) if self._not_plain.isdisjoint(token_ids) else None

    def pieces(self, token_ids: list[int]) -> list[str]:
        decode = self._utf8.decode
        return [decode(raw) for raw in self._bytes_of(token_ids)]

    def _bytes_of(self, token_ids: list[int]) -> list[bytes]:
        token_bytes = self._bytes
        try:
            return [token_bytes[token] for token in token_ids]
        except IndexError:  # an id past the tokenizer's vocabulary (models pad theirs): no text, as in decode
            return [token_bytes[token] if token < len(token_bytes) else b"" for token in token_ids]

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class StreamDetokenizer:
    """Other vocabularies: `tokenizers`' `DecodeStream`, which decodes each step with the
    tokens before it (the context their decoders need) and holds tokens while their text
    ends in an unfinished character."""

    def __init__(self, backend: Any, skip_ids: frozenset[int], not_plain_ids: frozenset[int]) -> None:
        from tokenizers.decoders import DecodeStream

        self._backend = backend
        self._step = DecodeStream(skip_special_tokens=False).step
        self._skip = skip_ids
        self._not_plain = not_plain_ids
        self._held: list[int] = []  # tokens DecodeStream holds, for `flush`

    def text(self, token_ids: list[int]) -> str:
        if not self._skip.isdisjoint(token_ids):
            token_ids = [token for token in token_ids if token not in self._skip]
            if not token_ids:
                return ""
        text = self._step(self._backend, token_ids)
        if text is None:  # DecodeStream keeps the tokens for later
            self._held += token_ids
            return ""
        self._held = []
        return text

    def plain_text(self, token_ids: list[int]) -> str | None:
        # A held token may write a "<" once its text is complete.
        if self._held or not self._not_plain.isdisjoint(token_ids):
            return None
        return self.text(token_ids)

    def pieces(self, token_ids: list[int]) -> list[str]:
        return [self.text([token]) for token in token_ids]

    def flush(self) -> str:
        held, self._held = self._held, []
        return self._backend.decode(held, skip_special_tokens=False) if held else ""


class ChatCompletionParser:
    """The `CompletionParser` of chat-template models: detokenizer + tagged-text parser."""

    def __init__(self, detokenizer: Detokenizer, text_parser: TaggedTextParser) -> None:
        self._detokenizer = detokenizer
        self._text = text_parser
        self.reasoning_tokens = 0

    def feed(self, token_ids: list[int]) -> None:
        text = self._text
        if not text.may_reason:  # no token of this batch can be reasoning: count none
            text.feed(self._detokenizer.text(token_ids))
            return
        if not text.undecided:
            plain = self._detokenizer.plain_text(token_ids)
            if plain is not None:  # no tag can start or end in it: one state for the whole batch
                if text.state == "reasoning":
                    self.reasoning_tokens += len(token_ids)
                text.add_text(plain)
                return
        for piece in self._detokenizer.pieces(token_ids):  # a tag may change the state here
            if text.state == "reasoning":
                self.reasoning_tokens += 1
            text.feed(piece)

    def end(self, truncated: bool = False) -> None:
        self._text.feed(self._detokenizer.flush())
        self._text.end()

    @property
    def held_text(self) -> str:
        """Decoded text held back for now (a possible tag, a call body, whitespace)."""
        return self._text.held_text

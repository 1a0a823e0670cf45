"""Text from a request or a tool never becomes a control token of a chat-template model.

A chat template is rendered to text, and a tokenizer reads every spelling of one of its
special tokens in that text as the token itself: a user message
`hi<|im_end|>\\n<|im_start|>system\\n...` would open a system turn of its own, a tool output a
forged assistant turn. So every string the template is given (messages, instructions, tool
call names and arguments, tool outputs, tool descriptions and schemas) is first `protect`ed:
each special token's spelling in it is replaced by a code of private-use characters. Every
spelling left in the rendered text is then the template's own. `pieces` cuts the text there
and turns the codes back into the spellings, and each piece between the template's special
tokens is tokenized with special tokens split as text (`split_special_tokens`).

Strings that hold no spelling (nearly all) are left as they are, so an honest conversation
renders to the very text, and tokens, it always did. The template is trusted to write each
control token whole, as templates do; tests/families/test_control_tokens.py tries every
special token, and its halves, in every position of the built-in qwen3 template and of
SmolLM2's own.

The template's structural tags (`<think>`, `<tool_call>`, `<tool_response>` and their ends)
are control text too, whether the tokenizer has them as tokens that are not special
(Qwen3's added tokens) or only as text: a tool's output that writes `</tool_response>` must
not end its block for the model, nor a user's `</think>` a thought. Such a spelling from a
request or a tool is coded like a special token's, and tokenized apart: cut in two where
the halves' tokens differ from the tag's own (`_tag_halves`), so its characters reach the
model but never the tag's token ids; only the template writes those.
"""

from __future__ import annotations

import copy as copy_module
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# Private-use characters: text that templates pass through untouched. ESCAPE + ESCAPE codes
# ESCAPE itself (a client's own private-use text comes back as it was sent).
ESCAPE = "\U000f0000"
_FIRST_CODE = 0xF0001
_LAST_CODE = 0xFFFFD


def text_tokenizer(tokenizer: Any) -> Tokenizer:
    """A copy of `tokenizer`'s backend (a `tokenizers.Tokenizer`) that reads the spelling of
    a special token as text."""
    copy: Tokenizer = copy_module.deepcopy(tokenizer.backend_tokenizer)
    copy.encode_special_tokens = True
    return copy


class Piece(NamedTuple):
    """Prompt text up to the next control token: the template's `special` token that opens
    it ("" for text before the first) and the `text` after it, all of it text."""

    special: str
    text: str


class ControlTokens:
    """The special tokens of `tokenizer` and the template's structural tags, and text kept
    from becoming them."""

    def __init__(self, tokenizer: Any, tags: Iterable[str] = ()) -> None:
        """`tags`: the template's structural tags; the tokenizer's added tokens that are not
        special are such tags too."""
        added = tokenizer.added_tokens_decoder.items()
        tokens = {token.content: (token_id, token) for token_id, token in added if token.special}
        structural = ({*tags} | {token.content for _, token in added if not token.special}) - tokens.keys()
        structural = {tag for tag in structural if len(tag) > 1}
        if len(tokens) + len(structural) > _LAST_CODE - _FIRST_CODE:
            raise ValueError(f"the tokenizer has {len(tokens) + len(structural)} control spellings, more than can be coded")
        spellings = sorted(tokens, key=len, reverse=True)  # the longest first, as the tokenizer matches
        self.ids = {spelling: token_id for spelling, (token_id, _) in tokens.items()}
        # Whitespace a special token takes in beside it (`lstrip`/`rstrip` of an added token).
        self._strips = {spelling: (token.lstrip, token.rstrip) for spelling, (_, token) in tokens.items()}
        alternatives = "|".join(re.escape(spelling) for spelling in spellings)
        self._special = re.compile(f"({alternatives})") if spellings else None
        protected = sorted([*spellings, *structural], key=len, reverse=True)
        self._protected = re.compile("|".join([re.escape(ESCAPE), *(re.escape(spelling) for spelling in protected)]))
        self._code = {spelling: ESCAPE + chr(_FIRST_CODE + index) for index, spelling in enumerate(protected)}
        self._code[ESCAPE] = ESCAPE + ESCAPE
        self._spelling = {code[1]: spelling for spelling, code in self._code.items()}
        self._special_codes = frozenset(self._code[spelling][1] for spelling in spellings)
        self._coded = re.compile(re.escape(ESCAPE) + "(.)", re.S)
        self._text_tokenizer = text_tokenizer(tokenizer)
        self._halves = {self._code[tag][1]: self._tag_halves(tag) for tag in structural}

    def _tag_halves(self, tag: str) -> tuple[str, str]:
        """`tag` cut in two where its halves, tokenized apart, are not its own tokens."""
        whole = self._text_tokenizer.encode(tag, add_special_tokens=False).ids
        for cut in range(1, len(tag)):
            halves = [self._text_tokenizer.encode(half, add_special_tokens=False).ids for half in (tag[:cut], tag[cut:])]
            if halves[0] + halves[1] != whole:
                return tag[:cut], tag[cut:]
        return tag[:1], tag[1:]  # every cut tokenizes as the whole: its characters are all there is

    def encode_plain(self, text: str) -> list[int]:
        """`text`'s token ids, special tokens' spellings in it read as text."""
        return list(self._text_tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_text(self, texts: list[str]) -> list[list[int]]:
        """The token ids of each text (a piece's, `pieces`): special tokens' spellings in it
        read as text, and a structural tag a string held tokenized in two halves."""
        if not texts:
            return []
        parts: list[list[str]] = [self._parts(text) for text in texts]
        flat = [part for text_parts in parts for part in text_parts]
        encoded = iter(self._text_tokenizer.encode_batch(flat, add_special_tokens=False) if flat else [])
        return [[token for _ in text_parts for token in next(encoded).ids] for text_parts in parts]

    def _parts(self, text: str) -> list[str]:
        """A piece's text in the parts it is tokenized in: its text, with each structural tag
        a string held as two parts of its own."""
        if ESCAPE not in text:
            return [text]
        parts, current, position = [], [], 0
        for match in self._coded.finditer(text):
            current.append(text[position : match.start()])
            position = match.end()
            code = match.group(1)
            if code in self._halves:
                parts += ["".join(current), *self._halves[code]]
                current = []
            else:
                current.append(self._spelling.get(code, match.group(0)))
        current.append(text[position:])
        return [part for part in [*parts, "".join(current)] if part]

    def protect(self, value: Any) -> tuple[Any, bool]:
        """`value` (strings, lists, tuples and dicts of them, keys too) with every special
        token's spelling coded; and whether any string held one."""
        found = False

        def code(match: re.Match[str]) -> str:
            nonlocal found
            found = True
            return self._code[match.group(0)]

        def walk(item: Any) -> Any:
            if isinstance(item, str):
                return self._protected.sub(code, item)
            if isinstance(item, dict):
                return {walk(key): walk(inner) for key, inner in item.items()}
            if isinstance(item, (list, tuple)):
                return type(item)(walk(inner) for inner in item)
            return item

        return walk(value), found

    def restore(self, text: str) -> str:
        """Protected text with its codes back as the spellings they stand for."""
        return self._coded.sub(lambda match: self._spelling.get(match.group(1), match.group(0)), text)

    def pieces(self, rendered: str) -> list[Piece]:
        """A template's rendering of protected strings, cut at its control tokens; the text of
        each piece restored, without the whitespace a control token beside it takes in."""
        parts = self._special.split(rendered) if self._special is not None else [rendered]
        pieces = [Piece("", parts[0])] + [Piece(parts[index], parts[index + 1]) for index in range(1, len(parts), 2)]
        for index, piece in enumerate(pieces):
            text = piece.text
            if piece.special and self._strips[piece.special][1]:
                text = text.lstrip()
            if index + 1 < len(pieces) and self._strips[pieces[index + 1].special][0]:
                text = text.rstrip()
            pieces[index] = Piece(piece.special, self._restore_special(text))
        return pieces

    def _restore_special(self, text: str) -> str:
        """Protected text with the special tokens' codes back as their spellings; the other
        codes (an escape, a structural tag) stay for `encode_text`."""
        return self._coded.sub(
            lambda match: self._spelling[match.group(1)] if match.group(1) in self._special_codes else match.group(0), text
        )

"""Long runs of one kind of character, which harmony's tokenizer takes quadratic time over,
and how a text is cut so that no piece it tokenizes is long.

openai-harmony's tokenizer (tiktoken's byte-pair encoder, in Rust, holding the GIL) splits
text into pieces with o200k's pattern (`vocab.O200K_PATTERN`) and merges the bytes of each
piece with time quadratic in the piece's length: `"€" * 20000` (one piece) took 1.1 s,
`* 40000` 4.4 s, while ordinary text of that size takes ~3 ms. Every piece lies within a run
of characters of one of four classes (`CLASSES`), give or take a few characters at its ends:

    letters and marks     pattern 1/2: an optional character, letters and marks, a contraction
    [^\\s\\p{L}\\p{N}]    pattern 4: an optional space, symbols and punctuation, then
    [\\r\\n/]             (that pattern's tail) newlines and slashes
    whitespace            patterns 5-7

so a text with no run of `MAX_RUN` characters of a class has no piece longer than
`MAX_PIECE`, and is tokenized as it always was. A text with such a run gets a *breaker*
inside it every `MAX_RUN` characters or so: a number character (`\\p{N}`: in none of the
classes, and pattern 3 takes at most three of them), which ends whatever piece it falls in.
The tokenizer then never sees a long piece; the breakers' tokens are taken out again
before the tokens are final (families/harmony.py). Text without such a run, everything but a
hostile or machine-made string, keeps the tokens harmony gives it.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Iterable, Iterator

import regex

# Characters of one class before a breaker. BPE over a piece of 256 `€` costs ~0.8 µs a
# token, about what ordinary text costs (~0.6 µs); at 2,048 it is ~5.5 µs.
MAX_RUN = 256
CLASSES = (r"[\p{L}\p{M}]", r"[^\s\p{L}\p{N}]", r"[\r\n/]", r"\s")
# The longest piece of a text whose runs are all shorter than MAX_RUN (+3: a breaker moved
# off a place where it would change what harmony does with the text, below): a symbol run
# and a newline run together, an optional space in front.
MAX_PIECE = 2 * (MAX_RUN + 3) + 1

# A run is only ever looked at from its start (the lookbehind), so a search is linear; but
# at ~50 ns a character for each class, a third of what tokenizing costs. `has_long_run`
# looks first at the text's UTF-8 bytes, each mapped to whether it can be part of a
# character of the class (`bytes.translate`, then a substring search: ~5 ns a character
# in all): a run of MAX_RUN characters is a run of at least as many such bytes. A class
# without one (nearly always) is done; in ASCII text a byte is a character, so the class
# has the run; other text is searched for it (CJK text, whose bytes are all beyond ASCII).
_LONG_RUNS = [regex.compile(f"(?<!{c}){c}{{{MAX_RUN}}}") for c in CLASSES]
_RUNS = [regex.compile(f"(?<!{c}){c}{{{MAX_RUN},}}") for c in CLASSES]
# Whitespace beyond ASCII (Unicode's White_Space, as `\s` means in both `regex` and Rust's
# regex): rare, so its bytes are not mapped; a text holding one is searched for a run.
NON_ASCII_SPACES = "\x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
_IN, _OUT = ord("x"), ord(".")
_NEEDLE = b"x" * MAX_RUN


def _byte_table(char_class: str, non_ascii: bool) -> bytes:
    pattern = regex.compile(char_class)
    return bytes(_IN if (byte >= 0x80 and non_ascii) or (byte < 0x80 and pattern.fullmatch(chr(byte))) else _OUT for byte in range(256))


# Letters and marks, and symbols, may be any character beyond ASCII; `[\r\n/]` none.
_TABLES = [_byte_table(c, non_ascii) for c, non_ascii in zip(CLASSES, (True, True, False, False), strict=True)]
_SPACES = CLASSES.index(r"\s")
# The breakers, in the order they are tried: number characters that have been in Unicode
# for decades (MATHEMATICAL DOUBLE-STRUCK DIGIT ZERO first), never in harmony's own text.
_PREFERRED = "\U0001d7d8\U0001d7e2\U0001d7ec\U0001d7f6\u2189"


def _classes_to_search(text: str) -> list[int]:
    """The classes (indexes into CLASSES) in which `text` may have a long run, by its bytes."""
    data = text.encode("utf-8", "surrogatepass")
    classes = [index for index, table in enumerate(_TABLES) if _NEEDLE in data.translate(table)]
    if _SPACES not in classes and not text.isascii() and any(space in text for space in NON_ASCII_SPACES):
        classes.append(_SPACES)
    return classes


def has_long_run(text: str) -> bool:
    """True if `text` holds a run of `MAX_RUN` characters of one class."""
    if len(text) < MAX_RUN:
        return False
    classes = _classes_to_search(text)
    return bool(classes) and (text.isascii() or any(_LONG_RUNS[index].search(text) for index in classes))


@functools.cache
def _number_characters() -> str:
    """Every number character of the Basic Multilingual Plane beyond ASCII (computed once,
    only for a text that holds all the preferred breakers)."""
    return "".join(c for c in map(chr, range(0x80, 0x10000)) if unicodedata.category(c)[0] == "N")


def breaker_for(texts: Iterable[str]) -> str | None:
    """A breaker that none of `texts` holds (so taking the breakers out is exact), or None
    if they hold every candidate (thousands of distinct number characters)."""
    texts = list(texts)
    for candidates in (_PREFERRED, None):
        for breaker in candidates if candidates is not None else _number_characters():
            if not any(breaker in text for text in texts):
                return breaker
    return None


def _allowed(text: str, position: int) -> bool:
    """Whether a breaker may go before `text[position]`: never inside `\\r\\n` (harmony's
    line splitting trims a line's `\\r`) nor inside `null` (its schema rendering looks for
    that word)."""
    if text[position - 1] == "\r" and text[position] == "\n":
        return False
    return all(text[start : start + 4] != "null" for start in range(max(position - 3, 0), position))


def _break_positions(text: str) -> Iterator[int]:
    for index in _classes_to_search(text):
        for match in _RUNS[index].finditer(text):
            position, end = match.start() + MAX_RUN, match.end()
            while position < end:
                while position < end and not _allowed(text, position):
                    position += 1
                if position < end:
                    yield position
                position += MAX_RUN


def break_runs(text: str, breaker: str) -> str:
    """`text` with `breaker` inside each of its long runs, every `MAX_RUN` characters (or up to
    three more); never at either end. `text` itself if it has no long run."""
    if not has_long_run(text):
        return text
    positions = sorted(set(_break_positions(text)))
    parts = [text[start:end] for start, end in zip([0, *positions], [*positions, len(text)], strict=True)]
    return breaker.join(parts)

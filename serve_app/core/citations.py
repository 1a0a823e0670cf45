"""gpt-oss's citation markers → `url_citation` (and `file_citation`) annotations.

The browser tool tells gpt-oss to cite what it read as `【{cursor}†L{start}(-L{end})?】`,
where the cursor numbers a page the browser showed. In the answer the client sees, each
marker is removed (as OpenAI's answers carry no such markers) and becomes a `url_citation`
annotation whose `start_index`/`end_index` are exact in the text *after* removal. The span an
annotation covers is the cited sentence: from the start of the sentence (or line) the marker
ends, to the marker, without surrounding whitespace. A cursor may also name a file that
`file_search` showed (`CitedFile`): its marker becomes a `file_citation` annotation whose
`index` is where the marker stood. Markers whose cursor names nothing citable are removed
without an annotation; text that is not a well-formed marker stays as it is.

`CitationStream` does this on a stream of text deltas, in which a marker may be split across
deltas: it holds back a possible partial marker (at most `MARKER_MAX_CHARS` characters) and
never emits text it would later have to retract, so any split of a text gives the same text
and annotations as `annotate` on the whole. Indices count Python characters (code points).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from openai.types.responses.response_output_text import AnnotationFileCitation, AnnotationURLCitation

# A marker longer than this is not one: holding back never delays text by more.
MARKER_MAX_CHARS = 96
# Full and partial markers; the content excludes brackets, daggers and newlines.
_CONTENT = r"[^†【】\n]"
_MARKER = re.compile(rf"【(\d{{1,9}})†{_CONTENT}+(?:†{_CONTENT}+)?】")
_PARTIAL = re.compile(rf"【(?:\d{{1,9}}(?:†{_CONTENT}*(?:†{_CONTENT}*)?)?)?")
_SENTENCE_END = ".!?"


@dataclass(frozen=True)
class CitedPage:
    """What a cursor points at: a page the browser showed."""

    url: str
    title: str


@dataclass(frozen=True)
class CitedFile:
    """What a cursor points at: a file (a chunk of it) that file_search showed."""

    file_id: str
    filename: str


Annotation = AnnotationURLCitation | AnnotationFileCitation


class CitationStream:
    """Removes citation markers from streamed text and yields their annotations.

    `pages` maps a cursor to its page; it is read when a marker completes, so the caller may
    keep adding the pages of later tool calls to the same mapping.
    """

    def __init__(self, pages: Mapping[int, CitedPage | CitedFile]) -> None:
        self._pages = pages
        self._held = ""  # text from a `【` that may still become a marker
        self._length = 0  # characters emitted so far
        self._previous = ""  # the last character emitted
        self._content_start: int | None = None  # its first non-space character
        self._content_end = 0  # just after its last non-space character

    @property
    def held_text(self) -> str:
        """Text held back as a possible partial marker (emitted by `finish` if it stays one)."""
        return self._held

    def feed(self, delta: str) -> tuple[str, list[Annotation]]:
        """Text safe to emit now, and the annotations completed by it (indices into the whole output)."""
        text = self._held + delta
        out: list[str] = []
        annotations: list[Annotation] = []
        position = 0
        while True:
            bracket = text.find("【", position)
            if bracket < 0:
                self._emit(text[position:], out)
                self._held = ""
                break
            self._emit(text[position:bracket], out)
            marker = _MARKER.match(text, bracket)
            if marker is not None and marker.end() - bracket <= MARKER_MAX_CHARS:
                annotation = self._annotation(int(marker.group(1)))
                if annotation is not None:
                    annotations.append(annotation)
                position = marker.end()
                continue
            if _PARTIAL.fullmatch(text, bracket) is not None and len(text) - bracket < MARKER_MAX_CHARS:
                self._held = text[bracket:]
                break
            self._emit("【", out)  # not a marker: plain text
            position = bracket + 1
        return "".join(out), annotations

    def finish(self) -> tuple[str, list[Annotation]]:
        """The end of the text: a partial marker still held is plain text after all."""
        held, self._held = self._held, ""
        out: list[str] = []
        self._emit(held, out)
        return "".join(out), []

    def _emit(self, text: str, out: list[str]) -> None:
        if not text:
            return
        out.append(text)
        for offset, char in enumerate(text):
            index = self._length + offset
            if char == "\n" or (char.isspace() and self._previous in _SENTENCE_END):
                self._content_start = None  # a new sentence starts
            elif not char.isspace():
                if self._content_start is None:
                    self._content_start = index
                self._content_end = index + 1
            self._previous = char
        self._length += len(text)

    def _annotation(self, cursor: int) -> Annotation | None:
        page = self._pages.get(cursor)
        if page is None:
            return None
        if isinstance(page, CitedFile):
            return AnnotationFileCitation(type="file_citation", file_id=page.file_id, filename=page.filename, index=self._length)
        if self._content_start is None:  # nothing written in this sentence yet: mark the position
            start = end = self._length
        else:
            start, end = self._content_start, self._content_end
        return AnnotationURLCitation(type="url_citation", start_index=start, end_index=end, url=page.url, title=page.title)


def annotate(text: str, pages: Mapping[int, CitedPage | CitedFile]) -> tuple[str, list[Annotation]]:
    """The text without its citation markers, and their annotations."""
    stream = CitationStream(pages)
    body, annotations = stream.feed(text)
    rest, _ = stream.finish()
    return body + rest, annotations

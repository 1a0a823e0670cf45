"""gpt-oss's citation markers become `url_citation` annotations on the text without them.

Exact cases first, then properties: any split of a text into deltas gives the same text and
annotations as the whole, no emitted text is ever retracted, and every annotation's indices
cut the cited sentence out of the final text.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from serve_app.core.citations import MARKER_MAX_CHARS, CitationStream, CitedPage, annotate

PAGES = {
    0: CitedPage(url="https://example.com/a", title="Page A"),
    3: CitedPage(url="https://example.org/b", title="Page B"),
}


def spans(text: str, annotations) -> list[tuple[str, str]]:
    return [(text[a.start_index : a.end_index], a.url) for a in annotations]


def test_a_marker_is_removed_and_its_sentence_annotated() -> None:
    text, annotations = annotate("Intro. Paris is the capital【3†L10-L15】. Next.", PAGES)
    assert text == "Intro. Paris is the capital. Next."
    assert spans(text, annotations) == [("Paris is the capital", "https://example.org/b")]
    assert annotations[0].type == "url_citation"
    assert annotations[0].title == "Page B"


def test_adjacent_markers_share_the_sentence_and_a_line_starts_one() -> None:
    text, annotations = annotate("First line\n  claim 【0†L3】【3†L1】 rest", PAGES)
    assert text == "First line\n  claim  rest"
    assert spans(text, annotations) == [("claim", "https://example.com/a"), ("claim", "https://example.org/b")]


def test_a_marker_before_any_text_marks_its_position() -> None:
    text, annotations = annotate("【0†L1】Hello", PAGES)
    assert text == "Hello"
    assert (annotations[0].start_index, annotations[0].end_index) == (0, 0)


def test_unknown_cursors_are_removed_without_annotation_and_non_markers_stay() -> None:
    raw = "a【9†L1】b 【x†L1】 【1】 【2†】 【4†a†b†c】 〖0†L1〗 【"
    text, annotations = annotate(raw, PAGES)
    assert text == "ab 【x†L1】 【1】 【2†】 【4†a†b†c】 〖0†L1〗 【"
    assert annotations == []


def test_the_domain_form_of_a_marker_is_one_too() -> None:
    text, annotations = annotate("Claim【0†Some title†example.com】.", PAGES)
    assert text == "Claim."
    assert spans(text, annotations) == [("Claim", "https://example.com/a")]


def test_an_overlong_marker_is_text() -> None:
    long_marker = "【0†" + "L" * MARKER_MAX_CHARS + "】"
    assert annotate(long_marker, PAGES) == (long_marker, [])


def test_a_partial_marker_is_held_then_released() -> None:
    stream = CitationStream(PAGES)
    assert stream.feed("Fact 【0†L") == ("Fact ", [])
    assert stream.held_text == "【0†L"
    text, annotations = stream.feed("2】 and 【3")
    assert text == " and "
    assert spans("Fact  and ", annotations) == [("Fact", "https://example.com/a")]
    assert stream.finish() == ("【3", [])  # the text ended inside a would-be marker: it is text


def test_pages_added_later_are_seen() -> None:
    pages: dict[int, CitedPage] = {}
    stream = CitationStream(pages)
    stream.feed("x")
    pages[5] = CitedPage(url="https://late.example/", title="Late")
    _, annotations = stream.feed("【5†L1】")
    assert [a.url for a in annotations] == ["https://late.example/"]


# Text built from pieces that often form markers, partial markers and near misses.
_pieces = st.sampled_from(
    ["【", "】", "†", "0", "3", "9", "L1", "-L2", ". ", "\n", " ", "word", "x", "【0†L1】", "【3†L4-L9】", "【3†t†example.org】", "é", "〖"]
)
texts = st.lists(_pieces, max_size=40).map("".join)


def splits(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


@given(texts, st.lists(st.integers(min_value=0, max_value=200), max_size=20))
def test_any_split_gives_the_same_text_and_annotations(text: str, cuts: list[int]) -> None:
    expected_text, expected_annotations = annotate(text, PAGES)
    stream = CitationStream(PAGES)
    emitted: list[str] = []
    annotations = []
    for delta in splits(text, cuts):
        out, new = stream.feed(delta)
        emitted.append(out)
        annotations.extend(new)
        # Nothing emitted is retracted: what is out so far is a prefix of the final text,
        # and each annotation only points into text already emitted.
        so_far = "".join(emitted)
        assert expected_text.startswith(so_far)
        assert all(a.end_index <= len(so_far) for a in new)
        assert len(stream.held_text) < MARKER_MAX_CHARS
    out, new = stream.finish()
    emitted.append(out)
    annotations.extend(new)
    assert "".join(emitted) == expected_text
    assert annotations == expected_annotations


@given(texts)
def test_annotations_cut_the_cited_sentence(text: str) -> None:
    result, annotations = annotate(text, PAGES)
    for annotation in annotations:
        cited = result[annotation.start_index : annotation.end_index]
        assert cited == cited.strip()
        assert "\n" not in cited
        assert annotation.url in {page.url for page in PAGES.values()}
    # Removing markers only removes: the result is the text minus whole markers.
    assert len(result) <= len(text)

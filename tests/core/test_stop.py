"""Stop sequences on streamed text: for any text, any stop sequences and any split of the
text into pieces, the text shown is `cut(text, stops)`, never a character of a stop
sequence leaks to the stream, and only what may still become one is held back."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serve_app.core.stop import StopMatcher, cut

# A small alphabet, so stop sequences occur, overlap and repeat; multi-code-point emoji too.
ALPHABET = ["a", "b", "c", " ", "\n", "é", "👍🏽"]
texts = st.lists(st.sampled_from(ALPHABET), max_size=40).map("".join)
stop_lists = st.lists(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=5).map("".join), min_size=1, max_size=4)


def splits(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(point, len(text)) for point in cuts} | {0, len(text)})
    return [text[start:end] for start, end in itertools.pairwise(points)]


@given(texts, stop_lists, st.lists(st.integers(0, 40), max_size=20))
def test_any_split_shows_the_text_before_the_first_stop(text, stops, cuts):
    matcher = StopMatcher(stops)
    shown, fed = "", ""
    expected = cut(text, stops)
    for piece in splits(text, cuts):
        shown += matcher.feed(piece)
        fed += piece
        assert expected.startswith(shown)  # nothing shown is retracted or past the stop
        if not matcher.stopped:
            held = matcher.held_text
            assert shown + held == fed  # nothing lost
            # held back only what may still become a stop sequence
            assert held == "" or any(stop.startswith(held) and stop != held for stop in stops)
            assert all(stop not in fed for stop in stops)
    if not matcher.stopped:
        shown += matcher.finish()
    assert shown == expected
    assert matcher.stopped == any(stop in text for stop in stops)


@given(texts, st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=5).map("".join))
def test_one_stop_is_a_split(text, stop):
    assert cut(text, [stop]) == text.split(stop)[0]


@pytest.mark.parametrize(
    ("text", "stops", "expected"),
    [
        ("abcde", ["abcde", "c"], "ab"),  # the stop complete first wins, as a stream sees it
        ("xabc", ["bc", "abc"], "x"),  # of two ending together, the longer
        ("hello\n\nworld", ["\n\n"], "hello"),
        ("no stop here", ["STOP"], "no stop here"),
    ],
)
def test_the_first_complete_stop_ends_the_text(text, stops, expected):
    assert cut(text, stops) == expected
    matcher = StopMatcher(stops)
    assert "".join(matcher.feed(char) for char in text) + matcher.finish() == expected


def test_a_partial_stop_is_held_only_while_it_may_complete():
    matcher = StopMatcher(["END"])
    assert matcher.feed("the EN") == "the "
    assert matcher.held_text == "EN"
    assert matcher.feed("D") == ""
    assert matcher.stopped
    other = StopMatcher(["END"])
    assert other.feed("the EN") == "the "
    assert other.feed("ough") == "ENough"  # no stop after all: released at once


def test_empty_stop_sequences_are_refused():
    with pytest.raises(ValueError, match="non-empty"):
        StopMatcher([""])

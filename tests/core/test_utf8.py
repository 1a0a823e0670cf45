"""`Utf8Decoder` (serve_app/core/utf8.py) gives what Python's incremental UTF-8 decoder
with `replace` gives, call by call, however the bytes are cut."""

from __future__ import annotations

import codecs

from hypothesis import given
from hypothesis import strategies as st

from serve_app.core.utf8 import Utf8Decoder

# Whole characters of 1 to 4 bytes, their parts, and bytes that are no character.
pieces = st.one_of(
    st.text(max_size=4).map(str.encode),
    st.sampled_from("é世👍🏽𝄞").map(str.encode).flatmap(lambda raw: st.integers(0, len(raw)).map(lambda cut: raw[:cut])),
    st.binary(max_size=3),
)


@given(st.lists(st.tuples(pieces, st.booleans()), max_size=30))
def test_the_same_text_as_the_incremental_decoder_at_every_call(calls):
    ours, python = Utf8Decoder(), codecs.getincrementaldecoder("utf-8")("replace")
    for data, final in calls:
        assert ours.decode(data, final) == python.decode(data, final)
    assert ours.decode(b"", True) == python.decode(b"", True)

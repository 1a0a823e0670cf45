"""`truncation: "auto"`: for any conversation, the kept part renders, keeps each function call
with its output, and is the longest tail that fits (serve_app/families/truncation.py); and the
API around it, in process (both model families, the input-token count)."""

from __future__ import annotations

import random

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.api.items import FunctionCallItem, FunctionCallOutputItem, MessageItem, ReasoningItem
from serve_app.api.request import ResponsesRequest
from serve_app.families.harmony import render_prompt
from serve_app.families.truncation import cut_points, first_true, fit_to_context, output_reserve, whole_from
from tests.support import sdk_scenarios

REQUEST = ResponsesRequest(model="gpt-oss-replay", input="hi")


@st.composite
def conversations(draw) -> list:
    """Turns as clients send them: instructions first, then user messages, each answered by
    reasoning, assistant text and rounds of (parallel) calls whose outputs come in any order."""
    words = st.text("abcdefgh ", min_size=1, max_size=30)
    items: list = [
        MessageItem(role=draw(st.sampled_from(["system", "developer"])), content=draw(words)) for _ in range(draw(st.integers(0, 2)))
    ]
    calls = 0
    for _ in range(draw(st.integers(1, 4))):
        items.append(MessageItem(role=draw(st.sampled_from(["user", "user", "developer"])), content=draw(words)))
        for _ in range(draw(st.integers(0, 3))):
            if draw(st.booleans()):
                items.append(ReasoningItem(type="reasoning", summary=[{"text": draw(words)}]))
            if draw(st.booleans()):
                items.append(MessageItem(role="assistant", content=draw(words)))
                continue
            ids = [f"call_{calls + n}" for n in range(draw(st.integers(1, 3)))]
            calls += len(ids)
            items += [FunctionCallItem(type="function_call", call_id=i, name="lookup", arguments='{"q": 1}') for i in ids]
            items += [
                FunctionCallOutputItem(type="function_call_output", call_id=i, output=draw(words)) for i in draw(st.permutations(ids))
            ]
    return items


def _lead(history: list) -> int:
    lead = 0
    while lead < len(history) and isinstance(history[lead], MessageItem) and history[lead].role in ("system", "developer"):
        lead += 1
    return lead


def _splits_a_call(history: list, cut: int) -> bool:
    calls = {item.call_id: index for index, item in enumerate(history) if isinstance(item, FunctionCallItem)}
    return any(isinstance(item, FunctionCallOutputItem) and calls[item.call_id] < cut <= index for index, item in enumerate(history))


@pytest.mark.slow
@settings(max_examples=150)
@given(conversations())
def test_cut_points_are_exactly_the_renderable_tails(history):
    lead = _lead(history)
    cuts = cut_points(history)
    expected = [cut for cut in range(lead + 1, len(history)) if not _splits_a_call(history, cut)]
    assert cuts == expected
    for cut in cuts:
        render_prompt(REQUEST, history[:lead] + history[cut:])  # an orphaned output would be a 400


@pytest.mark.slow
@settings(max_examples=150)
@given(conversations(), st.floats(0.0, 1.0), st.data())
def test_a_window_of_the_newest_items_fits_as_the_whole_history_does(history, fraction, data):
    """A conversation read newest first (runtime/run.py `recent_history`): its opening
    instructions and the items from a window start on, read until they were over the budget.
    With the window's front trimmed to where a prompt may start (`whole_from`) and its
    outputs of unread calls taken as such (`resumed`), the prompt is the whole history's."""
    lead = _lead(history)
    if len(history) - lead < 2:
        return
    start = data.draw(st.integers(lead + 1, len(history) - 1))
    read = history[start:]
    window = history[:lead] + read[whole_from(read) :]
    budget = int(len(render_prompt(REQUEST, history)) * fraction)
    if whole_from(read) == len(read) or len(render_prompt(REQUEST, window)) <= budget:
        return  # a window is only ever left unfinished once it is over the budget
    expected, _ = fit_to_context(lambda items: render_prompt(REQUEST, items), history, budget)
    prompt, _ = fit_to_context(lambda items: render_prompt(REQUEST, items), window, budget, lead=lead, resumed=True)
    if len(expected) <= budget:
        assert prompt == expected
    else:  # nothing fits: both are over the budget, the caller refuses or caps either
        assert len(prompt) > budget


@pytest.mark.slow
@settings(max_examples=150)
@given(conversations(), st.floats(0.0, 1.2))
def test_fit_drops_the_fewest_oldest_items(history, fraction):
    def render(items: list) -> list[int]:
        renders.append(len(items))
        return render_prompt(REQUEST, items)

    renders: list[int] = []
    whole = len(render(history))
    budget = int(whole * fraction)
    renders.clear()
    prompt, dropped = fit_to_context(render, history, budget)
    lead, cuts = _lead(history), cut_points(history)
    if whole <= budget or not cuts:
        assert (prompt, dropped) == (render_prompt(REQUEST, history), 0)
        return
    kept = history[:lead] + history[lead + dropped :]
    assert dropped > 0
    assert lead + dropped in cuts
    assert prompt == render_prompt(REQUEST, kept)
    earlier = [cut for cut in cuts if cut < lead + dropped]
    if len(prompt) <= budget:  # and one item fewer dropped would not fit
        assert not earlier or len(render_prompt(REQUEST, history[:lead] + history[earlier[-1] :])) > budget
    else:  # nothing fits: the shortest there is
        assert lead + dropped == cuts[-1]
    assert len(renders) <= 2 * len(cuts).bit_length() + 3  # a search, not a render per cut


@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(0, n - 1))))
def test_first_true_finds_the_threshold_from_any_guess(case):
    n, threshold, guess = case
    calls: list[int] = []
    found = first_true(lambda k: calls.append(k) or k >= threshold, n, guess)
    assert found == threshold
    assert len(calls) <= 2 * n.bit_length() + 1
    if guess == threshold < n:
        assert len(calls) <= 2


def test_output_reserve():
    assert output_reserve(100, 4096) == 100
    assert output_reserve(None, 4096) == 1024


# --- through the API, in process --------------------------------------------------------


def _long_conversation(turns: int) -> list[dict]:
    """Turns of ~2,000 tokens each (o200k: " a" is one token), each answered."""
    items: list[dict] = []
    for turn in range(turns):
        items.append({"role": "user", "content": f"turn {turn}" + " a" * 2000})
        items.append({"role": "assistant", "content": f"answer {turn}"})
    return items


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
def test_auto_drops_old_turns_that_disabled_refuses(inprocess_url, model):
    """65 turns of ~2,000 tokens (~130k) and a last question, on a 131,072-token model: with
    max_output_tokens 8,000 it does not fit. "disabled" is a 400; "auto" answers the last
    question from a prompt that leaves the room asked for, and echoes the setting."""
    sdk = sdk_scenarios.client(inprocess_url)
    conversation = [*_long_conversation(65), {"role": "user", "content": "the last question"}]
    turn = _count(sdk, model, _long_conversation(2)) - _count(sdk, model, _long_conversation(1))
    for truncation in (None, "disabled"):
        extra = {} if truncation is None else {"truncation": truncation}
        with pytest.raises(openai.BadRequestError) as error:
            sdk.responses.create(model=model, input=conversation, max_output_tokens=8000, store=False, **extra)
        assert error.value.body["code"] == "context_length_exceeded"
    response = sdk.responses.create(model=model, input=conversation, max_output_tokens=8000, store=False, truncation="auto")
    assert response.status == "completed"
    assert response.truncation == "auto"
    assert response.output_text == "the last question"  # the replay answers the last user message
    # As few turns dropped as make it fit: one more would not.
    assert 131_072 - 8000 - turn < response.usage.input_tokens <= 131_072 - 8000
    assert _count(sdk, model, conversation, truncation="auto", max_output_tokens=8000) == response.usage.input_tokens
    assert _count(sdk, model, conversation, max_output_tokens=8000) > 131_072


def _count(sdk, model: str, items: list[dict], max_output_tokens: int | None = None, **kwargs) -> int:
    # The SDK's count has no max_output_tokens; the endpoint reads the body as a create request.
    extra = {"extra_body": {"max_output_tokens": max_output_tokens}} if max_output_tokens else {}
    return sdk.responses.input_tokens.count(model=model, input=items, **kwargs, **extra).input_tokens


def test_auto_keeps_instructions_and_leaves_short_prompts_alone(inprocess_url):
    sdk = sdk_scenarios.client(inprocess_url)
    short = sdk.responses.create(model="gpt-oss-replay", input="hello", truncation="auto", store=False)
    plain = sdk.responses.create(model="gpt-oss-replay", input="hello", store=False)
    assert short.usage.input_tokens == plain.usage.input_tokens
    assert plain.truncation == "disabled"
    # Leading developer messages are instructions: dropping turns keeps them (the count
    # with them is the count without them plus their own tokens).
    conversation = [*_long_conversation(70), {"role": "user", "content": "last"}]
    developer = {"role": "developer", "content": "Always answer in French. " * 50}
    counts = [_count(sdk, "gpt-oss-replay", [*lead, *conversation], truncation="auto", max_output_tokens=100) for lead in ([], [developer])]
    assert counts[0] < counts[1] <= 131_072 - 100


def test_auto_when_even_the_last_item_does_not_fit(inprocess_url):
    """Nothing to drop can make room: the usual 400, naming the context."""
    sdk = sdk_scenarios.client(inprocess_url)
    with pytest.raises(openai.BadRequestError) as error:
        sdk.responses.create(model="gpt-oss-replay", input=[{"role": "user", "content": " a" * 140_000}], truncation="auto", store=False)
    assert error.value.body["code"] == "context_length_exceeded"


def test_bad_truncation_value_is_a_400(inprocess_url):
    response = httpx.post(
        f"{inprocess_url}/responses", json={"model": "gpt-oss-replay", "input": "hi", "truncation": "sometimes"}, timeout=30
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "truncation"


@pytest.mark.slow
def test_random_histories_through_the_api(inprocess_url):
    """Agent-style histories (calls and outputs in any order) cut at random budgets: every
    request is answered, never a 400 for an orphaned output."""
    sdk = sdk_scenarios.client(inprocess_url)
    rng = random.Random(7)
    history: list[dict] = [{"role": "user", "content": "start" + " a" * 3000}]
    for step in range(60):
        ids = [f"call_{step}_{n}" for n in range(rng.randint(1, 3))]
        history += [{"type": "function_call", "call_id": i, "name": "read", "arguments": "{}"} for i in ids]
        history += [
            {"type": "function_call_output", "call_id": i, "output": " b" * rng.randint(500, 3000)} for i in rng.sample(ids, len(ids))
        ]
    history.append({"role": "user", "content": "done?"})
    for max_output_tokens in (100, 20_000, 60_000):
        response = sdk.responses.create(
            model="gpt-oss-replay", input=history, truncation="auto", max_output_tokens=max_output_tokens, store=False
        )
        assert response.status == "completed"
        assert response.output_text == "done?"
        assert response.usage.input_tokens <= 131_072 - max_output_tokens

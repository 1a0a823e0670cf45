"""`truncation: "auto"`: the oldest items of a conversation are dropped until its prompt fits.

With `"disabled"` (the default) a prompt longer than the model's context is a 400
(`context_length_exceeded`). With `"auto"` the oldest items go first (the history of
`previous_response_id` or `conversation`, then this request's own input) until the prompt
leaves room for the answer: `max_output_tokens`, or a quarter of the context without it
(a prompt cut to the last token of the context would leave each later turn almost no room).

What stays always renders as before: the system/developer messages that open the
conversation are instructions and stay, a function call and its output stay or go together,
and the last item stays. As few items as possible are dropped (a search from a guess by the
items' sizes: usually two more renders, only for prompts that do not fit). Only the prompt
is cut: the stored response and its input items keep every item, so the next turn cuts its
own, longer history again.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from typing import TypeVar

from serve_app.api.items import CustomToolCallItem, CustomToolCallOutputItem, FunctionCallItem, FunctionCallOutputItem, MessageItem

Item = TypeVar("Item")


def output_reserve(max_output_tokens: int | None, max_model_len: int) -> int:
    """Tokens of the context left for the answer when a prompt is truncated."""
    return max_output_tokens if max_output_tokens is not None else max_model_len // 4


def fit_to_context(
    render: Callable[[list[Item]], list[int]], history: Sequence[Item], budget: int, *, lead: int | None = None, resumed: bool = False
) -> tuple[list[int], int]:
    """The prompt of `history`, without as few of its oldest items as make it at most
    `budget` tokens, and how many items were dropped. When no cut fits, the shortest
    prompt there is (the caller's context check then refuses it or caps the answer).

    `resumed`: `history` is the opening instructions (`lead` items) and then only the newest
    items of a longer conversation (the older ones were not read, runtime/run.py); an output
    among them whose call is not is taken to have its call among those not read."""
    prompt = render(list(history))
    if len(prompt) <= budget:
        return prompt, 0
    lead = leading_instructions(history) if lead is None else lead
    cuts = cut_points(history, lead, resumed)
    if not cuts:
        return prompt, 0
    prompts: dict[int, list[int]] = {}

    def render_from(cut: int) -> list[int]:
        if cut not in prompts:
            prompts[cut] = render(list(history[:lead]) + list(history[cut:]))
        return prompts[cut]

    # Prompts shrink as the cut moves on: search for the first cut that fits, from a guess by
    # the items' text sizes (a 130k-token harmony prompt takes ~0.25 s to render here, so a
    # good guess, two renders, is worth having); none fits: the last cut.
    excess = (len(prompt) - budget) / max(len(prompt), 1)  # above 1 when max_output_tokens exceeds the context
    sizes = list(itertools.accumulate((_size(item) for item in history[lead:]), initial=0))
    guess = bisect.bisect_left(cuts, lead + bisect.bisect_left(sizes, excess * sizes[-1]))
    found = first_true(lambda k: len(render_from(cuts[k])) <= budget, len(cuts), min(guess, len(cuts) - 1))
    cut = cuts[min(found, len(cuts) - 1)]
    return render_from(cut), cut - lead


def first_true(predicate: Callable[[int], bool], n: int, guess: int) -> int:
    """The first k in range(n) where `predicate` (false, then true) holds, else n: galloping
    out from `guess` to bracket it, then bisecting. 2 calls when `guess` is it, ~2·log2(n)
    at worst."""
    low, high = -1, n  # predicate is false at low (or low is -1), true at high (or high is n)
    step = 1
    if predicate(guess):
        high = guess
        while high - step > low:
            if not predicate(high - step):
                low = high - step
                break
            high, step = high - step, step * 2
    else:
        low = guess
        while low + step < high:
            if predicate(low + step):
                high = low + step
                break
            low, step = low + step, step * 2
    while high - low > 1:
        middle = (low + high) // 2
        if predicate(middle):
            high = middle
        else:
            low = middle
    return high


def cut_points(history: Sequence[object], lead: int | None = None, resumed: bool = False) -> list[int]:
    """Where the kept part of `history` may start, ascending: after the leading instructions
    and the first item, at or before the last item, never between a call and its output
    (`resumed`: an output without its call has it before every cut)."""
    lead = leading_instructions(history) if lead is None else lead
    # split[i] > 0: a call before i has its output at or after i.
    split = [0] * (len(history) + 1)
    calls: dict[str, int] = {}
    for index, item in enumerate(history):
        if isinstance(item, FunctionCallItem | CustomToolCallItem):
            calls[item.call_id] = index
        elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
            call = calls.get(item.call_id)
            if call is None and resumed:
                call = -1
            if call is not None:
                split[call + 1] += 1
                split[index + 1] -= 1
    cuts, open_calls = [], 0
    for index in range(len(history)):
        open_calls += split[index]
        if index > lead and not open_calls:
            cuts.append(index)
    return cuts


def whole_from(items: Sequence[object]) -> int:
    """Where the newest items of a longer history (`items`, the older ones not read) may
    start: the first index no call's output at or after it has its call before it, or
    among the items not read. len(items) if there is none."""
    cuts = cut_points(items, -1, resumed=True)
    return cuts[0] if cuts else len(items)


def _size(item: object) -> int:
    """An item's size for the first guess: its text, and a little for its framing."""
    text = getattr(item, "arguments", None) or getattr(item, "input", None) or getattr(item, "text", "")
    return len(str(text)) + 16


def leading_instructions(history: Sequence[object]) -> int:
    """How many system/developer messages open `history` (both model families render them as
    the model's instructions)."""
    count = 0
    for item in history:
        if not (isinstance(item, MessageItem) and item.role in ("system", "developer")):
            break
        count += 1
    return count

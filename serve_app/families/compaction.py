"""A history with compaction items, as the model reads it.

The last `compaction` item (opened: its summary and `keep_chars`, runtime/compaction.py)
stands for everything before it except the leading instructions and the latest user
messages, as many as fit in `keep_chars` characters (newest first, whole messages: what
`POST /v1/responses/compact` returned beside the item). The model reads the instructions,
then the summary as its own earlier message, then those user messages, then what came after
the item. Earlier compaction items are part of what the last one summarised.
"""

from __future__ import annotations

from serve_app.api.errors import invalid_request
from serve_app.api.items import CompactionItem, HistoryItem, MessageItem
from serve_app.families.truncation import leading_instructions

SUMMARY_PREFIX = "Summary of the conversation so far:\n\n"
# The model's task, written for both families: what a later turn needs, in the model's words.
SUMMARY_REQUEST = (
    "Compact the conversation so far: write a summary that replaces it. Keep every fact, "
    "name, number, decision, requirement and open task that a later turn may need, the "
    "results of tool calls that matter, and what the user asked for last. Leave out "
    "greetings and repetition. Write only the summary."
)
# The replay models' own question for what they would keep (engines/replay.py).
RECALL_REQUEST = "What should you remember?"
REMEMBER = "Remember:"  # the replay models' summary: the conversation's lines that start so


def kept_user_messages(items: list[HistoryItem], keep_chars: int) -> list[int]:
    """Indexes of the latest user messages of `items` that fit in `keep_chars`, in order."""
    kept: list[int] = []
    left = keep_chars
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if isinstance(item, MessageItem) and item.role == "user":
            if len(item.text) > left:
                break
            left -= len(item.text)
            kept.append(index)
    return kept[::-1]


def compacted(items: list[HistoryItem]) -> list[tuple[int, HistoryItem]]:
    """The items the model reads, each with its index in `items` (errors name it); the last
    compaction item as an assistant message of its summary."""
    last = next((index for index in range(len(items) - 1, -1, -1) if isinstance(items[index], CompactionItem)), None)
    if last is None:
        return list(enumerate(items))
    compaction = items[last]
    assert isinstance(compaction, CompactionItem)
    if compaction._summary is None:  # every path opens them first (runtime/compaction.py)
        raise invalid_request("A compaction item could not be read.", param=f"input[{last}]")
    summary = MessageItem(role="assistant", content=SUMMARY_PREFIX + compaction._summary)
    before = items[:last]
    lead = leading_instructions(before)
    kept = kept_user_messages(before[lead:], compaction._keep_chars)
    return [
        *((index, before[index]) for index in range(lead)),
        (last, summary),
        *((lead + index, before[lead + index]) for index in kept),
        *((index, items[index]) for index in range(last + 1, len(items))),
    ]

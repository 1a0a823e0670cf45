"""Compaction: a conversation turned into a summary the model writes, sealed in a
`compaction` item, so later turns read the summary instead of everything it stands for.

`POST /v1/responses/compact` and `context_management` (a response whose prompt is over its
`compact_threshold`) both ask the model itself, with the conversation as it is and
`SUMMARY_REQUEST` as the last user message (no tools, low reasoning effort, at most
`SUMMARY_MAX_TOKENS`; the oldest items left out if the conversation is over the context).
The summary is sealed with the server's reasoning keys for the caller's tenant
(`ReasoningCipher.seal_compaction`): a client cannot read, change or forge one, and another
tenant's is a 400. How the model then reads a history with compaction items:
`families/compaction.py`. The run itself: `runtime/run.py` (`summarize`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from openai.types.responses import ResponseCompactionItem, ResponseUsage

from serve_app.api.errors import invalid_request
from serve_app.api.items import CompactionItem, HistoryItem, InputItem, MessageItem
from serve_app.api.request import ReasoningConfig, ResponsesRequest
from serve_app.core.encrypted_reasoning import ReasoningCipher
from serve_app.core.stream import new_id
from serve_app.families.compaction import SUMMARY_REQUEST, kept_user_messages
from serve_app.families.truncation import leading_instructions

SUMMARY_MAX_TOKENS = 2048
# The latest user messages that stay beside the summary, in characters (context_management:
# at most its threshold's number, so a compacted prompt stays well under it).
KEEP_USER_CHARS = 8192


def summary_request(
    model: str,
    input_items: Sequence[InputItem | HistoryItem] | str | None,
    *,
    instructions: str | None,
    previous_response_id: str | None = None,
    conversation: str | None = None,
    prompt_cache_key: str | None = None,
) -> ResponsesRequest:
    """The request that makes the model summarise the conversation of `input_items` (after
    `previous_response_id`'s, or a `conversation`'s)."""
    items: list[Any] = [MessageItem(role="user", content=input_items)] if isinstance(input_items, str) else list(input_items or [])
    return ResponsesRequest(
        model=model,
        input=[*items, MessageItem(role="user", content=SUMMARY_REQUEST)],
        instructions=instructions,
        previous_response_id=previous_response_id,
        conversation=conversation,
        prompt_cache_key=prompt_cache_key,
        store=False,
        tool_choice="none",
        reasoning=ReasoningConfig(effort="low"),
        max_output_tokens=SUMMARY_MAX_TOKENS,
        truncation="auto",
    )


def open_compactions(history: list[HistoryItem], cipher: ReasoningCipher, input_count: int) -> list[HistoryItem]:
    """`history` with every compaction item opened (the last `input_count` items are this
    request's input, named by their place in errors); a blob that does not open for this
    tenant is a 400."""
    opened = list(history)
    first_input = len(history) - input_count
    for index, item in enumerate(history):
        if not isinstance(item, CompactionItem):
            continue
        where = f"input[{index - first_input}]" if index >= first_input else "the conversation's earlier items"
        try:
            summary, keep_chars = cipher.open_compaction(item.encrypted_content)
        except ValueError as exc:
            raise invalid_request(
                f"The encrypted content of the compaction item in {where} could not be decrypted: {exc}. "
                "Send compaction items back exactly as this server returned them.",
                param=f"{where}.encrypted_content" if index >= first_input else None,
                code="invalid_encrypted_content",
            ) from None
        copy = item.model_copy()
        copy._summary, copy._keep_chars = summary, keep_chars
        opened[index] = copy
    return opened


def sealed_item(summary: str, keep_chars: int, cipher: ReasoningCipher) -> ResponseCompactionItem:
    return ResponseCompactionItem(id=new_id("cmp"), type="compaction", encrypted_content=cipher.seal_compaction(summary, keep_chars))


@dataclass(frozen=True, slots=True)
class Compacted:
    """A compaction made inside a response (`context_management`)."""

    item: ResponseCompactionItem  # the output item
    opened: CompactionItem  # the same as a history item, opened
    usage: ResponseUsage | None  # the summary's


def compacted_item(summary: str, keep_chars: int, usage: ResponseUsage | None, cipher: ReasoningCipher) -> Compacted:
    item = sealed_item(summary, keep_chars, cipher)
    opened = CompactionItem(type="compaction", id=item.id, encrypted_content=item.encrypted_content)
    opened._summary, opened._keep_chars = summary, keep_chars
    return Compacted(item, opened, usage)


def compacted_window(window: list[HistoryItem], item: ResponseCompactionItem, keep_chars: int) -> list[dict[str, Any]]:
    """`POST /v1/responses/compact`'s output: the latest user messages of `window` that stay
    (as input messages, the shape a client sends back), then the compaction item."""
    lead = leading_instructions(window)
    kept = [window[lead + index] for index in kept_user_messages(window[lead:], keep_chars)]
    messages = [
        {
            "id": message.id or new_id("msg"),
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_text", "text": message.text}],
        }
        for message in kept
        if isinstance(message, MessageItem)
    ]
    return [*messages, item.model_dump(mode="json", exclude_none=True)]


def compaction_object(output: list[dict[str, Any]], usage: ResponseUsage | None) -> dict[str, Any]:
    """The `response.compaction` object (the openai SDK's `CompactedResponse`)."""
    return {
        "id": new_id("resp"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": output,
        "usage": usage.model_dump(mode="json") if usage is not None else None,
    }

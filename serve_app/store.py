"""Stored responses, so a later request can continue with `previous_response_id`.

What is stored is the conversation as input items (the request's history plus the
response's output) and the final `Response`. Only finished responses are stored, never a
half-written one. The in-memory store is per ingress replica and bounded (oldest first out).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from openai.types.responses import Response, ResponseFunctionToolCall, ResponseOutputMessage, ResponseReasoningItem

from .protocol.harmony import HistoryItem
from .protocol.request import FunctionCallItem, MessageItem, ReasoningItem, ReasoningText


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: Response
    conversation: list[HistoryItem]  # every input item so far, then this response's output


def output_as_input(response: Response) -> list[HistoryItem]:
    """The response's output items in the form a client would send them back."""
    items: list[HistoryItem] = []
    for item in response.output:
        if isinstance(item, ResponseOutputMessage):
            text = "".join(getattr(part, "text", "") for part in item.content)
            items.append(MessageItem(role="assistant", content=text, id=item.id))
        elif isinstance(item, ResponseReasoningItem):
            content = [ReasoningText(text=part.text) for part in item.content or []]
            items.append(ReasoningItem(type="reasoning", id=item.id, content=content))
        elif isinstance(item, ResponseFunctionToolCall):
            items.append(
                FunctionCallItem(
                    type="function_call",
                    id=item.id,
                    call_id=item.call_id,
                    name=item.name,
                    namespace=item.namespace,
                    arguments=item.arguments,
                )
            )
    return items


class InMemoryStore:
    def __init__(self, max_entries: int = 10_000) -> None:
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._max_entries = max_entries

    def get(self, response_id: str) -> StoredResponse | None:
        return self._entries.get(response_id)

    def put(self, response: Response, history: list[HistoryItem]) -> None:
        self._entries[response.id] = StoredResponse(response, history + output_as_input(response))
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

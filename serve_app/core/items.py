"""The two sides of a completion parser, as protocols.

A parser (harmony, chat template) turns completion tokens into item operations; the
`ResponseStream` state machine receives them and turns them into events.
"""

from __future__ import annotations

from typing import Literal, Protocol

# A message's phase: `commentary` (a preamble before tool calls) or `final_answer`.
Phase = Literal["commentary", "final_answer"]


class ItemSink(Protocol):
    """What a completion parser drives: the `ResponseStream` state machine."""

    def open_reasoning(self) -> None: ...
    def open_message(self, phase: Phase | None) -> None: ...
    def open_function_call(self, name: str, namespace: str | None, json_arguments: bool = True) -> None: ...
    def add_text(self, text: str) -> None: ...
    def close_item(self) -> None: ...


class CompletionParser(Protocol):
    """Turns completion tokens into item operations on an `ItemSink`."""

    reasoning_tokens: int

    @property
    def held_text(self) -> str: ...  # decoded text held back for now (logprobs: its tokens have not shown yet)

    def feed(self, token_ids: list[int]) -> None: ...
    def end(self, truncated: bool = False) -> None: ...  # truncated: by the token limit

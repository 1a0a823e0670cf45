"""Models that speak their tokenizer's chat template (SmolLM2, Qwen, Llama ...): minimal path.

The prompt is rendered by `transformers`' `apply_chat_template` with the model's own
template; the completion is one `message` item of detokenized text. Reasoning (`<think>`)
and tool-call parsing for these models are not implemented yet: their tools are not offered
and function-call history is rejected with a clear 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterable

from .errors import invalid_request
from .harmony import HistoryItem
from .items import ItemSink
from .request import FunctionCallItem, FunctionCallOutputItem, MessageItem, ResponsesRequest

_ROLE = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
# A run of tokens that decodes to an unfinished UTF-8 character is held back; a model may
# also write bytes that never form one, which are released after this many tokens.
_MAX_HELD_TOKENS = 4


class ChatTemplateModel:
    """Rendering, stop tokens and completion parser for one chat-template tokenizer."""

    def __init__(self, tokenizer_path: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer at {tokenizer_path} has no chat template")
        self.stop_token_ids = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []

    def render_prompt(self, request: ResponsesRequest, history: list[HistoryItem]) -> list[int]:
        conversation: list[dict[str, str]] = []
        if request.instructions:
            conversation.append({"role": "system", "content": request.instructions})
        for index, item in enumerate(history):
            if isinstance(item, (FunctionCallItem, FunctionCallOutputItem)):
                raise invalid_request(
                    f"Model '{request.model}' has no tool-call parser configured, so it cannot take "
                    f"'{item.type}' items.",
                    param=f"input[{index}]",
                )
            if isinstance(item, MessageItem):
                conversation.append({"role": _ROLE[item.role], "content": item.text})
            # Reasoning items are dropped: this path has no reasoning channel to give them back to.
        rendered: Any = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
        if isinstance(rendered, Mapping):  # transformers 5 returns a BatchEncoding
            rendered = rendered["input_ids"]
        return list(rendered)

    def parser(self, sink: ItemSink) -> ChatTextParser:
        return ChatTextParser(self.tokenizer, sink)


class ChatTextParser:
    """Completion tokens -> one message item, detokenized incrementally.

    Tokens are decoded as they come; a piece that ends in an unfinished UTF-8 character
    (U+FFFD at its end) waits for the next token, so no character is ever split or
    replaced, and no text is emitted twice.
    """

    reasoning_tokens = 0

    def __init__(self, tokenizer: Any, sink: ItemSink) -> None:
        self._decode = tokenizer.decode
        self._special = set(tokenizer.all_special_ids)
        self._sink = sink
        self._held: list[int] = []
        self._open = False

    def feed(self, token_ids: Iterable[int]) -> None:
        pieces: list[str] = []
        for token in token_ids:
            if token in self._special:
                continue  # end-of-turn markers are not text
            self._held.append(token)
            text = self._decode(self._held, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            if text.endswith("\ufffd") and len(self._held) < _MAX_HELD_TOKENS:
                continue
            self._held.clear()
            pieces.append(text)
        if not self._open:
            self._sink.open_message("final_answer")
            self._open = True
        if pieces:
            self._sink.add_text("".join(pieces))

    def end(self) -> None:
        if self._held:  # bytes that never became a character: keep them visible, not lost
            self._sink.add_text(self._decode(self._held, skip_special_tokens=True, clean_up_tokenization_spaces=False))
            self._held.clear()

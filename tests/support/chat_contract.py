"""The Chat Completions stream contract as one reusable check (tests and bench.vs_vllm run it on
both servers' streams): every chunk a `ChatCompletionChunk`, one id and model, tool calls keep
their index and id, one `finish_reason` (the last choice chunk), the usage chunk (when asked)
after it with no choices, `[DONE]` last. Returns the answer the chunks add up to, to compare
with the non-streamed completion."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion_usage import CompletionUsage

FINISH_REASONS = {"stop", "length", "tool_calls", "content_filter", "function_call"}


@dataclass
class ChatAnswer:
    content: str = ""
    reasoning: str = ""
    tool_calls: dict[int, dict[str, str]] = field(default_factory=dict)  # index -> {id, name, arguments}
    finish_reason: str | None = None
    usage: CompletionUsage | None = None

    def same_as(self, completion: ChatCompletion) -> bool:
        """Whether the chunks add up to this non-streamed completion (content, reasoning, tool calls, finish)."""
        choice = completion.choices[0]
        message = choice.message
        calls = {
            index: {"name": call.function.name, "arguments": call.function.arguments}
            for index, call in enumerate(message.tool_calls or [])
            if call.type == "function"
        }
        mine = {index: {"name": call["name"], "arguments": call["arguments"]} for index, call in self.tool_calls.items()}
        reasoning = reasoning_of(message)
        return (
            (message.content or "") == self.content
            and reasoning == self.reasoning
            and calls == mine
            and choice.finish_reason == self.finish_reason
        )


def reasoning_of(message: object) -> str:
    """`reasoning_content` (ours, and vLLM's older field) or `reasoning` (vLLM's newer one)."""
    return getattr(message, "reasoning_content", None) or getattr(message, "reasoning", None) or ""


def parse_chat_sse(raw: bytes) -> tuple[list[dict], bool]:
    """The JSON chunks of an SSE body and whether `data: [DONE]` ended it."""
    chunks, done = [], False
    for block in raw.decode("utf-8").split("\n\n"):
        data = "".join(line[len("data:") :].strip() for line in block.splitlines() if line.startswith("data:"))
        if not data:
            continue
        if done:
            raise AssertionError("data after [DONE]")
        if data == "[DONE]":
            done = True
        else:
            chunks.append(json.loads(data))
    return chunks, done


def check_chat_stream(raw: bytes, include_usage: bool) -> ChatAnswer:
    """Raises AssertionError at the first broken rule; else the answer the chunks add up to."""
    chunks, done = parse_chat_sse(raw)
    assert done, "the stream did not end with [DONE]"
    assert chunks, "no chunks"
    assert "error" not in chunks[-1], f"the stream failed: {chunks[-1]['error']}"
    parsed = [ChatCompletionChunk.model_validate(chunk) for chunk in chunks]
    assert len({chunk.id for chunk in parsed}) == 1, "chunks of one completion carry different ids"
    assert len({chunk.model for chunk in parsed}) == 1, "chunks of one completion name different models"
    answer = ChatAnswer()
    ids: dict[int, str] = {}
    for position, chunk in enumerate(parsed):
        if chunk.usage is not None and not chunk.choices:
            assert include_usage, "a usage chunk nobody asked for"
            assert position == len(parsed) - 1, "the usage chunk is not the last"
            assert answer.finish_reason is not None, "usage before the finish_reason"
            answer.usage = chunk.usage
            continue
        assert len(chunk.choices) == 1, "one choice a chunk"
        assert chunk.choices[0].index == 0, "the choice at index 0"
        assert answer.finish_reason is None, "a chunk after the finish_reason"
        choice = chunk.choices[0]
        delta = choice.delta
        answer.content += delta.content or ""
        answer.reasoning += reasoning_of(delta)
        for call in delta.tool_calls or []:
            entry = answer.tool_calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            if call.id:
                assert ids.setdefault(call.index, call.id) == call.id, f"tool call {call.index} changed its id"
                entry["id"] = call.id
            if call.function is not None:
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
        if choice.finish_reason is not None:
            assert choice.finish_reason in FINISH_REASONS, f"finish_reason {choice.finish_reason!r}"
            answer.finish_reason = choice.finish_reason
    assert answer.finish_reason is not None, "no finish_reason"
    assert not include_usage or answer.usage is not None, "include_usage asked, no usage chunk"
    for index, call in answer.tool_calls.items():
        assert call["id"], f"tool call {index} without an id"
        assert call["name"], f"tool call {index} without a name"
    if answer.finish_reason == "tool_calls":
        assert answer.tool_calls, "finish_reason tool_calls without a tool call"
    return answer

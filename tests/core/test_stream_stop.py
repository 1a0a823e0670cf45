"""Stop sequences through the response stream (harmony): for any completion, any stop
sequences and any batching, the streamed chunks' content is the non-streamed completion's,
which is each message's text up to the first stop sequence; reasoning and tool-call
arguments are never cut; the response ends at the batch holding the stop, and its usage
counts every token generated up to there."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import Message, Role

from serve_app.api.chat import ChatChunks, chat_completion
from serve_app.api.request import ResponsesRequest
from serve_app.core.stop import cut
from serve_app.core.stream import ResponseStream
from serve_app.core.tokens import TokenBatch
from serve_app.families.harmony import HarmonyParser, render_completion
from tests.core.test_stop import ALPHABET, stop_lists
from tests.core.test_stream_properties import partition

REQUEST = ResponsesRequest.model_validate({"model": "m", "input": "hi"})
texts = st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=30).map("".join)


def _message(text: str, channel: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


@st.composite
def completions(draw):
    """Harmony tokens: reasoning, maybe a preamble, then an answer or a function call."""
    reasoning, preamble = draw(texts), draw(st.none() | texts)
    messages = [_message(reasoning, "analysis")]
    if preamble is not None:
        messages.append(_message(preamble, "commentary"))
    if draw(st.booleans()):
        answer = draw(texts)
        messages.append(_message(answer, "final"))
        return render_completion(messages), reasoning, [m for m in (preamble, answer) if m is not None], None
    arguments = json.dumps({"q": draw(texts)})
    messages.append(_message(arguments, "commentary").with_recipient("functions.lookup").with_content_type("<|constrain|>json"))
    return render_completion(messages), reasoning, [preamble] if preamble is not None else [], arguments


@pytest.mark.slow
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(completions(), stop_lists, st.lists(st.integers(1, 6), max_size=100))
def test_any_batching_stops_where_the_text_does(completion, stops, sizes):
    tokens, reasoning, messages, arguments = completion
    content, stopped = "", False
    for text in messages:
        content += cut(text, stops)
        if any(stop in text for stop in stops):
            stopped = True
            break
    for batches in ([tokens], [[t] for t in tokens], partition(tokens, sizes)):
        stream = ResponseStream(REQUEST, parser_factory=HarmonyParser, stop=stops)
        chunker = ChatChunks("m", include_usage=True)
        chunks = chunker.chunks(stream.start())
        fed = 0
        for index, batch in enumerate(batches):
            fed += len(batch)
            chunks += chunker.chunks(stream.feed(TokenBatch(batch, finish_reason="stop" if index == len(batches) - 1 else None)))
            if stream.finished:
                break
        assert stream.finished
        assert stream.stopped == stopped
        assert stream.response.usage.output_tokens == fed  # every token generated, the stop's batch too
        whole = chat_completion(stream.response, "m", with_logprobs=False).choices[0]
        deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
        assert "".join(delta.content or "" for delta in deltas) == (whole.message.content or "") == content
        assert "".join(getattr(delta, "reasoning_content", None) or "" for delta in deltas) == whole.message.reasoning_content == reasoning
        calls = whole.message.tool_calls or []
        assert [call.function.arguments for call in calls] == ([] if stopped or arguments is None else [arguments])
        assert whole.finish_reason == ("tool_calls" if calls else "stop")

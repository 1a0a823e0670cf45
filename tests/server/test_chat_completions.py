"""`POST /v1/chat/completions` on the Responses path: both families, through the `openai`
SDK (whose types check every chunk and completion; LangChain's default `ChatOpenAI` and
Pydantic AI's `OpenAIChatModel` run in tests/support/framework_scenarios.py, in-process
and through Serve); streamed and not, reasoning apart from content, tool calls and their
results, structured outputs, logprobs, the token limit, and the 400s for what is not
supported."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel

from serve_app.api.chat import ChatChunks, chat_completion
from serve_app.api.request import ResponsesRequest
from serve_app.core.stream import ResponseStream
from serve_app.core.tokens import TokenBatch
from serve_app.families.harmony import HarmonyParser
from tests.core.test_stream_properties import completions, partition
from tests.support.chat_contract import check_chat_stream
from tests.support.clients import needs_vercel_ai, vercel_ai
from tests.support.slow_reader import read_slowly, sse_data

FAMILIES = ["gpt-oss-replay", "qwen3-replay"]
LOOKUP = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
}


@pytest.fixture
def client(inprocess_url):
    return OpenAI(base_url=inprocess_url, api_key="unused", max_retries=0)


def streamed(client: OpenAI, **body) -> dict:
    """A streamed completion put together the way clients do: content, reasoning, calls."""
    content, reasoning, calls, finish, usage = [], [], {}, None, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **body):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            reasoning.append(getattr(delta, "reasoning_content", None) or "")
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = entry["id"] or call.id
                entry["name"] += call.function.name or "" if call.function else ""
                entry["arguments"] += (call.function.arguments or "") if call.function else ""
            finish = choice.finish_reason or finish
    return {"content": "".join(content), "reasoning": "".join(reasoning), "calls": list(calls.values()), "finish": finish, "usage": usage}


def collected(completion) -> dict:
    message = completion.choices[0].message
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]
    reasoning = getattr(message, "reasoning_content", None) or ""
    return {"content": message.content or "", "reasoning": reasoning, "calls": calls, "finish": completion.choices[0].finish_reason}


@pytest.mark.parametrize("model", FAMILIES)
def test_an_answer_streamed_and_not_is_the_same_with_reasoning_apart(client, model):
    body = {"model": model, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo 👋 there"}]}
    completion = client.chat.completions.create(**body)
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    whole = collected(completion)
    assert whole["content"] == "héllo 👋 there"
    assert whole["finish"] == "stop"
    if model == "gpt-oss-replay":
        assert whole["reasoning"] == f"The user wrote {len('héllo 👋 there')} characters."
    assert "characters" not in whole["content"]
    usage = completion.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.completion_tokens_details.reasoning_tokens > 0
    stream = streamed(client, **body)
    assert {key: stream[key] for key in whole} == {**whole, "calls": []}
    assert stream["usage"].completion_tokens == usage.completion_tokens


@pytest.mark.parametrize("model", FAMILIES)
@pytest.mark.parametrize("separator", ["\u0085", "\u2028", "\x1c", "\r"])
def test_a_tool_described_with_a_line_separator_is_still_offered(client, model, separator):
    """Unicode line separators inside a tool's JSON are text, not the template's lines (the
    qwen3 replay split them as lines: a 503, found by the schema fuzzer)."""
    tool = {"type": "function", "function": {**LOOKUP["function"], "description": f"a{separator}b"}}
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": 'call lookup {"city": "Oslo"}'}], tools=[tool]
    )
    assert answer.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("model", FAMILIES)
def test_a_tool_call_and_its_result_round_trip(client, model):
    messages = [{"role": "user", "content": 'call lookup {"city": "Oslo"}'}]
    first = client.chat.completions.create(model=model, messages=messages, tools=[LOOKUP])
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("lookup", {"city": "Oslo"})
    stream = streamed(client, model=model, messages=messages, tools=[LOOKUP])
    assert [(c["name"], json.loads(c["arguments"])) for c in stream["calls"]] == [("lookup", {"city": "Oslo"})]
    assert stream["calls"][0]["id"].startswith("call_")
    assert stream["finish"] == "tool_calls"
    back = [
        *messages,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    answer = client.chat.completions.create(model=model, messages=back, tools=[LOOKUP])
    assert answer.choices[0].message.content == "Tool lookup returned: sunny"
    forced = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        tools=[LOOKUP],
        tool_choice={"type": "function", "function": {"name": "lookup"}},
    )
    assert forced.choices[0].message.tool_calls[0].function.name == "lookup"
    none = client.chat.completions.create(model=model, messages=messages, tools=[LOOKUP], tool_choice="none")
    assert none.choices[0].message.tool_calls is None


class Plan(BaseModel):
    city: str
    days: int


@pytest.mark.parametrize("model", FAMILIES)
def test_structured_outputs_parse_into_a_pydantic_model(client, model):
    parsed = client.chat.completions.parse(model=model, messages=[{"role": "user", "content": "Plan a trip."}], response_format=Plan)
    assert isinstance(parsed.choices[0].message.parsed, Plan)
    json_object = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Answer in json."}], response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(json_object.choices[0].message.content), dict)


@pytest.mark.parametrize("model", FAMILIES)
def test_logprobs_cover_the_content_and_the_limit_is_a_length_finish(client, model):
    completion = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "abc def"}], logprobs=True, top_logprobs=2
    )
    tokens = completion.choices[0].logprobs.content
    assert "".join(t.token for t in tokens) == completion.choices[0].message.content
    assert all(t.bytes == list(t.token.encode()) for t in tokens)
    cut = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "a long answer " * 20}], max_completion_tokens=12
    )
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage.completion_tokens == 12
    legacy = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "a long answer " * 20}], max_tokens=12)
    assert legacy.usage.completion_tokens == 12


@pytest.mark.parametrize("model", FAMILIES)
def test_a_stop_sequence_ends_the_content_and_the_generation(client, model, replay_backend):
    """The content ends before the first stop sequence (the reasoning never does), the
    finish is `stop`, streamed and not, and the engine request ends there: usage counts the
    tokens generated up to the stop, far fewer than the whole answer's."""
    text = "Once upon a time STOP " + "and then more words " * 40
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    full = client.chat.completions.create(**body)
    steps = replay_backend.num_steps
    stopped = client.chat.completions.create(**body, stop=["STOP", "never"])
    assert collected(stopped) == {**collected(full), "content": "Once upon a time ", "finish": "stop"}
    assert stopped.usage.completion_tokens < full.usage.completion_tokens / 2
    if model == "gpt-oss-replay":  # the engine was not asked for the rest
        assert replay_backend.num_steps - steps < stopped.usage.completion_tokens
    stream = streamed(client, **body, stop="STOP")
    assert {key: stream[key] for key in ("content", "reasoning", "finish")} == {
        key: collected(stopped)[key] for key in ("content", "reasoning", "finish")
    }
    assert stream["usage"].completion_tokens < full.usage.completion_tokens / 2
    split = client.chat.completions.create(**body, stop=[" a t"], logprobs=True)  # a stop spanning tokens
    assert split.choices[0].message.content == "Once upon"
    assert "".join(entry.token for entry in split.choices[0].logprobs.content) == "Once upon"  # the tokens of the text shown


@pytest.mark.parametrize(("stop", "param"), [([""], "stop[0]"), (["a", "b", "c", "d", "e"], "stop"), ("x" * 1025, "stop"), (7, "stop")])
def test_bad_stop_sequences_are_a_400_naming_them(client, stop, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="gpt-oss-replay", messages=[{"role": "user", "content": "hi"}], stop=stop)
    assert error.value.body["param"] == param


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"n": 2}, "n"), ({"logit_bias": {"50256": -100}}, "logit_bias"), ({"store": True}, "store")],
)
def test_what_is_not_supported_is_a_400_naming_it(client, extra, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="gpt-oss-replay", messages=[{"role": "user", "content": "hi"}], **extra)
    assert error.value.body["param"] == param


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream: true
    ],
)
def test_what_is_not_supported_is_a_400_naming_it_too(client, extra, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="gpt-oss-replay", messages=[{"role": "user", "content": "hi"}], **extra)
    assert error.value.body["param"].startswith(param)


UNSUPPORTED_SCHEMA = {"type": "object", "not": {"required": ["x"]}}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": UNSUPPORTED_SCHEMA}}},
            "response_format.json_schema.schema",
        ),
        ({"tools": [LOOKUP], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "messages"),  # the word 'json' is in no message
    ],
)
def test_errors_name_the_chat_requests_parameters_not_the_responses_ones(client, extra, param):
    """The request runs as a Responses request: its errors still speak of this one's fields."""
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="gpt-oss-replay", messages=[{"role": "user", "content": "hi"}], **extra)
    assert error.value.body["param"] == param
    assert "text.format" not in error.value.body["message"]


def test_bad_requests_are_openai_shaped(inprocess_url):
    with httpx.Client(timeout=30) as http:
        unknown = http.post(f"{inprocess_url}/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "model_not_found")
        empty = http.post(f"{inprocess_url}/chat/completions", json={"model": "gpt-oss-replay", "messages": []})
        assert empty.status_code == 400
        assert empty.json()["error"]["param"] == "messages"
        orphan = http.post(
            f"{inprocess_url}/chat/completions",
            json={"model": "gpt-oss-replay", "messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]},
        )
        assert (orphan.status_code, orphan.json()["error"]["param"]) == (400, "messages[1].tool_call_id")


@pytest.mark.parametrize("model", FAMILIES)
@pytest.mark.parametrize("tools", [False, True])
def test_the_raw_stream_keeps_the_chunk_contract_and_adds_up_to_the_completion(inprocess_url, model, tools):
    """The bytes on the wire (tests/support/chat_contract.py, which bench.vs_vllm also runs on
    vLLM's server): one id, stable tool-call index and id, one finish_reason, usage last, [DONE]."""
    text = 'call lookup {"city": "Paris"}' if tools else "héllo 👋 there"
    body = {"model": model, "messages": [{"role": "user", "content": text}]} | ({"tools": [LOOKUP]} if tools else {})
    with httpx.Client(timeout=30) as http:
        whole = ChatCompletion.model_validate(http.post(f"{inprocess_url}/chat/completions", json=body).json())
        raw = http.post(
            f"{inprocess_url}/chat/completions", json=body | {"stream": True, "stream_options": {"include_usage": True}}
        ).content
    answer = check_chat_stream(raw, include_usage=True)
    assert answer.same_as(whole)
    assert answer.finish_reason == ("tool_calls" if tools else "stop")
    assert answer.usage is not None
    assert whole.usage is not None
    # (the second request may find its prompt cached: cached_tokens may differ)
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (whole.usage.prompt_tokens, whole.usage.completion_tokens)
    with pytest.raises(AssertionError, match="DONE"):
        check_chat_stream(raw.removesuffix(b"data: [DONE]\n\n"), include_usage=True)


@pytest.mark.slow
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(completions(), st.lists(st.integers(1, 9), max_size=200))
def test_the_chunks_of_any_batching_add_up_to_the_completion(completion, sizes):
    """For any harmony completion and any batching, the chunks' content, reasoning and
    tool-call arguments put together are the non-streamed completion's."""
    tokens, _ = completion
    request = ResponsesRequest.model_validate({"model": "m", "input": "hi", "tools": [{"type": "custom", "name": "apply_patch"}]})
    for batches in ([tokens], partition(tokens, sizes)):
        stream = ResponseStream(request, parser_factory=HarmonyParser)
        chunks = ChatChunks("m", include_usage=True)
        out = chunks.chunks(stream.start())
        for index, batch in enumerate(batches):
            last = index == len(batches) - 1
            out += chunks.chunks(stream.feed(TokenBatch(batch, finish_reason="stop" if last else None, num_prompt_tokens=3)))
        whole = chat_completion(stream.response, "m", with_logprobs=False).choices[0]
        content = "".join(c.choices[0].delta.content or "" for c in out if c.choices)
        reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in out if c.choices)
        arguments = "".join(call.function.arguments or "" for c in out if c.choices for call in c.choices[0].delta.tool_calls or [])
        assert content == (whole.message.content or "")
        assert reasoning == (getattr(whole.message, "reasoning_content", None) or "")
        assert arguments == "".join(call.function.arguments for call in whole.message.tool_calls or [])
        finishes = [c.choices[0].finish_reason for c in out if c.choices and c.choices[0].finish_reason]
        assert finishes == [whole.finish_reason]
        assert out[-1].usage is not None
        assert not out[-1].choices


@needs_vercel_ai
@pytest.mark.parametrize("model", FAMILIES)
@pytest.mark.parametrize("scenario", ["chat-generate", "chat-stream"])
def test_the_vercel_ai_sdk_chat_provider_runs_a_tool_loop(inprocess_url, model, scenario):
    """`openai.chat(model)` of `@ai-sdk/openai`, unmodified: generateText and streamText with a
    tool the SDK runs, over several steps."""
    run = vercel_ai(inprocess_url, model, scenario, "sk-unused")
    assert run["ok"], run
    assert run["result"]["text"] == "Tool lookup returned: sunny in Paris"
    assert run["result"]["steps"] == 2
    assert all("messages" in body for body in run["sent"])  # Chat Completions bodies


def _answer_of(chunks: list[ChatCompletionChunk]) -> dict:
    """A streamed completion put together: content, reasoning, calls (name and arguments), finish, usage."""
    content, reasoning, calls, finish, usage = "", "", {}, None, None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                assert call.id in (None, entry["id"])  # a stable id
                entry["name"] += (call.function.name or "") if call.function else ""
                entry["arguments"] += (call.function.arguments or "") if call.function else ""
            finish = choice.finish_reason or finish
    return {"content": content, "reasoning": reasoning, "calls": list(calls.values()), "finish": finish, "usage": usage}


@pytest.mark.slow
@settings(max_examples=12, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    model=st.sampled_from(FAMILIES),
    ask=st.one_of(
        st.tuples(st.text(st.sampled_from('ab é👍\n{}"'), min_size=1, max_size=80), st.integers(1, 12)).map(lambda pair: pair[0] * pair[1]),
        st.text(st.sampled_from("ab é👍"), min_size=1, max_size=20).map(lambda city: "call lookup " + json.dumps({"city": city})),
    ),
    seed=st.integers(0, 2**16),
    sizes=st.lists(st.integers(1, 48), min_size=1, max_size=16),
    pauses=st.lists(st.sampled_from([0.0, 0.0, 0.0005, 0.002]), min_size=1, max_size=8),
    stop=st.none() | st.lists(st.sampled_from(["b", "é👍", " a", "\n\n"]), min_size=1, max_size=2),
)
def test_a_slow_reader_gets_the_non_streamed_answer(inprocess_url, model, ask, seed, sizes, pauses, stop):
    """For random batchings (the replay engine's steps, drawn from the request's `seed`) and a
    client that reads its stream a few bytes at a time with pauses (the server's writes
    block), the stream put together is the non-streamed answer: content, reasoning, the
    tool calls, the finish and the usage; with stop sequences too."""
    body = {"model": model, "messages": [{"role": "user", "content": ask}], "tools": [LOOKUP], "seed": seed, "stop": stop}
    with httpx.Client(timeout=60) as http:
        whole = ChatCompletion.model_validate(http.post(f"{inprocess_url}/chat/completions", json=body).json())
    stream = read_slowly(
        f"{inprocess_url}/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}, sizes, pauses
    )
    data = sse_data(stream)
    assert data[-1] == "[DONE]"
    got = _answer_of([ChatCompletionChunk.model_validate_json(frame) for frame in data[:-1]])
    message = whole.choices[0].message
    assert got["content"] == (message.content or "")
    assert got["reasoning"] == (getattr(message, "reasoning_content", None) or "")
    assert [(c["name"], c["arguments"]) for c in got["calls"]] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls or []
    ]
    assert got["finish"] == whole.choices[0].finish_reason
    assert got["usage"].completion_tokens == whole.usage.completion_tokens


def test_a_batchs_deltas_of_one_part_are_one_chunk_with_every_tokens_logprob():
    """An engine step's tokens come as one chunk (as vLLM writes them): fewer frames, the same text and logprobs."""
    from openai.types.responses import ResponseReasoningTextDeltaEvent, ResponseTextDeltaEvent
    from openai.types.responses.response_text_delta_event import Logprob

    def text(item: str, delta: str, index: int = 0) -> ResponseTextDeltaEvent:
        logprob = [Logprob(token=delta, logprob=-0.5)]
        return ResponseTextDeltaEvent(
            type="response.output_text.delta",
            item_id=item,
            output_index=0,
            content_index=index,
            delta=delta,
            logprobs=logprob,
            sequence_number=0,
        )

    reasoning = ResponseReasoningTextDeltaEvent(
        type="response.reasoning_text.delta", item_id="rs", output_index=0, content_index=0, delta="think", sequence_number=0
    )
    events = [reasoning, reasoning, text("msg", "Hel"), text("msg", "lo"), text("msg", "!", index=1), text("other", " x")]
    chunks = ChatChunks("m", include_usage=False)
    out = [c.choices[0].delta for c in chunks.chunks(events)]
    assert [(d.content, getattr(d, "reasoning_content", None)) for d in out] == [
        (None, "thinkthink"),
        ("Hello", None),
        ("!", None),
        (" x", None),
    ]
    merged = chunks.chunks([text("msg", "a"), text("msg", "b")])[0].choices[0].logprobs
    assert merged is not None
    assert [t.token for t in merged.content or []] == ["a", "b"]

"""Client-side scenarios with the official `openai` SDK, shared by the in-process and the
Ray Serve end-to-end suites: the same assertions whichever stack serves the app."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator

import httpx
from openai import OpenAI

from serve_app.server.routes.event_stream import KEEPALIVE
from tests.support.contract import check_stream, parse_sse

MODEL = "gpt-oss-replay"
# The scripted models follow the same rules (DESIGN.md), one in harmony, one in chat-template text.
REPLAY_MODELS = ["gpt-oss-replay", "qwen3-replay"]
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}


def client(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


def raw_stream(base_url: str, body: dict, allow_replacement: bool = False) -> list[dict]:
    """POST a streaming request and return the wire events, checked against the contract."""
    with httpx.Client(timeout=60) as http:
        response = http.post(f"{base_url}/responses", json={**body, "stream": True})
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(response.content)
    check_stream(events, allow_replacement=allow_replacement)
    return events


def event_chunks(response: httpx.Response) -> Iterator[bytes]:
    """The raw chunks of a stream that carry events: keep-alive comments alone are skipped."""
    return (chunk for chunk in response.iter_raw() if chunk.replace(KEEPALIVE, b""))


def cut_streams(base_url: str, bodies: list[dict]) -> None:
    """Open a stream per body, all at once, each client going away after 1 to 4 chunks."""

    def cut(index: int, body: dict) -> None:
        with httpx.Client(timeout=60) as http, http.stream("POST", f"{base_url}/responses", json=body) as response:
            for count, _ in enumerate(event_chunks(response)):
                if count >= 1 + index % 4:
                    break

    in_parallel(cut, list(enumerate(bodies)))


def in_parallel(call, cases: list[tuple]) -> list:
    """`call(*case)` for every case at once, so that the engine batches them (a real engine
    on 2 cores answers a dozen requests together in little more than one's time); the results
    in order, the first failure raised."""
    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        return list(pool.map(lambda case: call(*case), cases))


def output_texts(response) -> list[tuple[str, str]]:
    out = []
    for item in response.output:
        if item.type == "message":
            out.append(("message", item.content[0].text))
        elif item.type == "reasoning":
            out.append(("reasoning", item.content[0].text))
        elif item.type == "custom_tool_call":
            out.append(("custom_tool_call", item.input))
        else:  # NS.NAME for a function of namespace NS
            name = f"{item.namespace}.{item.name}" if item.namespace else item.name
            out.append(("function_call", f"{name} {item.arguments}"))
    return out


def non_stream_echo(base_url: str, model: str = MODEL) -> None:
    text = "Hello there, 世界 👋🏽"
    response = client(base_url).responses.create(model=model, input=text)
    assert response.status == "completed"
    assert response.output_text == text
    assert output_texts(response)[0] == ("reasoning", f"The user wrote {len(text)} characters.")
    assert response.usage.input_tokens > 0
    assert response.usage.output_tokens > 0
    assert response.usage.output_tokens_details.reasoning_tokens > 0


def stream_matches_non_stream(base_url: str, model: str = MODEL) -> None:
    text = "Streaming and non-streaming agree: é, 日本, 🇫🇷."
    with client(base_url).responses.create(model=model, input=text, stream=True) as stream:
        events = list(stream)
    terminal = check_stream(events)
    non_stream = client(base_url).responses.create(model=model, input=text)
    assert output_texts(terminal) == output_texts(non_stream)
    assert terminal.output_text == text


def stream_helper_accumulates(base_url: str, model: str = MODEL) -> None:
    with client(base_url).responses.stream(model=model, input="accumulate me ✓") as stream:
        events = list(stream)
        final = stream.get_final_response()
    terminal = events[-1]
    assert terminal.type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.id == terminal.response.id
    assert final.status == "completed"
    assert final.output_text == "accumulate me ✓"
    assert output_texts(final) == output_texts(terminal.response)
    assert final.usage == terminal.response.usage


def tool_call_round_trip(base_url: str, model: str = MODEL) -> None:
    sdk = client(base_url)
    user = {"role": "user", "content": 'call get_weather {"city": "Paris"}'}
    first = sdk.responses.create(model=model, input=[user], tools=[WEATHER_TOOL])
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1
    call = calls[0]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.call_id
    assert call.id.startswith("fc_")
    history = [user] + [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 °C"})
    second = sdk.responses.create(model=model, input=history, tools=[WEATHER_TOOL])
    assert second.output_text == "Tool get_weather returned: sunny, 21 °C"
    # The same turn through previous_response_id instead of resending the history.
    third = sdk.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "rain"}],
        tools=[WEATHER_TOOL],
    )
    assert third.output_text == "Tool get_weather returned: rain"


def codex_shaped_request(base_url: str, model: str = MODEL) -> None:
    """What `codex exec` sends: developer prompt, ids, namespace + web_search tools, include."""
    body = {
        "model": model,
        "instructions": None,
        "input": [
            {"type": "message", "role": "developer", "id": "msg_dev", "content": [{"type": "input_text", "text": "You are Codex."}]},
            {
                "type": "message",
                "role": "user",
                "id": "msg_u1",
                "content": [{"type": "input_text", "text": 'call shell {"command": ["ls"]}'}],
            },
        ],
        "tools": [
            {
                "type": "function",
                "name": "shell",
                "description": "Run a command",
                "strict": False,
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                    "required": ["command"],
                    "additionalProperties": False,
                },
            },
            {
                "type": "namespace",
                "name": "mcp_fs",
                "description": "Filesystem server",
                "tools": [
                    {"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
                ],
            },
            {"type": "web_search"},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0193-session",
        "client_metadata": {"originator": "codex_exec"},
    }
    events = raw_stream(base_url, body)
    terminal = events[-1]["response"]
    call = next(item for item in terminal["output"] if item["type"] == "function_call")
    assert (call["name"], json.loads(call["arguments"])) == ("shell", {"command": ["ls"]})
    # include asked for it: the reasoning is sealed, not readable in the blob.
    reasoning = next(item for item in terminal["output"] if item["type"] == "reasoning")
    assert reasoning["encrypted_content"]
    assert reasoning["content"][0]["text"] not in reasoning["encrypted_content"]
    # Codex's next turn: the reasoning item as it came (content null), the call with id and status, the output.
    body["input"] += [
        {"type": "reasoning", "id": reasoning["id"], "summary": [], "content": None, "encrypted_content": reasoning["encrypted_content"]},
        {
            "type": "function_call",
            "id": call["id"],
            "status": "completed",
            "call_id": call["call_id"],
            "name": "shell",
            "arguments": call["arguments"],
        },
        {"type": "function_call_output", "id": "fco_1", "call_id": call["call_id"], "output": "README.md"},
    ]
    events = raw_stream(base_url, body)
    final = [i for i in events[-1]["response"]["output"] if i["type"] == "message"][-1]
    assert final["content"][0]["text"] == "Tool shell returned: README.md"
    # A namespaced function is called as NAMESPACE.NAME.
    body["input"] = [{"role": "user", "content": 'call mcp_fs.read_file {"path": "a.txt"}'}]
    events = raw_stream(base_url, body)
    call = next(item for item in events[-1]["response"]["output"] if item["type"] == "function_call")
    assert (call["namespace"], call["name"]) == ("mcp_fs", "read_file")


def input_tokens_count(base_url: str, model: str = MODEL) -> None:
    """`responses.input_tokens.count` gives the prompt length the same request has when created."""
    sdk = client(base_url)
    user = {"role": "user", "content": 'call get_weather {"city": "Paris"}'}
    first = sdk.responses.create(model=model, input=[user], tools=[WEATHER_TOOL], instructions="Be brief.")
    count = sdk.responses.input_tokens.count(model=model, input=[user], tools=[WEATHER_TOOL], instructions="Be brief.")
    assert count.object == "response.input_tokens"
    assert count.input_tokens == first.usage.input_tokens
    call = next(item for item in first.output if item.type == "function_call")
    history = [user] + [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny"})
    count = sdk.responses.input_tokens.count(model=model, input=history, tools=[WEATHER_TOOL])
    second = sdk.responses.create(model=model, input=history, tools=[WEATHER_TOOL])
    assert count.input_tokens == second.usage.input_tokens > first.usage.input_tokens
    chained = sdk.responses.input_tokens.count(
        model=model,
        previous_response_id=first.id,
        tools=[WEATHER_TOOL],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )
    assert chained.input_tokens == second.usage.input_tokens
    with httpx.Client(timeout=30) as http:  # validated like a create request
        for body, status in (
            ({"model": "no-such-model", "input": "hi"}, 404),
            ({"model": model}, 400),
            ({"model": model, "input": "hi", "tools": [{"type": "function"}]}, 400),
        ):
            response = http.post(f"{base_url}/responses/input_tokens", json=body)
            assert response.status_code == status
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def max_output_tokens_incomplete(base_url: str, model: str = MODEL) -> None:
    response = client(base_url).responses.create(model=model, input="a long enough message", max_output_tokens=5)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 5
    events = raw_stream(base_url, {"model": model, "input": "a long enough message", "max_output_tokens": 5})
    assert events[-1]["type"] == "response.incomplete"


def concurrent_streams(base_url: str, count: int, model: str = MODEL) -> None:
    """`count` streams at once, each echoing its own text exactly."""

    def one(index: int) -> str:
        text = f"stream {index}:" + " é日👍🏽" * (index % 5 + 1)
        events = raw_stream(base_url, {"model": model, "input": text})
        message = next(i for i in events[-1]["response"]["output"] if i["type"] == "message")
        return text, message["content"][0]["text"]

    for expected, got in in_parallel(one, [(index,) for index in range(count)]):
        assert got == expected


# Whitespace the model writes is its answer: kept exactly, at the start and at the end.
WHITESPACE_TEXTS = [
    "concurrent stream #00 ünïcödé  abc abc abc ",
    "  two leading spaces",
    "\ttab around\t",
    "def f():\n    return 1\n",
    "\n\nnewlines first and last\n\n",
    " \t\n mixed \n\t ",
]


def whitespace_is_kept(base_url: str, model: str = MODEL) -> None:
    sdk = client(base_url)
    for text in WHITESPACE_TEXTS:
        assert sdk.responses.create(model=model, input=text).output_text == text
        with sdk.responses.create(model=model, input=text, stream=True) as stream:
            terminal = check_stream(list(stream))  # deltas == done == terminal, checked there
        assert terminal.output_text == text
    # A tool's output ending in a newline keeps it.
    user = {"role": "user", "content": "call get_weather"}
    call = next(
        item for item in sdk.responses.create(model=model, input=[user], tools=[WEATHER_TOOL]).output if item.type == "function_call"
    )
    history = [user, call.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": call.call_id, "output": "hi\n"}]
    assert sdk.responses.create(model=model, input=history, tools=[WEATHER_TOOL]).output_text == "Tool get_weather returned: hi\n"


def unknown_model_404(base_url: str, model: str = MODEL) -> None:
    with httpx.Client(timeout=30) as http:
        response = http.post(f"{base_url}/responses", json={"model": "no-such-model", "input": "hi"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


ALL = [
    non_stream_echo,
    stream_matches_non_stream,
    stream_helper_accumulates,
    tool_call_round_trip,
    codex_shaped_request,
    input_tokens_count,
    max_output_tokens_incomplete,
    whitespace_is_kept,
    unknown_model_404,
]

"""Two event dialects, one stream machine: OpenAI's names by default (the SDKs and Codex read
them), Open Responses' for a client that sends the spec's `OpenResponses-Version` header:
`response.reasoning.delta` / `.done` for OpenAI's `response.reasoning_text.*`, in every event
of the stream (SSE, WebSocket, a background response followed), never mixed."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.sync.client import connect

from tests.support.contract import parse_sse

HEADER = {"OpenResponses-Version": "latest"}
OPENAI_NAMES = {"response.reasoning_text.delta", "response.reasoning_text.done"}
SPEC_NAMES = {"response.reasoning.delta", "response.reasoning.done"}


def names(events: list[dict]) -> set[str]:
    return {event["type"] for event in events}


def reasoning_text(events: list[dict], delta: str, done: str) -> tuple[str, str]:
    streamed = "".join(event["delta"] for event in events if event["type"] == delta)
    (finished,) = [event["text"] for event in events if event["type"] == done]
    return streamed, finished


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
def test_sse_in_each_dialect(inprocess_url, model):
    body = {"model": model, "input": "think about this", "stream": True}
    with httpx.Client(timeout=60) as http:
        openai_events = parse_sse(http.post(f"{inprocess_url}/responses", json=body).content)
        spec_events = parse_sse(http.post(f"{inprocess_url}/responses", json=body, headers=HEADER).content)  # checks event: == type
    assert names(openai_events) >= OPENAI_NAMES
    assert not SPEC_NAMES & names(openai_events)
    assert names(spec_events) >= SPEC_NAMES
    assert not OPENAI_NAMES & names(spec_events)
    # Nothing else differs: the same events, renamed.
    assert [e["type"].replace("reasoning_text.", "reasoning.") for e in openai_events] == [e["type"] for e in spec_events]
    streamed, finished = reasoning_text(spec_events, "response.reasoning.delta", "response.reasoning.done")
    assert streamed == finished
    assert finished


def test_websocket_in_the_spec_dialect(inprocess_url):
    with connect(inprocess_url.replace("http://", "ws://") + "/responses", additional_headers=HEADER) as socket:
        socket.send(json.dumps({"type": "response.create", "model": "gpt-oss-replay", "input": "hi"}))
        events = []
        while not events or events[-1]["type"] != "response.completed":
            events.append(json.loads(socket.recv(timeout=30)))
    assert names(events) >= SPEC_NAMES
    assert not OPENAI_NAMES & names(events)


def test_a_followed_background_response_in_the_spec_dialect(inprocess_url):
    with httpx.Client(timeout=60) as http:
        started = http.post(f"{inprocess_url}/responses", json={"model": "gpt-oss-replay", "input": "hi", "background": True}).json()
        followed = http.get(f"{inprocess_url}/responses/{started['id']}", params={"stream": "true", "starting_after": -1}, headers=HEADER)
        events = parse_sse(followed.content)
        again = parse_sse(http.get(f"{inprocess_url}/responses/{started['id']}", params={"stream": "true", "starting_after": -1}).content)
    assert names(events) >= SPEC_NAMES
    assert not OPENAI_NAMES & names(events)
    assert names(again) >= OPENAI_NAMES  # the stored log is the default dialect; each reader gets its own


def test_text_that_spells_an_event_name_is_never_renamed(inprocess_url):
    """Only events are renamed: the model's text (the replay echoes the input) keeps every
    byte, even where it spells an event line or a type field."""
    text = 'event: response.reasoning_text.delta\n\nevent: response.reasoning_text.done "type":"response.reasoning_text.delta"'
    body = {"model": "gpt-oss-replay", "input": text, "stream": True}
    with httpx.Client(timeout=60) as http:
        events = parse_sse(http.post(f"{inprocess_url}/responses", json=body, headers=HEADER).content)
    streamed = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    assert streamed == text
    assert events[-1]["response"]["output"][-1]["content"][0]["text"] == text


def test_a_clients_value_that_reads_like_a_type_is_never_renamed(inprocess_url):
    """Only the reasoning text events are renamed: a metadata value spelling their type stays."""
    spelled = "response.reasoning_text.delta"
    body = {"model": "gpt-oss-replay", "input": "hi", "stream": True, "metadata": {"type": spelled}}
    with httpx.Client(timeout=60) as http:
        events = parse_sse(http.post(f"{inprocess_url}/responses", json=body, headers=HEADER).content)
    assert all(event["response"]["metadata"] == {"type": spelled} for event in events if "response" in event)
    with connect(inprocess_url.replace("http://", "ws://") + "/responses", additional_headers=HEADER) as socket:
        socket.send(json.dumps({"type": "response.create", "model": "gpt-oss-replay", "input": "hi", "metadata": {"type": spelled}}))
        created = json.loads(socket.recv(timeout=30))
    assert created["response"]["metadata"] == {"type": spelled}


def test_line_separators_in_text_are_escaped_on_the_wire(inprocess_url):
    """U+2028, U+2029 and U+0085 split lines for some SSE readers (httpx's iter_lines): the wire
    carries them escaped, so model text can never read as an event line; the text is the same."""
    text = "a\u2028event: response.completed\u2029b\u0085c"
    body = {"model": "gpt-oss-replay", "input": text, "stream": True}
    with httpx.Client(timeout=60) as http:
        raw = http.post(f"{inprocess_url}/responses", json=body).content
    for separator in ("\u2028", "\u2029", "\u0085"):
        assert separator.encode() not in raw
    lines = list(httpx.Response(200, content=raw).iter_lines())  # the reader that split on them
    assert [line for line in lines if line.startswith("event:")] == [line for line in raw.decode().split("\n") if line.startswith("event:")]
    events = parse_sse(raw)
    assert sum(event["type"] == "response.completed" for event in events) == 1
    assert events[-1]["response"]["output"][-1]["content"][0]["text"] == text

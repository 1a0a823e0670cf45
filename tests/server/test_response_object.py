"""The response object as OpenAI writes it, in every place it appears (a non-streamed answer,
GET, each event that carries it over SSE and WebSocket): the sampling values the engine ran
with, never null (`temperature`, `top_p` 1.0 unless asked; `top_logprobs` 0;
`presence_penalty`, `frequency_penalty` 0.0), `text.verbosity` (`medium` unless asked),
integer timestamps, and reasoning items that leave `encrypted_content` out unless it is there."""

from __future__ import annotations

import json

import httpx
import pytest
from openai import OpenAI

from tests.support.contract import parse_sse

FAMILIES = ["gpt-oss-replay", "qwen3-replay"]
CARRIERS = {"response.created", "response.in_progress", "response.completed"}


def assert_wire(
    response: dict, *, temperature: float = 1.0, top_p: float = 1.0, top_logprobs: int = 0, verbosity: str = "medium", penalty: float = 0.0
) -> None:
    assert type(response["created_at"]) is int
    assert response["completed_at"] is None or type(response["completed_at"]) is int
    assert response["temperature"] == temperature
    assert response["top_p"] == top_p
    assert response["top_logprobs"] == top_logprobs
    assert response["presence_penalty"] == penalty
    assert response["frequency_penalty"] == -penalty
    assert response["text"]["verbosity"] == verbosity
    assert isinstance(response["reasoning"], dict)  # {"effort": ..., "summary": ...}, never null
    assert isinstance(response["metadata"], dict)
    for item in response["output"]:
        if item["type"] == "reasoning":
            assert "encrypted_content" not in item or isinstance(item["encrypted_content"], str)


@pytest.mark.parametrize("model", FAMILIES)
def test_defaults_are_written_as_the_values_used(inprocess_url, model):
    with httpx.Client(timeout=60) as http:
        answer = http.post(f"{inprocess_url}/responses", json={"model": model, "input": "hi"}).json()
        assert_wire(answer)
        assert type(answer["completed_at"]) is int
        assert any(item["type"] == "reasoning" for item in answer["output"])  # both replay models reason
        assert_wire(http.get(f"{inprocess_url}/responses/{answer['id']}").json())
        with http.stream("POST", f"{inprocess_url}/responses", json={"model": model, "input": "hi", "stream": True}) as stream:
            events = parse_sse(stream.read())
        carried = [event["response"] for event in events if event["type"] in CARRIERS]
        assert len(carried) == 3
        for response in carried:
            assert_wire(response)
        for event in events:
            if event["type"].startswith("response.output_item."):
                item = event["item"]
                assert item["type"] != "reasoning" or "encrypted_content" not in item


def test_asked_values_are_echoed_and_encrypted_reasoning_kept(inprocess_url):
    body = {
        "model": "gpt-oss-replay",
        "input": "hi",
        "temperature": 0.3,
        "top_p": 0.9,
        "top_logprobs": 2,
        "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
        "text": {"verbosity": "low"},
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "store": False,
    }
    with httpx.Client(timeout=60) as http:
        answer = http.post(f"{inprocess_url}/responses", json=body).json()
    assert_wire(answer, temperature=0.3, top_p=0.9, top_logprobs=2, verbosity="low", penalty=0.5)
    (reasoning,) = [item for item in answer["output"] if item["type"] == "reasoning"]
    assert isinstance(reasoning["encrypted_content"], str)


def test_over_websocket_the_response_is_the_same(inprocess_url):
    from websockets.sync.client import connect

    with connect(inprocess_url.replace("http://", "ws://") + "/responses") as socket:
        socket.send(json.dumps({"type": "response.create", "model": "gpt-oss-replay", "input": "hi"}))
        carried = []
        while True:
            event = json.loads(socket.recv(timeout=30))
            if event["type"] in CARRIERS:
                carried.append(event["response"])
            if event["type"] == "response.completed":
                break
    assert len(carried) == 3
    for response in carried:
        assert_wire(response)


def test_the_sdk_reads_the_integer_timestamps(inprocess_url):
    client = OpenAI(base_url=inprocess_url, api_key="unused")
    response = client.responses.create(model="gpt-oss-replay", input="hi")
    assert response.created_at > 1_700_000_000
    assert response.temperature == 1.0

"""An engine replica acknowledges a request whose first token is slow
(`TokenBatch.acknowledgement`): the response starts then (its headers and first events while
the prompt is prefilled), and nothing else about it changes."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest

from serve_app.core.tokens import TokenBatch
from serve_app.engines.replay import ReplayBackend
from serve_app.server.app import ServedModel, ServerSettings, create_app
from tests.support.contract import check_stream, parse_sse
from tests.support.servers import uvicorn_server

INPUT = "Tell me about acknowledgements, please."


class _PrefillingBackend(ReplayBackend):
    """Acknowledges each request, then holds its first token until the test opens `prefilled`."""

    def __init__(self) -> None:
        super().__init__()
        self.prefilled = threading.Event()

    async def generate(self, request):
        yield TokenBatch.acknowledgement()
        while not self.prefilled.is_set():
            await asyncio.sleep(0.005)
        async for batch in super().generate(request):
            yield batch


@pytest.fixture(scope="module")
def server():
    backend = _PrefillingBackend()
    app = create_app([ServedModel("prefilling", backend), ServedModel("plain", ReplayBackend())], ServerSettings())
    with uvicorn_server(app) as url:
        yield url, backend


def _first_event_then_rest(url: str, path: str, body: dict, backend: _PrefillingBackend) -> tuple[int, bytes, bytes]:
    """The status and first SSE event of a stream, read while the engine still prefills, then
    (with the first token let through) the rest."""
    backend.prefilled.clear()
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{url}{path}", json=body) as response:
        chunks = response.iter_raw()
        first = b""
        while b"\n\n" not in first:
            first += next(chunks)
        assert not backend.prefilled.is_set()
        backend.prefilled.set()
        return response.status_code, first, first + b"".join(chunks)


def test_a_responses_stream_starts_before_the_first_token(server):
    url, backend = server
    status, first, whole = _first_event_then_rest(url, "/responses", {"model": "prefilling", "input": INPUT, "stream": True}, backend)
    assert status == 200
    assert parse_sse(first)[0]["type"] == "response.created"
    terminal = check_stream(parse_sse(whole))
    with httpx.Client(timeout=30) as http:
        plain = http.post(f"{url}/responses", json={"model": "plain", "input": INPUT}).json()
    assert terminal.status == "completed"
    assert terminal.output_text == "".join(c["text"] for i in plain["output"] if i["type"] == "message" for c in i["content"])
    assert terminal.usage.output_tokens == plain["usage"]["output_tokens"]


def test_a_chat_stream_starts_before_the_first_token(server):
    url, backend = server
    body = {"model": "prefilling", "messages": [{"role": "user", "content": INPUT}], "stream": True}
    status, first, whole = _first_event_then_rest(url, "/chat/completions", body, backend)
    assert status == 200
    role = json.loads(first.split(b"data: ", 1)[1])
    assert role["choices"][0]["delta"]["role"] == "assistant"
    chunks = [json.loads(line[6:]) for line in whole.split(b"\n\n") if line.startswith(b"data: {")]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    with httpx.Client(timeout=30) as http:
        plain = http.post(f"{url}/chat/completions", json={**body, "model": "plain", "stream": False}).json()
    assert content == plain["choices"][0]["message"]["content"]
    assert whole.endswith(b"data: [DONE]\n\n")


def test_an_acknowledged_request_answers_as_any_other(server):
    url, backend = server
    backend.prefilled.set()
    with httpx.Client(timeout=30) as http:
        answers = [http.post(f"{url}/responses", json={"model": model, "input": INPUT}).json() for model in ("prefilling", "plain")]
    assert [[item["type"] for item in answer["output"]] for answer in answers] == [["reasoning", "message"]] * 2
    assert answers[0]["output"][1]["content"] == answers[1]["output"][1]["content"]
    assert answers[0]["usage"] == answers[1]["usage"]

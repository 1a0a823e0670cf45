"""Engine failures and auth, without a cluster: the ingress's retry rule, 503s, 401s."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from ray.exceptions import ActorDiedError

from deployments.backends.replay import ReplayBackend
from deployments.ingress import HandleTokenSource
from serve_app.api import ServedModel, create_app
from serve_app.protocol.tokens import GenerationRequest, TokenBatch
from tests.conftest import uvicorn_server
from tests.contract import check_stream, parse_sse


class _FakeResponse:
    """What `handle.options(stream=True).generate.remote()` returns: an async iterator."""

    def __init__(self, batches: list[TokenBatch], fail_after: int | None) -> None:
        self._batches, self._fail_after, self.cancelled = batches, fail_after, False

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        for index, batch in enumerate(self._batches):
            if index == self._fail_after:
                raise ActorDiedError()
            yield batch
        if self._fail_after is not None and self._fail_after >= len(self._batches):
            raise ActorDiedError()

    def cancel(self) -> None:
        self.cancelled = True


class _FakeHandle:
    def __init__(self, plans: list[int | None]) -> None:
        self.plans, self.calls = plans, []
        self.generate = self

    def options(self, **_):
        return self

    def remote(self, request):
        response = _FakeResponse([TokenBatch([1, 2]), TokenBatch([3], finish_reason="stop")], self.plans[len(self.calls)])
        self.calls.append(response)
        return response


async def _collect(source, request) -> list[int]:
    return [t async for batch in source.generate(request) for t in batch.token_ids]


REQUEST = GenerationRequest("r", [1])


def test_replica_gone_before_the_first_token_is_retried_once():
    handle = _FakeHandle([0, None])
    assert asyncio.run(_collect(HandleTokenSource(handle), REQUEST)) == [1, 2, 3]
    assert len(handle.calls) == 2
    assert handle.calls[0].cancelled and not handle.calls[1].cancelled  # a finished stream needs no cancel


def test_no_second_retry():
    handle = _FakeHandle([0, 0])
    with pytest.raises(ActorDiedError):
        asyncio.run(_collect(HandleTokenSource(handle), REQUEST))
    assert len(handle.calls) == 2


def test_replica_gone_after_tokens_is_not_retried():
    handle = _FakeHandle([1, None])
    with pytest.raises(ActorDiedError):
        asyncio.run(_collect(HandleTokenSource(handle), REQUEST))
    assert len(handle.calls) == 1 and handle.calls[0].cancelled


class _BrokenBackend(ReplayBackend):
    """Streams a few batches, then the engine dies."""

    async def generate(self, request):
        count = 0
        async for batch in super().generate(request):
            yield batch
            count += 1
            if count == 3:
                raise RuntimeError("engine core died")


@pytest.fixture(scope="module")
def broken_url():
    app = create_app([ServedModel("broken", _BrokenBackend())], api_key="sk-test")
    with uvicorn_server(app) as url:
        yield url


AUTH = {"Authorization": "Bearer sk-test"}


def test_stream_ends_with_response_failed(broken_url):
    with httpx.Client(timeout=30, headers=AUTH) as http:
        response = http.post(f"{broken_url}/responses", json={"model": "broken", "input": "a long enough input text", "stream": True})
    terminal = check_stream(parse_sse(response.content))
    assert terminal.status == "failed" and "engine core died" in terminal.error.message


def test_non_stream_failure_is_a_503_with_an_openai_error(broken_url):
    with httpx.Client(timeout=30, headers=AUTH) as http:
        response = http.post(f"{broken_url}/responses", json={"model": "broken", "input": "a long enough input text"})
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["type"] == "server_error" and "engine core died" in error["message"]


def test_api_key_is_required_when_configured(broken_url):
    with httpx.Client(timeout=30) as http:
        missing = http.post(f"{broken_url}/responses", json={"model": "broken", "input": "x"})
        wrong = http.get(f"{broken_url}/models", headers={"Authorization": "Bearer nope"})
        right = http.get(f"{broken_url}/models", headers=AUTH)
        health = http.get(broken_url.removesuffix("/v1") + "/health")
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert right.status_code == 200 and health.status_code == 200


def test_unavailable_model_is_a_503_before_any_work():
    """A model whose engine has no running replica is refused at once, stream or not; the
    other models serve. (Where `unavailable` comes from, Serve's status: tests/multinode.)"""
    backend = ReplayBackend()

    async def unavailable(model: str) -> str | None:
        return "DEPLOY_FAILED" if model == "down" else None

    app = create_app([ServedModel("down", backend, unavailable=unavailable), ServedModel("up", backend, unavailable=unavailable)])
    with uvicorn_server(app) as url, httpx.Client(timeout=30) as http:
        answers = [http.post(f"{url}/responses", json={"model": "down", "input": "x", "stream": stream}) for stream in (False, True)]
        up = http.post(f"{url}/responses", json={"model": "up", "input": "x"})
    for answer in answers:
        assert answer.status_code == 503
        assert answer.json()["error"] == {
            "message": "The model 'down' is unavailable: no engine replica is running (DEPLOY_FAILED). Try again later.",
            "type": "server_error",
            "param": "model",
            "code": "model_unavailable",
        }
    assert up.status_code == 200 and up.json()["output"][-1]["content"][0]["text"] == "x"
    assert backend.num_running() == 0

"""Engine failures and auth, without a cluster: the ingress's retry rule, 503s, 401s."""

from __future__ import annotations

import asyncio
import logging
import re

import httpx
import pytest
from ray.exceptions import ActorDiedError, RayTaskError

from deployments.ingress import HandleTokenSource
from serve_app.config import AuthConfig
from serve_app.core.tokens import EngineRejected, GenerationRequest, TokenBatch
from serve_app.engines.replay import ReplayBackend
from serve_app.server.app import ServedModel, ServerSettings, Unavailable, create_app
from serve_app.server.auth import AuthMiddleware
from tests.support.contract import check_stream, parse_sse
from tests.support.servers import uvicorn_server


class _FakeResponse:
    """What `handle.options(stream=True).generate.remote()` returns: an async iterator."""

    def __init__(self, batches: list[TokenBatch], fail_after: int | None, error) -> None:
        self._batches, self._fail_after, self._error, self.cancelled = batches, fail_after, error, False

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        for index, batch in enumerate(self._batches):
            if index == self._fail_after:
                raise self._error()
            yield batch
        if self._fail_after is not None and self._fail_after >= len(self._batches):
            raise self._error()

    def cancel(self) -> None:
        self.cancelled = True


class _FakeHandle:
    def __init__(self, plans: list[int | None], error=ActorDiedError, acknowledged: bool = False) -> None:
        self.plans, self.error, self.calls, self.acknowledged = plans, error, [], acknowledged
        self.generate = self

    def options(self, **_):
        return self

    def remote(self, request):
        batches = [TokenBatch([1, 2]), TokenBatch([3], finish_reason="stop")]
        if self.acknowledged:  # the engine replica's, while its first token was slow
            batches.insert(0, TokenBatch.acknowledgement())
        response = _FakeResponse(batches, self.plans[len(self.calls)], self.error)
        self.calls.append(response)
        return response


async def _collect(source, request) -> list[int]:
    return [t async for batch in source.generate(request) for t in batch.token_ids]


REQUEST = GenerationRequest("r", [1])


def test_replica_gone_before_the_first_token_is_retried_once():
    handle = _FakeHandle([0, None])
    assert asyncio.run(_collect(HandleTokenSource(handle), REQUEST)) == [1, 2, 3]
    assert len(handle.calls) == 2
    assert handle.calls[0].cancelled
    assert not handle.calls[1].cancelled  # a finished stream needs no cancel


def test_replica_gone_after_its_acknowledgement_is_retried_once():
    """An acknowledgement carries no token: the request can still go to another replica."""
    handle = _FakeHandle([1, None], acknowledged=True)
    assert asyncio.run(_collect(HandleTokenSource(handle), REQUEST)) == [1, 2, 3]
    assert len(handle.calls) == 2
    tokens_then_gone = _FakeHandle([2, None], acknowledged=True)
    with pytest.raises(ActorDiedError):
        asyncio.run(_collect(HandleTokenSource(tokens_then_gone), REQUEST))
    assert len(tokens_then_gone.calls) == 1


def test_no_second_retry():
    handle = _FakeHandle([0, 0])
    with pytest.raises(ActorDiedError):
        asyncio.run(_collect(HandleTokenSource(handle), REQUEST))
    assert len(handle.calls) == 2


def test_replica_gone_after_tokens_is_not_retried():
    handle = _FakeHandle([1, None])
    with pytest.raises(ActorDiedError):
        asyncio.run(_collect(HandleTokenSource(handle), REQUEST))
    assert len(handle.calls) == 1
    assert handle.calls[0].cancelled


def _refused(client_error: bool):
    return lambda: RayTaskError("generate", "Traceback ...", EngineRejected("no", client_error)).as_instanceof_cause()


def test_busy_engine_is_retried_once_a_refused_request_never():
    busy = _FakeHandle([0, None], error=_refused(client_error=False))
    assert asyncio.run(_collect(HandleTokenSource(busy), REQUEST)) == [1, 2, 3]
    assert len(busy.calls) == 2
    refused = _FakeHandle([0, None], error=_refused(client_error=True))  # the request's fault: no retry
    with pytest.raises(EngineRejected):
        asyncio.run(_collect(HandleTokenSource(refused), REQUEST))
    assert len(refused.calls) == 1
    busy_twice = _FakeHandle([0, 0], error=_refused(client_error=False))
    with pytest.raises(EngineRejected):
        asyncio.run(_collect(HandleTokenSource(busy_twice), REQUEST))
    assert len(busy_twice.calls) == 2


# What a handle raises when the engine replica's generator failed: Ray's error, whose text
# names the replica's pid, node IP and actor id.
INTERNALS = ["4242", "10.1.2.3", "8f3c1d2e9a7b6c5d4e3f2a1b01000000", "RayTaskError", "ValueError", "must be >0"]


def _ray_task_error() -> Exception:
    error = RayTaskError(
        "generate",
        'Traceback (most recent call last):\n  File "deployments/engine.py", line 115, in generate\nValueError: value must be >0, got 0',
        ValueError("value must be >0, got 0"),
        proctitle="ray::ServeReplica:responses:EngineServer-broken.generate",
        pid=4242,
        ip="10.1.2.3",
        actor_repr="EngineServer(actor_id=8f3c1d2e9a7b6c5d4e3f2a1b01000000)",
        actor_id="8f3c1d2e9a7b6c5d4e3f2a1b01000000",
    )
    return error.as_instanceof_cause()


class _BrokenBackend(ReplayBackend):
    """Streams a few batches, then the engine replica fails."""

    async def generate(self, request):
        count = 0
        async for batch in super().generate(request):
            yield batch
            count += 1
            if count == 3:
                raise _ray_task_error()


@pytest.fixture(scope="module")
def broken_url():
    app = create_app([ServedModel("broken", _BrokenBackend())], ServerSettings(auth=KEYS), environ={"TEST_KEY": TEST_KEY})
    with uvicorn_server(app) as url:
        yield url


TEST_KEY = "sk-test-0123456789abcdef"
KEYS = AuthConfig(keys=[{"tenant": "team-a", "key_env": "TEST_KEY"}])
AUTH = {"Authorization": f"Bearer {TEST_KEY}"}


def _assert_plain(message: str, response_id: str) -> None:
    assert response_id in message
    assert not [internal for internal in INTERNALS if internal in message], message


def _assert_logged_with_traceback(caplog, response_id: str) -> None:
    records = [r for r in caplog.records if response_id in r.getMessage() and r.exc_info]
    assert records, "the failure must be logged with its traceback"
    assert "10.1.2.3" in caplog.text
    assert "Traceback" in caplog.text  # the details are in the log


def test_stream_ends_with_response_failed(broken_url, caplog):
    with caplog.at_level(logging.ERROR, logger="serve_app"):
        with httpx.Client(timeout=30, headers=AUTH) as http:
            response = http.post(f"{broken_url}/responses", json={"model": "broken", "input": "a long enough input text", "stream": True})
        terminal = check_stream(parse_sse(response.content))
    assert terminal.status == "failed"
    assert terminal.error.code == "server_error"
    _assert_plain(terminal.error.message, terminal.id)
    _assert_logged_with_traceback(caplog, terminal.id)


def test_non_stream_failure_is_a_503_with_an_openai_error(broken_url, caplog):
    with caplog.at_level(logging.ERROR, logger="serve_app"), httpx.Client(timeout=30, headers=AUTH) as http:
        response = http.post(f"{broken_url}/responses", json={"model": "broken", "input": "a long enough input text"})
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["type"] == "server_error"
    response_id = re.search(r"resp_\w+", error["message"]).group()  # the id a client quotes to support
    _assert_plain(error["message"], response_id)
    _assert_logged_with_traceback(caplog, response_id)


class _RefusingBackend:
    """An engine replica whose vLLM refuses every request (Ray's error, as the handle raises
    it): as the client's fault, or because the engine is too busy."""

    def __init__(self, client_error: bool) -> None:
        self.client_error = client_error

    async def generate(self, request):
        reason = REFUSED if self.client_error else BUSY
        error = RayTaskError(
            "generate",
            "Traceback (most recent call last): ...",
            EngineRejected(reason, self.client_error),
            pid=4242,
            ip="10.1.2.3",
            actor_id="8f3c1d2e9a7b6c5d4e3f2a1b01000000",
        )
        raise error.as_instanceof_cause()
        yield  # an async generator, as a backend's generate is


REFUSED = "Requested sample logprobs of 8, which is greater than max allowed: 5"
BUSY = "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance."


@pytest.fixture(scope="module")
def refusing_url():
    models = [ServedModel("refusing", _RefusingBackend(client_error=True)), ServedModel("busy", _RefusingBackend(client_error=False))]
    with uvicorn_server(create_app(models)) as url:
        yield url


def test_engine_refusals_keep_their_reason_and_status(refusing_url):
    """The engine's request validation is the client's fault (400, `invalid_prompt` in a
    stream); both with vLLM's words, no internals."""
    with httpx.Client(timeout=30) as http:
        plain = http.post(f"{refusing_url}/responses", json={"model": "refusing", "input": "hi"})
        streamed = http.post(f"{refusing_url}/responses", json={"model": "refusing", "input": "hi", "stream": True})
    assert plain.status_code == 400
    error = plain.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_prompt")
    assert REFUSED in error["message"]
    terminal = check_stream(parse_sse(streamed.content))
    assert terminal.status == "failed"
    assert terminal.error.code == "invalid_prompt"
    assert REFUSED in terminal.error.message
    for message in (error["message"], terminal.error.message):
        assert not [internal for internal in ("4242", "10.1.2.3", "8f3c1d2e", "RayTaskError", "Traceback") if internal in message]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_engines_at_capacity_are_a_503_before_any_event(refusing_url, stream):
    """vLLM's admission control (or Serve's full queue) refuses: a 503 with Retry-After, for
    a stream too (refused before it starts, never a stream that starts and fails), with
    vLLM's words and no internals."""
    with httpx.Client(timeout=30) as http:
        refused = http.post(f"{refusing_url}/responses", json={"model": "busy", "input": "hi", "stream": stream})
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.headers["content-type"] == "application/json"
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "engine_at_capacity")
    assert BUSY in error["message"]
    assert not [internal for internal in ("4242", "10.1.2.3", "8f3c1d2e", "RayTaskError", "Traceback") if internal in error["message"]]


def test_api_key_is_required_when_configured(broken_url):
    with httpx.Client(timeout=30) as http:
        missing = http.post(f"{broken_url}/responses", json={"model": "broken", "input": "x"})
        wrong = http.get(f"{broken_url}/models", headers={"Authorization": "Bearer nope"})
        longer = http.get(f"{broken_url}/models", headers={"Authorization": f"Bearer {TEST_KEY}-and-more"})
        prefix = http.get(f"{broken_url}/models", headers={"Authorization": f"Bearer {TEST_KEY[:-1]}"})
        no_scheme = http.get(f"{broken_url}/models", headers={"Authorization": TEST_KEY})
        right = http.get(f"{broken_url}/models", headers=AUTH)
        health = http.get(broken_url.removesuffix("/v1") + "/health")
    for denied in (wrong, longer, prefix):
        assert denied.status_code == 401
        assert denied.json() == {
            "error": {"message": "Incorrect API key provided.", "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
        }
    for denied in (missing, no_scheme):  # no Bearer token at all: said so
        assert denied.status_code == 401
        assert denied.json()["error"]["message"].startswith("You didn't provide an API key")
    assert right.status_code == 200
    assert health.status_code == 200


def test_streams_pass_the_key_check_untouched(broken_url):
    """The key check sees the headers only: a stream's chunks reach the client as sent."""
    with (
        httpx.Client(timeout=30, headers=AUTH) as http,
        http.stream(
            "POST", f"{broken_url}/responses", json={"model": "broken", "input": "a long enough input text", "stream": True}
        ) as response,
    ):
        chunks = list(response.iter_raw())
    assert response.status_code == 200
    assert len(chunks) > 1
    check_stream(parse_sse(b"".join(chunks)))


def test_the_key_check_is_pure_asgi():
    from starlette.middleware.base import BaseHTTPMiddleware

    with_key = create_app([ServedModel("broken", _BrokenBackend())], ServerSettings(auth=KEYS), environ={"TEST_KEY": TEST_KEY})
    classes = [m.cls for m in with_key.user_middleware]
    assert classes[0] is AuthMiddleware  # the outermost: nothing runs before the key is checked
    assert not any(issubclass(cls, BaseHTTPMiddleware) for cls in classes)


@pytest.mark.slow
def test_unavailable_model_is_a_503_before_any_work():
    """A model whose engine has no running replica is refused at once, stream or not; the
    other models serve. (Where `unavailable` comes from, Serve's status: tests/multinode.)"""
    backend = ReplayBackend()

    async def unavailable(model: str) -> Unavailable | None:
        return Unavailable("unavailable", "DEPLOY_FAILED") if model == "down" else None

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
    assert up.status_code == 200
    assert up.json()["output"][-1]["content"][0]["text"] == "x"
    assert backend.num_running() == 0

"""Stream lifetime and the drain: a stated maximum stream duration sets how long Serve lets a
stopping ingress or engine replica finish its streams, and a stream that outlives it is ended
by the ingress itself, cleanly (`response.failed`, engine request aborted), never cut."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from deployments.backends.replay import ReplayBackend, ReplayConfig
from serve_app.api import ServedModel, create_app
from serve_app.config import DEFAULT_MAX_STREAM_DURATION_S, SHUTDOWN_MARGIN_S, AppConfig
from tests.conftest import uvicorn_server
from tests.sdk_scenarios import raw_stream

MODEL = {"name": "m", "backend": {"type": "replay"}}


def test_drain_budget_follows_the_maximum_stream_duration():
    default = AppConfig.model_validate({"models": [MODEL]})
    assert default.max_stream_duration_s == DEFAULT_MAX_STREAM_DURATION_S
    budget = DEFAULT_MAX_STREAM_DURATION_S + SHUTDOWN_MARGIN_S
    assert default.ingress.serve_options()["graceful_shutdown_timeout_s"] == budget
    assert default.models[0].engine.serve_options()["graceful_shutdown_timeout_s"] == budget

    stated = AppConfig.model_validate({"models": [MODEL], "max_stream_duration_s": 120})
    assert stated.ingress.graceful_shutdown_timeout_s == stated.models[0].engine.graceful_shutdown_timeout_s == 120 + SHUTDOWN_MARGIN_S

    # An explicit budget at least as long as the longest stream is kept as given.
    explicit = AppConfig.model_validate({"models": [MODEL], "max_stream_duration_s": 120, "ingress": {"graceful_shutdown_timeout_s": 500}})
    assert explicit.ingress.graceful_shutdown_timeout_s == 500


@pytest.mark.parametrize("where", ["ingress", "engine"])
def test_a_drain_shorter_than_a_stream_is_rejected(where):
    args = {"models": [MODEL], "max_stream_duration_s": 300}
    if where == "ingress":
        args["ingress"] = {"graceful_shutdown_timeout_s": 20}
    else:
        args["models"] = [{**MODEL, "engine": {"graceful_shutdown_timeout_s": 20}}]
    with pytest.raises(ValidationError, match="graceful_shutdown_timeout_s .* shorter than max_stream_duration_s"):
        AppConfig.model_validate(args)


def test_a_stream_that_outlives_the_maximum_is_ended_with_response_failed():
    # One token per 50 ms step: the echo of this input takes far longer than the maximum.
    engine = ReplayBackend(ReplayConfig(min_step_tokens=1, max_step_tokens=1, step_delay_s=0.05))
    app = create_app([ServedModel("slow", engine), ServedModel("fast", ReplayBackend())], max_stream_duration_s=0.5)
    with uvicorn_server(app) as url:
        events = raw_stream(url, {"model": "slow", "input": "a long answer " * 40})  # contract-checked
        terminal = events[-1]
        assert terminal["type"] == "response.failed"
        assert "maximum stream duration" in terminal["response"]["error"]["message"]
        # Every item opened before the end was closed.
        assert all(item["status"] != "in_progress" for item in terminal["response"]["output"])
        # The engine request was aborted with the stream, not left generating.
        assert engine.num_running() == 0

        # Not streamed: the same end, as an OpenAI-shaped error.
        collected = httpx.post(f"{url}/responses", json={"model": "slow", "input": "a long answer " * 40}, timeout=60)
        assert collected.status_code == 503
        assert "maximum stream duration" in collected.json()["error"]["message"]
        assert engine.num_running() == 0

        # A stream within the maximum is untouched.
        short = raw_stream(url, {"model": "fast", "input": "hi"})
        assert short[-1]["type"] == "response.completed"

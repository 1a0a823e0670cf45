"""Stream lifetime and the drain: a stated maximum stream duration sets how long Serve lets a
stopping ingress or engine replica finish its streams, and a stream that outlives it is ended
by the ingress itself, cleanly (`response.failed`, engine request aborted), never cut."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from serve_app.config import DEFAULT_MAX_STREAM_DURATION_S, SHUTDOWN_MARGIN_S, AppConfig
from serve_app.engines.replay import ReplayBackend, ReplayConfig
from serve_app.server.app import ServedModel, ServerSettings, create_app
from tests.support.sdk_scenarios import raw_stream
from tests.support.servers import uvicorn_server

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
    with pytest.raises(ValidationError, match=r"graceful_shutdown_timeout_s .* shorter than max_stream_duration_s"):
        AppConfig.model_validate(args)


def test_haproxy_keeps_a_stream_across_its_reloads_as_long_as_the_longest_may_last():
    """Serve reloads HAProxy at every scaling event, and its old process cuts what it still
    carries after `hard-stop-after` (Serve's default: 120 s). `make serve`'s environment
    (CLUSTER_ENV) outlasts the default longest stream; a longer one is refused by name."""
    from serve_app.config.cluster import CLUSTER_ENV, HAPROXY_HARD_STOP_AFTER, check_haproxy_keeps_streams

    assert float(CLUSTER_ENV[HAPROXY_HARD_STOP_AFTER]) >= DEFAULT_MAX_STREAM_DURATION_S + SHUTDOWN_MARGIN_S
    check_haproxy_keeps_streams(DEFAULT_MAX_STREAM_DURATION_S, CLUSTER_ENV)
    with pytest.raises(ValueError, match=f"Export {HAPROXY_HARD_STOP_AFTER} of at least 1030"):
        check_haproxy_keeps_streams(1000, CLUSTER_ENV)
    # HAProxy on, its hard stop left at Serve's default: even the default longest stream is refused.
    with pytest.raises(ValueError, match=r"\(RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S=120\)"):
        check_haproxy_keeps_streams(DEFAULT_MAX_STREAM_DURATION_S, {"RAY_SERVE_ENABLE_HA_PROXY": "1"})
    check_haproxy_keeps_streams(100, {"RAY_SERVE_ENABLE_HA_PROXY": "1"})
    # Serve's proxy actor holds connections until they end.
    check_haproxy_keeps_streams(10_000, {"RAY_SERVE_ENABLE_HA_PROXY": "0"})


def test_build_app_refuses_streams_longer_than_haproxy_keeps_them(monkeypatch):
    from deployments.builder import build_app

    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1")
    monkeypatch.setenv("RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S", "930")
    build_app({"models": [MODEL]})
    with pytest.raises(ValueError, match="max_stream_duration_s \\(3600 s\\) is longer than Serve's HAProxy keeps"):
        build_app({"models": [MODEL], "max_stream_duration_s": 3600})


@pytest.mark.slow
def test_a_stream_that_outlives_the_maximum_is_ended_with_response_failed():
    # One token per 50 ms step: the echo of this input takes far longer than the maximum.
    engine = ReplayBackend(ReplayConfig(min_step_tokens=1, max_step_tokens=1, step_delay_s=0.05))
    app = create_app([ServedModel("slow", engine), ServedModel("fast", ReplayBackend())], ServerSettings(max_stream_duration_s=0.5))
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

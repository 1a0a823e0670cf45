"""bench/tool_loop.py runs (a few calls per family), and what it measures is what it says."""

from __future__ import annotations

import asyncio

import pytest

from bench.tool_loop import mcp_server, measure, summary
from serve_app.config import ModelConfig, ToolsConfig
from serve_app.engines import make_backend
from serve_app.runtime.metrics import NoMetrics
from serve_app.runtime.models import served_model
from serve_app.server.app import server_tool_runtime


@pytest.mark.slow
def test_the_bench_measures_each_calls_round():
    runtime = server_tool_runtime(ToolsConfig.model_validate({"mcp": {"allowed_urls": ["http://127.0.0.1:*/*"]}}), NoMetrics())
    config = ModelConfig(name="gpt-oss-replay")
    with mcp_server() as url:
        rows = asyncio.run(measure(served_model(config, make_backend(config.backend)), runtime, url, calls=3, context_tokens=800))
    assert len(rows) == 3
    for row in rows:  # the tool's own time is not the loop's; the next prompt adds only the tool's message
        assert row["overhead_s"] > 0
        assert row["tool_s"] > 0
        assert 0 < row["new_tokens"] < 40
        assert row["cached_tokens"] <= row["prompt_tokens"]
    line = summary(rows)
    assert line["calls"] == 3
    assert 0.8 < line["continuation_cached_ratio"] <= 1.0

"""The examples in examples/ run as written against the in-process server (both replay models),
each in a process of its own as a user runs it, and print what their comments say."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(url: str, *command: str) -> str:
    env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "unused", "MODEL": "gpt-oss-replay"}
    done = subprocess.run(command, cwd=EXAMPLES.parent, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_quickstart(inprocess_url):
    out = run_example(inprocess_url, sys.executable, "examples/quickstart.py").splitlines()
    assert out[:3] == ["['reasoning', 'message']", "Hello, 世界!", "And once more."]
    first, second = (int(n) for n in out[3].removeprefix("input tokens: ").split(" -> "))
    assert second > first  # the follow-up's prompt holds the first turn


@pytest.mark.slow
def test_streaming(inprocess_url):
    out = run_example(inprocess_url, sys.executable, "examples/streaming.py").splitlines()
    assert out[0] == "Stream me, please."  # the replay echoes, delta by delta
    assert re.fullmatch(r"completed \d+ output tokens", out[1])
    events = [line.split(" ", 1) for line in out if line[:1].isdigit()]
    assert [int(n) for n, _ in events] == list(range(len(events)))
    assert events[0][1] == "response.created"
    assert events[-1][1] == "response.completed"


@pytest.mark.slow
def test_tools(inprocess_url):
    out = run_example(inprocess_url, sys.executable, "examples/tools.py").splitlines()
    assert out == ['the model calls get_weather({"city": "Paris"})', "Tool get_weather returned: sunny in Paris"]


@pytest.mark.slow
def test_agents_sdk(inprocess_url):
    out = run_example(inprocess_url, sys.executable, "examples/agents_sdk.py")
    assert out.splitlines() == ["Tool get_weather returned: sunny in Paris"]


@pytest.mark.skipif(not shutil.which("curl"), reason="no curl")
def test_curl(inprocess_url):
    out = run_example(inprocess_url, "sh", "examples/curl.sh")
    assert '"id":"gpt-oss-replay"' in out
    assert "event: response.created" in out
    assert "event: response.completed" in out
    assert out.count('"previous_response_id":"resp_') == 1  # the follow-up continued the first response


def test_codex_config_names_a_responses_provider():
    """tests/server/test_codex_cli.py runs the real Codex CLI with this file."""
    config = tomllib.loads((EXAMPLES / "codex" / "config.toml").read_text())
    provider = config["model_providers"][config["model_provider"]]
    assert provider["wire_api"] == "responses"
    assert provider["base_url"] == "http://127.0.0.1:8000/v1"

"""`responses-serve run` end to end: a config served by a Ray cluster of its own, READY said
once the app answers, a response served, and Ctrl-C stopping it all cleanly (exit 0, the port
free again)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from serve_app.cli.launch import SIDE_PORTS, side_port_env
from tests.support.servers import free_port

CONFIG = {
    "proxy_location": "HeadOnly",
    "http_options": {"host": "127.0.0.1", "port": 8000},  # replaced by --port
    "logging_config": {"log_level": "WARNING"},
    "applications": [
        {
            "name": "responses",
            "route_prefix": "/",
            "import_path": "deployments.builder:build_app",
            "args": {
                "models": [{"name": "gpt-oss-replay", "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}}],
                "ingress": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
            },
        }
    ],
}


def _lines_until(process: subprocess.Popen, marker: str, timeout_s: float) -> list[str]:
    assert process.stdout is not None
    lines, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if select.select([process.stdout], [], [], 1.0)[0]:
            line = process.stdout.readline()
            lines.append(line)
            if marker in line:
                return lines
    raise AssertionError(f"no {marker!r} within {timeout_s:.0f} s; exit {process.poll()}; output:\n{''.join(lines[-40:])}")


@pytest.mark.cluster
def test_run_says_ready_serves_and_stops_on_ctrl_c(tmp_path: Path):
    config = tmp_path / "replay.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    port = free_port()
    # A cluster of its own beside the session's: its own side ports, no address to join.
    env = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}
    env.update(side_port_env(SIDE_PORTS))
    command = [str(Path(sys.executable).parent / "responses-serve"), "run", str(config), "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = _lines_until(process, "READY after", timeout_s=300)
        assert lines[-1].strip().endswith(f"http://127.0.0.1:{port}/v1 serves gpt-oss-replay. Ctrl-C stops it.")
        assert httpx.get(f"http://127.0.0.1:{port}/ready", timeout=30).status_code == 200
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/responses", json={"model": "gpt-oss-replay", "input": "hello"}, timeout=60)
        assert answer.status_code == 200
        assert answer.json()["output"][-1]["content"][0]["text"] == "hello"
        process.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C sends
        _lines_until(process, "responses-serve: stopped", timeout_s=120)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    with pytest.raises(httpx.ConnectError):  # HAProxy and the cluster are gone
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)

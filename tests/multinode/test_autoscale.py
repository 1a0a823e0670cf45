"""Autoscaling under a load ramp (issue 12 point 1): `python -m bench.autoscale --short`.

The benchmark starts a Ray cluster of its own, so it runs as a subprocess (a pytest process
holds one Ray connection). It is in the `multinode` pytest process (`pytest -m multinode`):
this test uses none of that process's fixtures and, by file name, runs before the tests that
start the simulated multi-node cluster, so the two clusters never share the machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.multinode


def run_short_benchmark(out: Path) -> tuple[dict[str, float], str]:
    """The figures of the benchmark's last line, and what it printed (for a failure's message)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0",
    }
    command = [sys.executable, "-m", "bench.autoscale", "--short", "--out", str(out)]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=600)  # a guard against a hang, not a measurement
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)  # the benchmark stops its Ray cluster on SIGTERM
        output, _ = process.communicate(timeout=120)
        pytest.fail(f"bench.autoscale --short did not finish:\n{output[-4000:]}")
    assert process.returncode == 0, output[-4000:]
    last = output.strip().splitlines()[-1]
    figures = dict(field.split("=", 1) for field in last.split())
    assert "failed_streams" in figures, output[-4000:]
    return {name: float(value) for name, value in figures.items()}, output[-3000:]


def test_replicas_scale_up_and_back_down_without_cutting_a_stream(tmp_path):
    figures, output = run_short_benchmark(tmp_path)
    # Every stream was read to its terminal event, passed the event contract and echoed its text.
    assert figures["failed_streams"] == 0, output
    assert figures["streams"] >= 8, output
    # The ramp scaled both deployments up, and the tail brought them back to one replica each.
    assert figures["peak_engine_replicas"] >= 2, output
    assert figures["peak_ingress_replicas"] >= 2, output
    assert figures["final_engine_replicas"] == 1, output
    assert figures["final_ingress_replicas"] == 1, output
    # Replicas were stopped with streams still running on them (the tail streams are on
    # different engine replicas and Serve keeps one), and those streams completed.
    assert figures["drained_requests"] >= 1, output
    assert figures["open_while_stopping"] >= 1, output
    assert (tmp_path / "autoscale-short.json").exists()
    assert (tmp_path / "autoscale-short.png").exists()

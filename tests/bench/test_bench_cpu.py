"""bench/cpu.py: a server's CPU by role, from its real process tree (bench.vs_vllm reports it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.cpu import cores_by_role, cpu_seconds

# A process that names itself as vLLM's do, burns `burn` seconds of its own CPU, then waits.
BURNER = """
import sys, time
import setproctitle
setproctitle.setproctitle(sys.argv[1])
while time.process_time() < float(sys.argv[2]):
    pass
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_cpu_of_descendants_is_counted_by_their_vllm_role():
    before = cpu_seconds(os.getpid())  # the children do not exist yet: they count from zero
    children = [
        subprocess.Popen([sys.executable, "-c", BURNER, title, burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for title, burn in (("VLLM::Worker", "0.5"), ("VLLM::EngineCore", "0.1"))
    ]
    try:
        for child in children:
            assert child.stdout.readline().strip() == "ready"
        after = cpu_seconds(os.getpid())
    finally:
        for child in children:
            child.communicate("")
    seconds = cores_by_role(before, after, wall_s=1.0)  # cores over one second: CPU seconds
    tick = 0.02  # the kernel counts CPU time in clock ticks (10 ms): allow two
    assert seconds["model worker"] >= 0.5 - tick  # its 0.5 s, whatever else the machine does
    assert 0.1 - tick <= seconds["engine core"] < 0.5
    assert cores_by_role(before, after, wall_s=2.0)["model worker"] == seconds["model worker"] / 2
    worker = next(pid for pid, (role, _) in after.items() if role == "model worker")
    assert worker == children[0].pid

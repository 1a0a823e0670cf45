"""Where a server's CPU went during a measured round, by the role of each process.

A vLLM engine on CPU is its model worker (the forward passes, bound to its own cores) and its
engine core (scheduling; it spins while it waits for the worker); everything else in the
server's process tree is the serving stack around them: vLLM's API server, or for ours Ray,
Serve, HAProxy and our replicas. The worker and the engine core spin while they wait for each
other, so on cores of their own their figures stay near a core whatever they do; where the
engine core shares the worker's core (ours on a CPU node: its scheduling thread), each wait
gives the CPU to the other and the engine core's figure drops to what it works. The stack's
figure is the cost of serving (docs/benchmarks.md, "Against vLLM's own server").
"""

from __future__ import annotations

import contextlib

import psutil

ROLES = ("model worker", "engine core", "serving stack")


def role(process: psutil.Process) -> str:
    """vLLM names its processes (setproctitle, which sets the kernel's 15-character name)."""
    name = process.name()
    if name.startswith("VLLM::Worker"):
        return "model worker"
    if name.startswith("VLLM::EngineCor"):
        return "engine core"
    return "serving stack"


def cpu_seconds(root_pid: int) -> dict[int, tuple[str, float]]:
    """pid -> (role, user + system CPU seconds) of `root_pid` and all its descendants."""
    seconds = {}
    root = psutil.Process(root_pid)
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # gone while we looked: its CPU is lost, not wrong
            times = process.cpu_times()
            seconds[process.pid] = (role(process), times.user + times.system)
    return seconds


def cores_by_role(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], wall_s: float) -> dict[str, float]:
    """Average cores each role used between two `cpu_seconds` snapshots `wall_s` apart.

    A process started in between counts from zero; one that ended in between is missing (its
    last seconds are not seen): rare during a round, and it can only make a role look smaller.
    """
    used = dict.fromkeys(ROLES, 0.0)
    for pid, (name, seconds) in after.items():
        start = before.get(pid)
        used[name] += seconds - (start[1] if start and start[0] == name else 0.0)
    return {name: value / wall_s for name, value in used.items()}

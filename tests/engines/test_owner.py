"""vLLM's processes end with the replica that started them (serve_app/engines/owner.py).

Real processes killed with SIGKILL, as Ray's OOM killer and `ray stop --force` kill a replica:
first a stand-in child that runs the watch, then a real vLLM engine on CPU."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from serve_app.engines import owner

TOOK_S = 60.0  # how long the test waits for the processes to go (a bound, not a timing)


def _wait_gone(pids: list[int], within_s: float = TOOK_S) -> list[int]:
    """The pids among `pids` still running (zombies count as gone) after up to `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _start(script: str) -> tuple[subprocess.Popen[str], list[int]]:
    """`script` in a Python process of its own; it prints the pids to watch on a `pids:` line."""
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stdout is not None
    for line in process.stdout:  # vLLM logs to stdout too
        if line.startswith("pids:"):
            return process, [int(pid) for pid in line.split()[1:]]
    raise AssertionError("the process died before it printed its children")


def _kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


OWNER_WITH_A_CHILD = """
    import subprocess, sys
    from serve_app.engines.owner import mark_owner
    mark_owner()
    child = subprocess.Popen([sys.executable, "-c", "from serve_app.engines.owner import watch_owner; import time; watch_owner(); time.sleep(600)"])
    print("pids:", child.pid, flush=True)
    child.wait()
"""


def test_a_process_started_under_an_owner_ends_when_the_owner_is_killed():
    process, (child,) = _start(OWNER_WITH_A_CHILD)
    try:
        time.sleep(1)  # the child is up and watching
        assert psutil.pid_exists(child)
        _kill(process)
        assert _wait_gone([child]) == []
    finally:
        if psutil.pid_exists(child):
            os.kill(child, signal.SIGKILL)


def test_a_process_with_a_live_owner_keeps_running():
    process, (child,) = _start(OWNER_WITH_A_CHILD)
    try:
        time.sleep(3 * owner.POLL_S)
        assert psutil.Process(child).status() != psutil.STATUS_ZOMBIE
    finally:
        _kill(process)
        _wait_gone([child])


def test_only_a_living_owner_on_this_host_counts(monkeypatch):
    monkeypatch.delenv(owner.OWNER_ENV, raising=False)
    owner.mark_owner()
    here = os.environ[owner.OWNER_ENV]
    assert owner.owner_alive(here)
    host, pid, ticks = here.split(":")
    assert (host, int(pid)) == (socket.gethostname(), os.getpid())
    # The same pid started at another time: the kernel gave it to another process.
    assert not owner.owner_alive(f"{host}:{pid}:{int(ticks) - 1}")
    # A process on another host (a Ray worker of a multi-node engine) cannot judge it: never stops.
    assert owner.owner_alive(f"another-host:{pid}:0")
    assert owner.owner_alive("garbage")


def test_the_owner_and_processes_of_other_hosts_do_not_watch(monkeypatch):
    monkeypatch.setattr(owner, "_watching", False)
    owner.mark_owner()
    for identity in (os.environ[owner.OWNER_ENV], "another-host:1:0", "garbage"):
        monkeypatch.setenv(owner.OWNER_ENV, identity)
        owner.watch_owner()
        assert not owner._watching


VLLM_OWNER = """
    import psutil, sys, time
    from tests.support.vllm_models import in_process_engine_config
    from serve_app.engines.vllm import VLLMBackend
    backend = VLLMBackend(in_process_engine_config(sys.argv[1] if len(sys.argv) > 1 else {checkpoint!r}, None, max_model_len=256))
    print("pids:", *(child.pid for child in psutil.Process().children(recursive=True)), flush=True)
    time.sleep(600)
"""


@pytest.mark.engine
@pytest.mark.slow
def test_vllms_engine_core_ends_when_its_replica_is_killed():
    """A real `AsyncLLM` on CPU: its engine core (and worker) outlived a SIGKILLed replica,
    holding the model's memory; now they follow it."""
    pytest.importorskip("vllm")
    from serve_app.families.smollm2 import SmolLM2Unavailable, ensure_smollm2_checkpoint

    try:
        checkpoint = ensure_smollm2_checkpoint()
    except SmolLM2Unavailable as exc:
        pytest.skip(str(exc))
    process, children = _start(VLLM_OWNER.format(checkpoint=str(checkpoint)))
    try:
        names = {psutil.Process(pid).name() for pid in children if psutil.pid_exists(pid)}
        assert any(name.startswith("VLLM::EngineCor") for name in names), names
        _kill(process)
        assert _wait_gone(children) == []
    finally:
        for pid in children:
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)

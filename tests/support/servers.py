"""Small helpers every kind of test uses: a free loopback port, an ASGI app served on it by
uvicorn in a thread, polling until a condition holds."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from serve_app.cli.launch import free_side_ports


def free_port() -> int:
    """A loopback port nothing listens on, from below the kernel's ephemeral range: a port a
    bind to port 0 gave us could go to the next process that binds port 0 (Ray's processes do,
    as they start) before our server takes it."""
    return free_side_ports(1)[0]


@contextmanager
def uvicorn_server(app) -> Iterator[str]:
    """Serve an ASGI app on loopback in a thread; yields the `/v1` base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05):
    """Poll until `predicate()` is truthy or the time is up; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


def wait_for_port(process: subprocess.Popen, port: int, timeout_s: float, name: str) -> None:
    """Until a server process we started takes connections on its loopback `port`; raises if
    it exits first or the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start on port {port}") from None
            time.sleep(0.05)

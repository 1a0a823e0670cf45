from __future__ import annotations

import os
import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


@pytest.fixture(scope="session")
def replay_backend():
    from deployments.backends.replay import ReplayBackend

    return ReplayBackend()


@pytest.fixture(scope="session")
def inprocess_url(replay_backend) -> Iterator[str]:
    """The FastAPI app with the replay backend, served by uvicorn without Ray."""
    from serve_app.api import ServedModel, create_app

    app = create_app([ServedModel("gpt-oss-replay", replay_backend)], max_request_bytes=1024 * 1024)
    with uvicorn_server(app) as url:
        yield url

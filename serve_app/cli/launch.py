"""`responses-serve run`: Ray Serve's `serve run` of a checked config, with the cluster's settings,
watched until every model is ready.

`serve run` starts a local Ray cluster with Serve and deploys the file; the settings only the
cluster's processes read (`cluster_env`: Serve's HAProxy ingress and its binary, the
controller's loop period) must be in its environment when it starts, which a hand-started
`serve run` forgets. With vLLM on CPU it starts on the serving cores
(`python -m serve_app.engines.cpu_cores`), leaving the others to the model.

Meanwhile this process polls each application's readiness route (`/ready`) and says what is
still loading, when the server is ready, and if it stops being ready. Ctrl-C (or SIGTERM)
is passed on to `serve run` once, which shuts Serve and its cluster down; a second one
forces it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from serve_app.cli.configfile import ServeFile, has_cpu_vllm_engine

POLL_S = 1.0
POLL_READY_S = 5.0
REMIND_EVERY_S = 30.0
STOP_TIMEOUT_S = 90.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def say(message: str) -> None:
    """A status line of ours, told apart from Ray's and Serve's log lines."""
    print(f"responses-serve: {message}", flush=True)


# Serve's listeners besides the HTTP port, with Serve's defaults. Another Serve on this machine
# (a second `responses-serve run`, a test session) holding one would make HAProxy fail to
# start or, for the fallback proxy (its port is shared, SO_REUSEPORT), answer this app's
# requests with its own app while HAProxy has no replica to send them to.
SIDE_PORTS = {
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": 8500,
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": 9500,
    "RAY_SERVE_HAPROXY_STATS_PORT": 8404,
    "RAY_SERVE_HAPROXY_METRICS_PORT": 9101,
}


def side_ports(environ: dict[str, str]) -> dict[str, str]:
    """Free ports for those of `SIDE_PORTS` something on this machine listens on already
    (a value in `environ` is kept as it is)."""
    return side_port_env([name for name, default in SIDE_PORTS.items() if name not in environ and _listening(default)])


def side_port_env(names: Iterable[str]) -> dict[str, str]:
    """Each of the `SIDE_PORTS` settings `names`, set to a port of its own (`free_side_ports`)."""
    listed = list(names)
    return {name: str(port) for name, port in zip(listed, free_side_ports(len(listed)), strict=True)}


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


# Below the kernel's ephemeral range (Linux's default starts at 32768) and Serve's direct
# ingress ports for replicas (30000-31000, 40000-41000), above Ray's default worker ports
# (10002-19999).
SIDE_PORT_RANGE = range(20000, 30000)


def free_side_ports(count: int, tries: int = 200) -> list[int]:
    """`count` distinct ports nothing listens on, below the kernel's ephemeral range
    (32768-60999 by default). A port the kernel gives a bind to port 0 is free again once that
    bind is closed, and the next such bind may get it: Ray's dashboard agent, starting after,
    once took the fallback proxy's port that way and the proxy could not start. Binds to port
    0 are not given ports from this range."""
    ports: list[int] = []
    for port in random.sample(SIDE_PORT_RANGE, tries):
        if len(ports) == count:
            return ports
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            ports.append(port)
    if len(ports) < count:
        raise RuntimeError(f"fewer than {count} free ports among {tries} tried in {SIDE_PORT_RANGE.start}-{SIDE_PORT_RANGE.stop - 1}")
    return ports


def serve_command(config_path: Path, checked: ServeFile, environ: dict[str, str]) -> list[str]:
    """`serve run FILE`, on the serving cores when vLLM runs on CPU here."""
    serve = Path(sys.executable).parent / "serve"  # Ray's CLI, installed beside this interpreter
    command = [str(serve) if serve.is_file() else shutil.which("serve") or "serve", "run", str(config_path)]
    if has_cpu_vllm_engine(checked) and sys.platform.startswith("linux"):
        command = [sys.executable, "-m", "serve_app.engines.cpu_cores", *command]
    return command


@dataclass(frozen=True)
class Endpoint:
    """Where one application answers: its `/v1` base URL and its readiness route."""

    name: str
    base_url: str  # as the user reaches it
    ready_url: str  # as this process polls it


def endpoints(checked: ServeFile) -> list[Endpoint]:
    host = checked.host
    poll_host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    shown, polled = (_netloc(h, checked.port) for h in (host, poll_host))
    found = []
    for application in checked.applications:
        if application.route_prefix is None:  # not exposed over HTTP
            continue
        prefix = application.route_prefix.rstrip("/")
        found.append(Endpoint(application.name, f"http://{shown}{prefix}/v1", f"http://{polled}{prefix}/ready"))
    return found


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def readiness(url: str, timeout_s: float = 3.0) -> tuple[str, dict[str, Any]]:
    """("ready" | "not_ready", the models' states) from a readiness route, or ("starting", {})
    while nothing of ours answers there yet (no HTTP server, or Serve's own 503 before the
    ingress replicas run)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return "ready", json.loads(response.read()).get("models", {})
    except urllib.error.HTTPError as error:
        with contextlib.suppress(ValueError, AttributeError):
            body = json.loads(error.read())
            if error.code == 503 and isinstance(body.get("models"), dict):
                return "not_ready", body["models"]
        return "starting", {}
    except (OSError, ValueError):
        return "starting", {}


def describe_states(models: dict[str, Any]) -> str:
    """`loading: smollm2 (UPDATING); ready: gpt-oss-replay, qwen3-replay`."""
    groups: dict[str, list[str]] = {}
    for name, state in models.items():
        status = state.get("status", "?") if isinstance(state, dict) else "?"
        reason = state.get("reason") if isinstance(state, dict) else None
        groups.setdefault(status, []).append(f"{name} ({reason})" if reason else name)
    order = ["unavailable", "loading", "ready"]
    return "; ".join(f"{status}: {', '.join(names)}" for status, names in sorted(groups.items(), key=lambda g: _rank(order, g[0])))


def _rank(order: list[str], status: str) -> int:
    return order.index(status) if status in order else -1


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Watch:
    """What the applications say, turned into status lines when it changes."""

    def __init__(self, targets: list[Endpoint], probe: Callable[[str], tuple[str, dict[str, Any]]] = readiness) -> None:
        self.targets = targets
        self.probe = probe
        self.started = time.monotonic()
        self.ready = False
        self._last: dict[str, tuple[str, str]] = {}
        self._reminded = self.started

    def poll(self) -> None:
        states = {target.name: self.probe(target.ready_url) for target in self.targets}
        views = {name: (state, describe_states(models)) for name, (state, models) in states.items()}
        all_ready = bool(views) and all(state == "ready" for state, _ in views.values())
        now = time.monotonic()
        if all_ready and not self.ready:
            models = sorted({model for _, models in states.values() for model in models})
            urls = ", ".join(target.base_url for target in self.targets)
            say(f"READY after {_elapsed(now - self.started)}: {urls} serves {', '.join(models)}. Ctrl-C stops it.")
        elif not all_ready and (views != self._last or now - self._reminded >= REMIND_EVERY_S):
            self._reminded = now
            verb = "NOT READY" if self.ready else f"starting ({_elapsed(now - self.started)})"
            for target in self.targets:
                state, text = views[target.name]
                if state == "starting":
                    text = "waiting for Ray, Serve and the ingress to start"
                say(f"{verb}: {target.base_url}: {text}")
        self.ready, self._last = all_ready, views


def _child_setup() -> None:
    """In `serve run`'s process before it starts: Ctrl-C works there even where this process
    was started with SIGINT ignored (a background job), and it ends with this process."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@contextlib.contextmanager
def _stop_requests() -> Iterator[list[int]]:
    """SIGINT and SIGTERM to this process, counted instead of raised."""
    received: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_serve(command: list[str], environ: dict[str, str], targets: list[Endpoint]) -> int:
    """Run `serve run` until it ends or is stopped: its exit code, 0 when it stopped on request."""
    if not targets:
        say("no application of ours is exposed over HTTP: nothing to watch for readiness")
    say(f"starting: {' '.join(command)}")
    # A session of its own: a terminal's Ctrl-C reaches this process only, which passes it on once.
    process = subprocess.Popen(command, env=environ, start_new_session=True, preexec_fn=_child_setup)
    watch = Watch(targets)
    with _stop_requests() as stops:
        while process.poll() is None and not stops:
            if targets:
                watch.poll()
            _wait(process, POLL_READY_S if watch.ready else POLL_S, lambda: bool(stops))
        if process.returncode is None:
            return _stop(process, stops)
    code = process.returncode
    say(f"`serve run` exited with code {code}" + ("" if watch.ready else " before the server was ready"))
    return code or 1


def _stop(process: subprocess.Popen[bytes], stops: list[int]) -> int:
    """SIGINT to `serve run` (it shuts Serve and its cluster down), SIGKILL to its process group
    on a second request or after `STOP_TIMEOUT_S`. 0 when it stopped by itself, else 130."""
    say("stopping: Serve shuts down its replicas and the Ray cluster (Ctrl-C again to force it)")
    process.send_signal(signal.SIGINT)
    asked = len(stops)
    _wait(process, STOP_TIMEOUT_S, lambda: len(stops) > asked)
    if process.poll() is None:
        say("forcing the stop")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return 130
    say("stopped")
    return 0


def _wait(process: subprocess.Popen[bytes], seconds: float, interrupted: Callable[[], bool]) -> None:
    """Sleep up to `seconds`, less when the process ends or `interrupted()`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None and not interrupted():
        time.sleep(0.1)

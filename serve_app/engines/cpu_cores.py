"""Cores for a vLLM engine on CPU, and the other cores for everything else on its node.

vLLM's CPU worker binds its OpenMP threads to cores (`VLLM_CPU_OMP_THREADS_BIND`; `auto`
takes every core the process may use but the last, which it leaves to its scheduler).
Whatever else runs on those cores takes time from the model: on a 2-core box our stack
(ingress, Serve's proxy and controller, Ray's daemons) took a fifth of the worker's core
(bench/HISTORY.md). So a node that runs a CPU engine starts Ray on the
serving cores only (`python -m serve_app.engines.cpu_cores serve run ...`, which `make serve`
uses, or `taskset -c ...`), everything Ray starts inherits them, and the engine replica
gives its model the node's other cores (`cores_for_cpu_engine`). The model is vLLM's worker
and its engine core's scheduling thread: the two take turns (the engine core schedules a
step, the worker runs it), so they share a core, the scheduling thread as `SCHED_IDLE` (its
spinning wait takes no turns from a running step); the engine core's I/O threads (requests
in, outputs out) run beside the serving stack, in parallel with the model. A node started
on all its cores keeps vLLM's own rule. An explicit
`VLLM_CPU_OMP_THREADS_BIND` turns all this off (the cores it names must then be among the
replica's own).

    python -m serve_app.engines.cpu_cores COMMAND [ARG ...]

runs COMMAND on the serving cores: `RESPONSES_SERVE_CPUS` (a list such as `1` or `6-7`,
`all` for no pinning), by default the last core of the ones this process may use (none are
set aside on a 1-core machine).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator

import psutil

logger = logging.getLogger(__name__)

OMP_BIND = "VLLM_CPU_OMP_THREADS_BIND"
SERVING_CPUS = "RESPONSES_SERVE_CPUS"
MAX_AFFINITY_WALKS = 100  # a process that keeps starting threads from unmoved ones: give up


def parse_cores(text: str) -> set[int]:
    """`0,2-3` -> {0, 2, 3} (the kernel's and taskset's list format)."""
    cores: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


def format_cores(cores: Iterable[int]) -> str:
    return ",".join(str(core) for core in sorted(cores))


def serving_cores(available: set[int], setting: str | None) -> set[int] | None:
    """The cores Ray and Serve run on, or None to leave the affinity alone."""
    if setting is not None and setting.strip():
        if setting.strip() == "all":
            return None
        cores = parse_cores(setting)
        if not cores <= available:
            raise ValueError(f"{SERVING_CPUS}={setting}: cores {format_cores(cores - available)} are not available")
        return cores
    return {max(available)} if len(available) > 1 else None


def set_thread_affinity(pid: int, cores: set[int]) -> None:
    """Move every thread of a process (sched_setaffinity acts on one thread).

    A thread started meanwhile by one not moved yet inherits the old cores and is not in the
    list being walked (vLLM's engine core still starts its output thread's ZMQ threads after it
    reports ready): so the threads are walked again until a walk finds none to move. After that
    walk every thread is on `cores`, and so is any thread started later.
    """
    moved: list[int] = []

    def move(tid: int) -> None:
        if os.sched_getaffinity(tid) != cores:
            os.sched_setaffinity(tid, cores)
            moved.append(tid)

    for _ in range(MAX_AFFINITY_WALKS):
        moved.clear()
        _each_thread(pid, move)
        if not moved:
            return


def leave_batch_policy() -> None:
    """Every thread of this process back to the normal policy (SCHED_OTHER) if the launcher
    started it as SCHED_BATCH; threads and processes it starts later inherit that.

    For the processes on the request path, called as they start: our replicas and HAProxy
    (and so vLLM's processes, which an engine replica starts). Woken by a request or by a
    step's outputs, they then run at once instead of waiting behind whatever runs on the
    serving core until the next tick; Ray's own processes, which wake 100 times a second
    with nothing urgent to do, stay SCHED_BATCH. Measured (bench.vs_vllm): the first
    token at 8 and 32 streams 12-17 % sooner, tokens/s unchanged.
    """
    if not hasattr(os, "SCHED_BATCH") or os.sched_getscheduler(0) != os.SCHED_BATCH:
        return  # not Linux, or not started by the launcher

    def normal(tid: int) -> None:
        # Only a speed-up: a thread that may not change (a SCHED_IDLE one without the
        # RLIMIT_NICE to leave it) keeps its policy.
        with contextlib.suppress(PermissionError):
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))

    _each_thread(os.getpid(), normal)


def _each_thread(pid: int, apply: Callable[[int], None]) -> None:
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):  # the thread just ended
                apply(int(tid))


@contextlib.contextmanager
def cores_for_cpu_engine() -> Iterator[set[int]]:
    """Around the start of a vLLM CPU engine in this process: yields the cores its worker is
    bound to (empty: vLLM's own rule applies).

    When this process was started on fewer cores than the node has, the starting thread is
    widened to the whole node (vLLM's processes inherit it; OpenMP refuses a core outside the
    inherited set) and the worker is bound to the cores this process was not given. Once the
    engine is up, every thread of this process (vLLM's included) and of every engine process
    but the worker goes back to the given cores, except the main thread of the processes
    between this one and the worker (vLLM's engine core), which joins the worker's main thread
    on its core as `SCHED_IDLE`.

    Why the engine core's main thread goes with its worker (measured with bench.vs_vllm): it
    schedules a step and then spins while the worker runs it, and the worker
    spins while it schedules the next, each yielding the CPU on every turn of its wait; on one
    core they take turns at the cost of a yield. On the serving core it lost time to every
    wake-up of our stack between two steps, with the worker waiting. As `SCHED_IDLE` its
    spinning no longer takes turns from the worker while a step runs: it runs when the worker
    waits, which the worker's main thread does (yielding) until the next step comes. Anything
    else that runs on that core would starve it, so nothing should: OpenMP binds no other
    thread there, and Ray and our replicas run on the serving cores. Its I/O threads stay on
    the serving cores: beside the worker they would take time from the model while it runs a
    step (measured: the whole engine core there slowed one stream's decoding and first token).
    """
    if OMP_BIND in os.environ:  # the deployment placed the worker itself
        yield set()
        return
    given = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count() or 1))  # the kernel keeps what the cgroup allows
    spare = os.sched_getaffinity(0) - given
    if not spare:  # started on every core: vLLM's own rule
        os.sched_setaffinity(0, given)
        yield set()
        return
    os.environ[OMP_BIND] = format_cores(spare)
    try:
        yield spare
    finally:
        del os.environ[OMP_BIND]
        set_thread_affinity(os.getpid(), given)  # threads vLLM started here inherited the widening
        children = psutil.Process().children(recursive=True)
        workers = [child for child in children if _bound_within(child.pid, spare)]
        engine: dict[int, psutil.Process] = {}  # each engine core's pid -> its first worker
        for worker in sorted(workers, key=lambda w: w.pid):  # tensor-parallel rank 0 starts first
            for ancestor in _ancestors_below(worker, os.getpid()):
                engine.setdefault(ancestor.pid, worker)
        for child in children:
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if child not in workers:
                    set_thread_affinity(child.pid, given)
                if child.pid in engine:  # its main thread only (tid == pid)
                    os.sched_setaffinity(child.pid, os.sched_getaffinity(engine[child.pid].pid))  # OpenMP's main thread's core
                    _idle(child.pid)


def _idle(tid: int) -> None:
    """`SCHED_IDLE` for one thread; threads it starts later get the normal policy back."""
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE | os.SCHED_RESET_ON_FORK, os.sched_param(0))
    except PermissionError:
        logger.warning("thread %d: SCHED_IDLE refused; vLLM's scheduling thread keeps the normal policy", tid)


def _bound_within(pid: int, cores: set[int]) -> bool:
    """Whether the process's main thread is bound within `cores` (vLLM's worker binds itself)."""
    try:
        return os.sched_getaffinity(pid) <= cores
    except ProcessLookupError:
        return False


def _ancestors_below(process: psutil.Process, top: int) -> list[psutil.Process]:
    """The processes between `process` and its ancestor `top`, both excluded."""
    between = []
    with contextlib.suppress(psutil.Error):
        parent = process.parent()
        while parent is not None and parent.pid != top:
            between.append(parent)
            parent = parent.parent()
    return between


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(__doc__)
    try:
        cores = serving_cores(os.sched_getaffinity(0), os.environ.get(SERVING_CPUS))
    except ValueError as error:
        sys.exit(str(error))
    if cores is not None:
        os.sched_setaffinity(0, cores)
        # Everything started from here (Ray, Serve) is SCHED_BATCH: a process that wakes up
        # does not preempt the running one. The processes on the request path (our replicas,
        # HAProxy, vLLM's) go back to SCHED_OTHER as they start (`leave_batch_policy`), so
        # Ray's own wake-ups (100 a second in each of its processes) wait for them, not the
        # other way round. Shares of CPU time are unchanged.
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        print(f"serving on cores {format_cores(cores)}; a vLLM engine on CPU gets the others", file=sys.stderr)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])

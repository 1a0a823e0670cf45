"""Replica memory reports (deployments/memory.py): what bench.load reads after each run to
tell a leak in Python (objects, traced allocation sites) from the allocator (RSS vs heap)."""

from __future__ import annotations

import json
import mmap
import os
import socket
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

from deployments.builder import REPLICA_ENV
from deployments.memory import memory_report
from serve_app.config import ModelConfig
from serve_app.engines.allocator import RAY_JEMALLOC
from tests.deployments.conftest import E2E_APP, engine_stats
from tests.support import sdk_scenarios

REPO = Path(__file__).resolve().parents[2]


class Kept:
    pass


@pytest.mark.slow
def test_report_names_the_type_and_line_that_grew():
    kept: list[Kept] = []
    memory_report(trace_frames=4)  # starts tracing: the baseline
    try:
        kept.extend(Kept() for _ in range(5000))
        report = memory_report(top=50)
    finally:
        tracemalloc.stop()
    assert report["types_grew"]["Kept"] == 5000
    assert report["traced_mb"] > 0
    assert any(f"{__file__.rsplit('/', 1)[-1]}:" in line for line in report["lines_grew"][:3])
    assert "traced_mb" not in memory_report()  # off again: no tracing figures, no stale diff


def test_ingress_and_engine_replicas_report_their_own_memory(serve_url):
    from ray import serve

    engine = ModelConfig(name="gpt-oss-replay").deployment_name
    handles = {name: serve.get_deployment_handle(name, app_name=E2E_APP) for name in ("ResponsesIngress", engine)}
    readings: dict[str, list[dict]] = {name: [] for name in handles}
    for _ in range(3):  # the session has 2 ingress replicas: one of them is read twice
        sdk_scenarios.raw_stream(serve_url, {"model": "gpt-oss-replay", "input": "memory, please"})
        for name, handle in handles.items():
            readings[name].append(handle.memory.remote().result(timeout_s=60))

    ingress_pids = {r["pid"] for r in readings["ResponsesIngress"]}
    assert {r["pid"] for r in readings[engine]} == {engine_stats("gpt-oss-replay")["pid"]}
    assert engine_stats("gpt-oss-replay")["pid"] not in ingress_pids  # each replica reads itself
    by_replica: dict[int, list[dict]] = {}
    for reading in readings["ResponsesIngress"] + readings[engine]:
        by_replica.setdefault(reading["pid"], []).append(reading)
    assert any(len(by_replica[pid]) > 1 for pid in ingress_pids)
    for replica in by_replica.values():
        # each replica diffs against its own previous reading, none before its first
        assert "types_grew" not in replica[0]
        assert all("types_grew" in r for r in replica[1:])
        for reading in replica:
            assert reading["rss_mb"] > 0
            assert reading["threads"] > 1
            assert reading["tcp_connections"] > 0  # Ray's gRPC at least
            # Serve freezes what the replica made while starting; together a replica's worth
            assert reading["objects"] + reading["frozen_objects"] > 10_000
            assert sum(reading["types"].values()) <= reading["objects"]
            assert "traced_mb" not in reading  # tracing is off unless asked for
            assert reading["malloc_arena_max"] == REPLICA_ENV["MALLOC_ARENA_MAX"]  # the env reached the replica
            assert reading["malloc"]["allocator"] == "jemalloc"  # preloaded
            assert reading["malloc"]["in_use_mb"] > 0


@pytest.mark.slow
def test_rss_kinds_add_up_and_a_leak_shows_as_anon():
    before = memory_report()
    kinds = before["rss_kinds_mb"]
    assert set(kinds) == {"anon", "file", "shmem"}
    assert abs(sum(kinds.values()) - before["rss_mb"]) < 16  # two reads of a live process
    # Fresh pages, each written: a malloc'ed buffer may reuse free heap that is resident already
    held = mmap.mmap(-1, 64 * 2**20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # shared would be shmem
    for offset in range(0, len(held), mmap.PAGESIZE):
        held[offset] = 1
    after = memory_report()
    assert after["rss_kinds_mb"]["anon"] - kinds["anon"] > 60
    assert abs(after["rss_kinds_mb"]["file"] - kinds["file"]) < 8
    held.close()


ALLOCATION = textwrap.dedent("""
    import json
    from deployments.memory import malloc_info
    before = malloc_info()
    held = b"x" * (64 * 2**20)
    print(json.dumps([before, malloc_info()]))
""")


@pytest.mark.parametrize("preload", [RAY_JEMALLOC, ""], ids=["jemalloc", "glibc"])
def test_heap_in_use_follows_a_live_allocation_under_either_allocator(preload):
    """The replicas run on jemalloc (REPLICA_ENV), elsewhere glibc: both heaps are read."""
    result = subprocess.run(
        [sys.executable, "-c", ALLOCATION],
        env={**os.environ, "LD_PRELOAD": preload, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    before, after = json.loads(result.stdout)
    assert before["allocator"] == after["allocator"] == ("jemalloc" if preload else "glibc")
    assert after["in_use_mb"] - before["in_use_mb"] >= 64
    assert after["free_mb"] >= 0


@pytest.mark.slow
def test_established_tcp_connections_are_counted():
    before = memory_report()["tcp_connections"]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        clients = [socket.create_connection(listener.getsockname()) for _ in range(3)]
        servers = [listener.accept()[0] for _ in clients]
        opened = memory_report()["tcp_connections"]
        for end in clients + servers:
            end.close()
    assert opened - before >= 6  # both ends of each connection are this process's
    assert memory_report()["tcp_connections"] <= opened - 6

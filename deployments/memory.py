"""What a replica process holds in memory: `memory_report()`, behind each deployment's
`memory()` method (`bench.load` reads it after every run; also for debugging a live replica).

Nothing here runs unless asked: a call costs a full garbage collection and a walk over all
objects (~0.1-0.5 s on the replica's event loop), so it is a measuring tool, not a health
check. Layers, so that growth can be told apart:

- `rss_mb`: the process's resident memory (what the OS and Kubernetes count), and its
  kinds (`rss_kinds_mb`): `anon` (the process's own heap, stacks, Python's arenas: where a
  leak shows), `file` (pages of mapped files such as shared libraries, read in as code
  paths are first run) and `shmem` (shared memory mapped in, e.g. Ray's object store);
- `malloc`: the allocator's heap (jemalloc's statistics, or glibc's `mallinfo2`): bytes in
  use by live allocations vs. bytes freed but kept by the allocator (RSS growth with flat
  `in_use_mb` is the allocator, not a leak);
- `objects` / `types_grew`: objects the garbage collector tracks (not counting those Serve
  froze after the replica started), and the types whose count
  grew most since the previous call (Python-level leaks: ours, Serve's, Ray's Python);
- `tcp_connections`: established TCP connections of the process. An ingress replica keeps
  a little state per open HTTP connection (uvicorn's protocol and its last request), so its
  objects follow the keep-alive connections its front (HAProxy) holds open;
- `traced_mb` / `lines_grew`: with `trace_frames`, `tracemalloc` is started on the first
  call (after start-up, so imports are not counted) and later calls list the allocation
  sites (file:line, innermost frame first) that grew most since the previous call.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import gc
import os
import tracemalloc
from typing import Any

import psutil

_previous: dict[str, Any] = {"types": None, "snapshot": None}  # this process's last reading


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None)  # the symbols loaded in this process, libc's among them


def malloc_info() -> dict[str, Any] | None:
    """The allocator's heap in MB: live allocations (`in_use_mb`) and what it holds beyond them
    (`free_mb`: freed but kept). jemalloc's (preloaded: REPLICA_ENV) from its statistics,
    glibc's from `mallinfo2`; None under another allocator or libc."""
    libc = _libc()
    if hasattr(libc, "mallctl"):  # jemalloc's API: it is the allocator of this process
        return _jemalloc_info(libc)
    if not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return {
        "allocator": "glibc",
        "heap_mb": info.arena / 2**20,  # obtained with brk/mmap for the arenas
        "mmapped_mb": info.hblkhd / 2**20,  # large blocks, each its own mmap
        "in_use_mb": (info.uordblks + info.hblkhd) / 2**20,  # live allocations
        "free_mb": info.fordblks / 2**20,  # freed, still held by the allocator
    }


def _jemalloc_info(lib: ctypes.CDLL) -> dict[str, Any]:
    def read(name: bytes) -> int:
        value, size = ctypes.c_size_t(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
        if lib.mallctl(name, ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)) != 0:
            raise OSError(f"jemalloc: mallctl {name.decode()} failed")
        return value.value

    epoch = ctypes.c_uint64(1)  # jemalloc's statistics are a snapshot, taken anew on each write
    lib.mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.c_size_t(ctypes.sizeof(epoch)))
    allocated, resident = read(b"stats.allocated"), read(b"stats.resident")
    return {
        "allocator": "jemalloc",
        "in_use_mb": allocated / 2**20,  # live allocations
        # resident pages beyond them: freed pages not yet returned (jemalloc returns them after
        # ~10 s), partly used pages and its own metadata
        "free_mb": (resident - allocated) / 2**20,
    }


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_kinds_mb() -> dict[str, float]:
    """The RSS by kind, from /proc/self/status (`RssAnon`, `RssFile`, `RssShmem`, in kB)."""
    kinds = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile", "RssShmem"):
                kinds[name.removeprefix("Rss").lower()] = int(value.split()[0]) / 2**10
    return kinds


def memory_report(top: int = 8, trace_frames: int = 0, trim: bool = False) -> dict[str, Any]:
    """This process's memory, and what grew since the previous call (see the module doc).

    `trace_frames` > 0 starts `tracemalloc` with that many frames if it is not on yet.
    `trim`: after reading, return the allocator's free memory to the OS (`malloc_trim`) and
    report the RSS after it (`rss_after_trim_mb`): how much of the RSS was only held.
    """
    gc.collect()
    counts = collections.Counter(type(obj).__qualname__ for obj in gc.get_objects())
    report: dict[str, Any] = {
        "pid": os.getpid(),
        "rss_mb": rss_mb(),
        "rss_kinds_mb": rss_kinds_mb(),
        "malloc": malloc_info(),
        # Serve freezes what a replica made while starting (`gc.freeze()`); the collector no
        # longer walks those, and they are not counted in `objects`.
        "objects": counts.total(),
        "frozen_objects": gc.get_freeze_count(),
        "threads": len(os.listdir("/proc/self/task")),  # glibc gives threads arenas of their own
        "tcp_connections": sum(c.status == psutil.CONN_ESTABLISHED for c in psutil.Process().net_connections("tcp")),
        "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),  # glibc reads it at start-up
    }
    report["types"] = dict(counts.most_common(top))
    if _previous["types"] is not None:
        grew = counts.copy()
        grew.subtract(_previous["types"])
        report["types_grew"] = {name: n for name, n in grew.most_common(top) if n > 0}
    _previous["types"] = counts
    if trace_frames and not tracemalloc.is_tracing():
        tracemalloc.start(trace_frames)
    if tracemalloc.is_tracing():
        traced, peak = tracemalloc.get_traced_memory()
        report["traced_mb"], report["traced_peak_mb"] = traced / 2**20, peak / 2**20
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, f) for f in (tracemalloc.__file__, __file__)])
        if _previous["snapshot"] is not None:
            report["lines_grew"] = [
                f"{stat.size_diff / 1e3:+.1f} kB {stat.count_diff:+d} blocks "
                + " < ".join(f"{frame.filename.rsplit('site-packages/', 1)[-1]}:{frame.lineno}" for frame in reversed(stat.traceback))
                for stat in [s for s in snapshot.compare_to(_previous["snapshot"], "traceback") if s.size_diff > 0][:top]
            ]
        _previous["snapshot"] = snapshot
    else:
        _previous["snapshot"] = None  # tracing was stopped: no diff against an old one
    if trim and hasattr(_libc(), "malloc_trim"):
        _libc().malloc_trim(0)
        report["rss_after_trim_mb"] = rss_mb()
    return report

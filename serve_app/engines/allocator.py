"""The memory allocator of our replicas: Ray's jemalloc, preloaded, and how to undo that for
processes an engine starts.

Ray's wheel ships jemalloc for its own daemons. Preloaded into our replicas (the builder's
replica environment), it ends the RSS growth that glibc's per-thread arenas showed from run
to run under load (ray-project/ray#53261). The path is this install's: a node with Ray
installed elsewhere has the loader skip it with a warning, and glibc's malloc serves, with
two arenas instead of up to 8 per core. Found without importing Ray (only deployments/ does).
"""

from __future__ import annotations

import importlib.util
import os
import re


def _ray_jemalloc() -> str:
    spec = importlib.util.find_spec("ray")
    package = next(iter(spec.submodule_search_locations)) if spec and spec.submodule_search_locations else ""
    return os.path.join(package, "core", "libjemalloc.so")


RAY_JEMALLOC = _ray_jemalloc()
ALLOCATOR_ENV = {"LD_PRELOAD": RAY_JEMALLOC, "MALLOC_ARENA_MAX": "2"}


def drop_allocator_env() -> None:
    """Undo `ALLOCATOR_ENV` for the processes this one starts next (it stays in effect here:
    the loader and glibc read it when this process started); other `LD_PRELOAD` entries stay."""
    os.environ.pop("MALLOC_ARENA_MAX", None)
    kept = [entry for entry in re.split(r"[:\s]+", os.environ.get("LD_PRELOAD", "")) if entry and entry != RAY_JEMALLOC]
    if kept:
        os.environ["LD_PRELOAD"] = ":".join(kept)
    else:
        os.environ.pop("LD_PRELOAD", None)

"""The layering of pyproject.toml's [tool.importlinter] holds (`lint-imports`: serve_app's layers,
serve_app never importing deployments, Ray only in deployments/ and the CLI, FastAPI and
Starlette only in server/), and no module takes part in an import circle, within one layer
either. Imports inside functions and under TYPE_CHECKING count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).parent.parent


def import_cycles(*packages: str) -> list[list[str]]:
    """Every set of modules that import each other in a circle (strongly connected parts of
    the import graph of `packages`, with more than one module, or one importing itself)."""
    graph = grimp.build_graph(*packages, cache_dir=None)
    edges = {module: sorted(graph.find_modules_directly_imported_by(module) & graph.modules) for module in sorted(graph.modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in edges:  # Tarjan's algorithm, iterative (no recursion limit on deep chains)
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(edges[successor])))
                    break
                if successor in on_stack:
                    low[module] = min(low[module], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    part = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                        if member == module:
                            break
                    if len(part) > 1 or module in edges[module]:
                        cycles.append(sorted(part))
    return cycles


def test_import_contracts_are_kept():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    # This tree's packages, not whatever the environment's editable install points at.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " kept, 0 broken" in result.stdout
    assert "ignore_imports" not in (ROOT / "pyproject.toml").read_text()  # no contract has exceptions


def test_no_import_circle_in_serve_app_or_deployments():
    assert import_cycles("serve_app", "deployments") == []


def test_an_import_circle_is_found(tmp_path, monkeypatch):
    """The check above can fail: a package whose `a` imports `b` lazily and `b` imports `c`,
    which imports `a` under TYPE_CHECKING, is one circle; `d` importing `a` is outside it."""
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from circled import b\n")
    (package / "b.py").write_text("import circled.c\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circled.a import f\n")
    (package / "d.py").write_text("from circled import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("circled") == [["circled.a", "circled.b", "circled.c"]]

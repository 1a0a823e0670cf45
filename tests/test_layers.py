"""The layering contracts of pyproject.toml's [tool.importlinter] hold (import-linter):
protocol imports nothing else of ours, state never imports FastAPI or Ray, nothing under
responses_serve imports Ray but serve/. `make test` runs `lint-imports` too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_import_contracts_are_kept():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    # This tree's packages, not whatever the environment's editable install points at.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " kept, 0 broken" in result.stdout

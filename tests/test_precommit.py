"""The pre-commit hooks run exactly the tools `make check` runs, from the project's .venv."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).parent.parent


def test_pre_commit_runs_make_checks_tools():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^check:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe
    tools = {re.search(r"\$\(VENV\)/bin/([\w-]+)", line).group(1) for line in recipe.group(1).splitlines()}
    hooks = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    entries = {re.search(r"\.venv/bin/([\w-]+)", hook["entry"]).group(1) for hook in hooks}
    assert tools == entries == {"ruff", "mypy", "lint-imports", "mkdocs"}

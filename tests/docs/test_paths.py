"""Every path of this repository that the README, the docs, the shipped configs, the manifests
and the code's docstrings and comments name exists: a moved or deleted file leaves no stale
word behind. A path is named from the top (`serve_app/runtime/run.py`, `tests/...`, `k8s/...`)
or, inside the application, from its package (`runtime/run.py`, `serve_app/`'s folders)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent
TOP = ("serve_app", "deployments", "tests", "bench", "k8s", "docs", "examples", ".ci")
PACKAGE = ("api", "core", "families", "state", "engines", "tools", "runtime", "server", "serve", "config", "cli", "configs")
# A path: top-level folder or package folder, then at least one more part; stops at what
# cannot be part of a file name in prose (quotes, brackets, a colon before a symbol).
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(map(re.escape, TOP + PACKAGE))})/(?:[\w.*/-]*[\w*/])?)(?![\w-])")
# Pages that keep history (they name what was there then), and this test (it names stale paths on purpose).
HISTORY = {"CHANGELOG.md", "bench/HISTORY.md", "tests/docs/test_paths.py"}


def _files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [
        name
        for name in listed
        if name not in HISTORY
        and (name.endswith((".md", ".py", ".yaml", ".yml", ".toml", ".jinja", ".cfg")) or name in ("Makefile", ".ci/run"))
        and (ROOT / name).is_file()
    ]


def _exists(path: str, named_in: str) -> bool:
    path = path.rstrip("/.")
    if path.startswith("bench/results/"):  # what a benchmark writes when it runs
        return True
    candidates = [ROOT / path, ROOT / "serve_app" / path, (ROOT / named_in).parent / path]
    for candidate in candidates:
        if "*" in path:
            if list(ROOT.glob(str(candidate.relative_to(ROOT)))):
                return True
        elif candidate.exists():
            return True
    return False


def stale_paths(files: list[str]) -> list[str]:
    stale = []
    for name in files:
        for number, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1):
            if "://" in line and not name.endswith(".md"):
                line = re.sub(r"\w+://\S+", "", line)  # URLs are not repository paths
            for match in PATH.finditer(line):
                path = match.group(1)
                if "." not in path.rsplit("/", 1)[-1] and not path.endswith("/"):
                    continue  # `tools/list`, `server/discover`: MCP's methods, not files
                if path == "config/prometheus/" and name == "k8s/README.md":
                    continue  # KubeRay's repository's folder
                if path.startswith("tools/") and name.startswith("k8s/"):
                    path = "k8s/" + path  # the manifests name their own folder's files
                if not _exists(path, name):
                    stale.append(f"{name}:{number}: {path}")
    return stale


def test_every_path_named_exists():
    assert stale_paths(_files()) == []


def test_a_stale_path_is_found(tmp_path, monkeypatch):
    """The check can fail: a page naming the package's old folder and a file that is gone."""
    page = ROOT / "docs" / "_stale_probe.md"
    page.write_text("See responses_serve/serve/app.py, serve/app.py and runtime/gone.py; runtime/run.py is here.\n")
    try:
        assert stale_paths(["docs/_stale_probe.md"]) == ["docs/_stale_probe.md:1: serve/app.py", "docs/_stale_probe.md:1: runtime/gone.py"]
    finally:
        page.unlink()


@pytest.mark.parametrize("word", ["protocol/", "responses_serve"])
def test_no_word_of_the_old_layout(word):
    """The package was `responses_serve` with a `protocol/` folder: neither is named as code any more
    (the metric prefix `responses_serve_`, MCP meta keys and the vLLM plugin's name stay)."""
    if word == "responses_serve":  # as a name of code: `responses_serve.x`, `import responses_serve`, a path
        meta = "owner|container_id|create|status|session_id|allowed_domains|browser"  # our MCP servers' _meta keys
        pattern = re.compile(rf"(?<![\w\"'/])responses_serve(?:\.\w|/(?!(?:{meta})\b)|(?![\w/`\"']| =))")
    else:
        pattern = re.compile(r"(?<![\w/])protocol/")
    found = [
        f"{name}:{number}"
        for name in _files()
        for number, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []

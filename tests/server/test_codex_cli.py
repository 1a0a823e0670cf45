"""The real Codex CLI (`codex exec`, Responses wire API) against the in-process app on
`gpt-oss-replay`, configured by examples/codex/config.toml: its stateless requests (`store: false`, encrypted reasoning, its own tools),
`--output-schema` (a `text.format` json_schema), and a tool turn that Codex executes.

Skipped unless a `codex` binary is found: `CODEX_BIN`, the one `make install` puts in
tests/clients/node_modules (tests/clients/package.json), or `codex` on PATH. No Ray, no engine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest

INSTALLED = Path(__file__).resolve().parents[1] / "clients" / "node_modules" / ".bin" / "codex"
CODEX = os.environ.get("CODEX_BIN") or (str(INSTALLED) if INSTALLED.exists() else None) or shutil.which("codex")
EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "codex" / "config.toml"
pytestmark = [pytest.mark.skipif(not CODEX, reason="no codex binary (set CODEX_BIN or put codex on PATH)"), pytest.mark.slow]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


def codex_exec(url: str, tmp_path: Path, prompt: str, *args: str) -> str:
    """Run `codex exec` with a provider pointing at `url`; return its last message."""
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    # The configuration users copy (examples/codex/config.toml), pointed at this server.
    example = EXAMPLE_CONFIG.read_text()
    config = example.replace('base_url = "http://127.0.0.1:8000/v1"', f'base_url = "{url}"')
    assert config != example
    assert 'model = "gpt-oss-replay"' in config
    (home / "config.toml").write_text(config)
    last = tmp_path / "last.txt"
    command = [CODEX, "exec", "--skip-git-repo-check", "--ephemeral", "-s", "read-only", "-C", str(work), "-o", str(last), *args, prompt]
    done = subprocess.run(
        command, env={**os.environ, "CODEX_HOME": str(home)}, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return last.read_text()


def test_codex_exec_answers(inprocess_url, tmp_path):
    assert codex_exec(inprocess_url, tmp_path, "Hello from codex") == "Hello from codex"  # the replay echoes


def test_codex_exec_output_schema(inprocess_url, tmp_path):
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    answer = codex_exec(inprocess_url, tmp_path, "Plan a trip", "--output-schema", str(tmp_path / "schema.json"))
    jsonschema.validate(json.loads(answer), SCHEMA)


def test_codex_exec_runs_a_tool_call(inprocess_url, tmp_path):
    """Turn 1: the replay calls Codex's `exec_command`; Codex runs it and sends the output back
    with the reasoning it got (encrypted, `store: false`); turn 2 answers with that output."""
    answer = codex_exec(inprocess_url, tmp_path, 'call exec_command {"cmd": "echo hi-from-codex"}')
    assert answer.startswith("Tool exec_command returned:")
    assert "hi-from-codex" in answer

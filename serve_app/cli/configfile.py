"""A Serve config file, checked as `build_app` would check it, without Ray, a GPU, a store or the model.

Serve's own schema (`ServeDeploySchema`) checks the file; every application built by
`deployments.builder:build_app` gets our full check (`check_app_config`) under the
environment its cluster would start with (`cluster_env`). Problems come back with their
path in the file: `applications[0].args.models[0].backend.model`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from ray.serve.config import AutoscalingConfig
from ray.serve.schema import ServeDeploySchema

from serve_app.config import AppConfig, ConfigError, ModelConfig, ReplayBackendConfig, VLLMBackendConfig, config_problems
from serve_app.config.cluster import DEFAULT_ARGS, check_app_config, cluster_env

BUILDER = "deployments.builder:build_app"


@dataclass(frozen=True)
class Application:
    """One of our applications in a Serve config file."""

    name: str
    route_prefix: str | None
    config: AppConfig


@dataclass(frozen=True)
class ServeFile:
    """A checked Serve config file: its document, Serve's view of it, and our applications."""

    document: dict[str, Any]
    schema: ServeDeploySchema
    applications: list[Application]

    @property
    def host(self) -> str:
        return self.schema.http_options.host or "127.0.0.1"

    @property
    def port(self) -> int:
        return self.schema.http_options.port


def load_document(path: Path) -> dict[str, Any]:
    """The YAML document of a config file, or a `ConfigError` saying why there is none."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError([("", f"cannot read it: {exc.strerror or exc}")], heading="not a Serve config file") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([("", f"not valid YAML: {exc}")], heading="not a Serve config file") from None
    if not isinstance(document, dict):
        raise ConfigError([("", "expected a Serve config file (a mapping with `applications:`)")], heading="not a Serve config file")
    return document


def launch_environ(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment `responses-serve run` starts Ray and Serve with."""
    return {**environ, **cluster_env(environ)}


def check_serve_file(document: dict[str, Any], environ: Mapping[str, str] | None = None) -> ServeFile:
    """Serve's schema for the whole file, our full check for each of our applications; every
    problem found (not only the first), each with its path in the file."""
    environ = launch_environ() if environ is None else environ
    try:
        schema = ServeDeploySchema.model_validate(document)
    except ValidationError as exc:
        raise ConfigError(config_problems(exc, document), heading="invalid Serve config") from None
    problems: list[tuple[str, str]] = []
    applications = []
    for index, application in enumerate(schema.applications):
        if application.import_path != BUILDER:
            continue  # another application: Serve's schema is all we know of it
        args = document["applications"][index].get("args") or DEFAULT_ARGS  # as build_app
        try:
            config = check_app_config(args, environ, autoscaling_schema=AutoscalingConfig)
        except ConfigError as exc:
            problems += exc.under(f"applications[{index}].args").problems
            continue
        applications.append(Application(application.name, application.route_prefix, config))
    if problems:
        raise ConfigError(problems, heading="invalid config")
    return ServeFile(document, schema, applications)


def describe_model(model: ModelConfig) -> str:
    """`gpt-oss-20b (vllm gpu, TP 1, eagle3)` — what a model needs, in a few words."""
    backend = model.backend
    if isinstance(backend, ReplayBackendConfig):
        parts = [f"replay {backend.script}"]
    else:
        assert isinstance(backend, VLLMBackendConfig)
        parts = [f"vllm {backend.device}"]
        if backend.device == "gpu":
            parts.append(f"{backend.world_size} GPU{'s' if backend.world_size > 1 else ''} per replica")
        if backend.speculative_config is not None:
            parts.append(backend.speculative_config.method)
    return f"{model.name} ({', '.join(parts)})"


def describe_replicas(count: int | str | None, autoscaling: dict[str, Any] | None) -> str:
    if autoscaling is not None:
        return f"{autoscaling.get('min_replicas', 1)}-{autoscaling.get('max_replicas', 1)} (autoscaled)"
    return str(1 if count is None else count)


def summary(checked: ServeFile) -> str:
    """One line: each of our applications, its models, ingress replicas and store."""
    parts = []
    for application in checked.applications:
        config = application.config
        models = ", ".join(describe_model(model) for model in config.models)
        ingress = describe_replicas(config.ingress.num_replicas, config.ingress.autoscaling_config)
        parts.append(
            f"application {application.name!r} at {application.route_prefix}: {models}; "
            f"ingress replicas {ingress}; store {config.store.type}"
        )
    others = len(checked.schema.applications) - len(checked.applications)
    if others:
        parts.append(f"{others} other application{'s' if others > 1 else ''} (Serve's schema only)")
    return " | ".join(parts) if parts else "no applications"


def has_cpu_vllm_engine(checked: ServeFile) -> bool:
    """Whether an application runs vLLM on CPU here (the serving-cores launcher is for it)."""
    return any(
        isinstance(model.backend, VLLMBackendConfig) and model.backend.device == "cpu"
        for application in checked.applications
        for model in application.config.models
    )

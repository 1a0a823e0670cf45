"""Losing things mid-stream on the simulated multi-node cluster, each with open streams.

- an engine that cannot start: 503 `model_unavailable` at once, Serve's status says why,
  the other models keep serving;
- an ingress replica killed: its clients' connections drop, the engine aborts their
  requests (it watches its callers), the other ingress replica keeps serving;
- a GPU worker node removed: its streams end with `response.failed`, new requests succeed on
  the remaining GPU node, the replica comes back when the node does.

Order matters (pytest runs them in file order): the node loss comes last.
"""

from __future__ import annotations

import concurrent.futures
import glob
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.multinode.conftest import CPU_ONLY, alive_replicas, running_replicas
from tests.support import sdk_scenarios
from tests.support.contract import check_stream, parse_sse
from tests.support.servers import wait_until

APP = "failures"
BAD_MODEL_PATH = "/nonexistent/responses-serve/gpt-oss-broken"
# ~20 s of streaming at 150 ms per engine step: streams are still running when things are lost.
LONG_TEXT = "A stream long enough to lose something in the middle of it. " * 20
ENGINE = {"ray_actor_options": {"num_cpus": 0}, "health_check_period_s": 1, "health_check_timeout_s": 5}
ARGS = {
    "models": [
        # One GPU per replica, one replica per GPU node: losing a node loses one replica.
        {
            "name": "gpu-echo",
            "backend": {"type": "replay", "device": "gpu", "step_delay_ms": 150},
            "engine": {**ENGINE, "num_replicas": 2, "max_replicas_per_node": 1},
        },
        {"name": "cpu-echo", "backend": {"type": "replay", "step_delay_ms": 150}, "engine": {**ENGINE, "num_replicas": 1}},
        # A vLLM engine that cannot load its model.
        {
            "name": "broken",
            "backend": {"type": "vllm", "device": "cpu", "model": BAD_MODEL_PATH},
            # One failed start is enough to show DEPLOY_FAILED (Serve's default tries 3 times, ~15 s each here).
            "engine": {
                **ENGINE,
                "num_replicas": 1,
                "max_constructor_retry_count": 1,
                "ray_actor_options": {"num_cpus": 0, "runtime_env": {"env_vars": {"HF_HUB_OFFLINE": "1"}}},
            },
        },
    ],
    "ingress": {
        "num_replicas": 2,
        "max_replicas_per_node": 1,
        "max_ongoing_requests": 1024,
        "ray_actor_options": {"num_cpus": 0, "label_selector": CPU_ONLY},
    },
}


def _deployments_running() -> bool:
    return (
        running_replicas(APP, "ResponsesIngress") == 2
        and running_replicas(APP, "EngineServer-gpu-echo") == 2
        and running_replicas(APP, "EngineServer-cpu-echo") == 1
    )


@pytest.fixture(scope="module")
def app_url(sim_cluster):
    from ray import serve

    from deployments.builder import build_app

    # Not `serve.run`: it waits for every deployment to be healthy, and "broken" never is.
    # Like `serve deploy` (and a RayService), the healthy deployments serve meanwhile.
    serve._run(build_app(ARGS), _blocking=False, name=APP, route_prefix=f"/{APP}")
    assert wait_until(_deployments_running, timeout_s=300, interval_s=1.0), serve.status()
    try:
        yield f"{sim_cluster.http}/{APP}/v1"
    finally:
        serve.delete(APP)


def _engine_stats(model: str) -> dict:
    from ray import serve

    return serve.get_deployment_handle(f"EngineServer-{model}", app_name=APP).stats.remote().result(timeout_s=30)


@dataclass
class OpenStream:
    """A streaming request read on its own thread: raw bytes, whether tokens came, how it ended."""

    url: str
    body: dict
    raw: bytes = b""
    ended_at: float | None = None
    error: Exception | None = None
    has_tokens: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(60, read=30)) as http,
                http.stream("POST", f"{self.url}/responses", json={**self.body, "stream": True}) as response,
            ):
                assert response.status_code == 200, response.read()
                for chunk in response.iter_raw():
                    self.raw += chunk
                    if b".delta" in self.raw:
                        self.has_tokens.set()
        except Exception as exc:
            self.error = exc
        finally:
            self.ended_at = time.monotonic()

    @property
    def terminal(self) -> str | None:
        """The terminal event type, if the stream got one."""
        for kind in ("response.completed", "response.failed", "response.incomplete"):
            if f"event: {kind}".encode() in self.raw:
                return kind
        return None


def _open_streams(pool, url: str, model: str, count: int) -> list[OpenStream]:
    streams = [OpenStream(url, {"model": model, "input": f"{i} {LONG_TEXT}"}) for i in range(count)]
    for stream in streams:
        pool.submit(stream.run)
    for stream in streams:
        assert stream.has_tokens.wait(60), "every stream is generating before anything is lost"
    return streams


def test_engine_that_cannot_start_is_a_503_and_the_others_keep_serving(sim_cluster, app_url):
    from ray import serve

    with httpx.Client(timeout=30) as http:
        response = http.post(f"{app_url}/responses", json={"model": "broken", "input": "hello"})
        streamed = http.post(f"{app_url}/responses", json={"model": "broken", "input": "hello", "stream": True})
    for answer in (response, streamed):
        assert answer.status_code == 503
        error = answer.json()["error"]
        assert error["code"] == "model_unavailable"
        assert error["param"] == "model"
        assert "The model 'broken' is unavailable" in error["message"]
    # The other models keep serving.
    for model in ("cpu-echo", "gpu-echo"):
        events = sdk_scenarios.raw_stream(app_url, {"model": model, "input": "still serving", "max_output_tokens": 40})
        assert events[-1]["type"] in ("response.completed", "response.incomplete")

    # `serve status` says why: Serve gives up after its constructor retries, with the error.
    def failed():
        status = serve.status().applications[APP].deployments["EngineServer-broken"]
        return status if status.status == "DEPLOY_FAILED" else None

    status = wait_until(failed, timeout_s=240, interval_s=2.0)
    assert status, serve.status().applications[APP].deployments["EngineServer-broken"]
    assert "failed to start" in status.message
    cause = BAD_MODEL_PATH if _vllm_installed() else "vllm"
    assert cause in status.message
    # ... and so do the logs of the replicas that tried.
    logs = glob.glob(os.path.join(sim_cluster.cluster.head_node.get_session_dir_path(), "logs", "serve", "*"))
    assert any(cause in Path(path).read_text(errors="replace") for path in logs if os.path.isfile(path))
    with httpx.Client(timeout=30) as http:
        assert http.post(f"{app_url}/responses", json={"model": "broken", "input": "again"}).status_code == 503


def _vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def test_ingress_replica_killed_aborts_its_engine_requests(app_url):
    import ray

    model, count = "cpu-echo", 8
    before = _engine_stats(model)
    assert before["running"] == 0
    pool = concurrent.futures.ThreadPoolExecutor(count)
    streams = _open_streams(pool, app_url, model, count)
    during = _engine_stats(model)
    assert during["running"] == count
    assert sum(during["callers"].values()) == count
    # The engine knows which ingress replica reads each stream: kill the busiest.
    victim, lost = max(during["callers"].items(), key=lambda item: item[1])
    assert 0 < lost < count  # both ingress replicas read streams
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)

    # The victim's clients lose their connections; the engine stops generating for them
    # (CallerWatch), while the streams of the other ingress replica go on.
    assert wait_until(lambda: _engine_stats(model)["running"] == count - lost, timeout_s=5.0, interval_s=0.25), _engine_stats(model)
    pool.shutdown(wait=True)
    for stream in streams:
        if stream.terminal is None:  # dropped: the connection ended mid-stream
            assert stream.ended_at is not None
        else:  # served by the surviving replica, to the end
            assert check_stream(parse_sse(stream.raw)).status == "completed"
    assert sum(s.terminal is None for s in streams) == lost
    stats = _engine_stats(model)
    assert stats["running"] == 0
    assert stats["aborted"] - before["aborted"] == lost
    # New requests are served (by the survivor, then by the replacement too).
    sdk_scenarios.raw_stream(app_url, {"model": model, "input": "after the ingress loss", "max_output_tokens": 20})
    assert wait_until(lambda: running_replicas(APP, "ResponsesIngress") == 2, timeout_s=120, interval_s=1.0)


def test_gpu_node_lost_mid_stream(sim_cluster, app_url):
    model, count = "gpu-echo", 8
    engines = alive_replicas(APP, "EngineServer-gpu-echo")
    assert len(engines) == 2
    assert len({e.node_id for e in engines}) == 2
    lost_name, lost_node = next((n, node) for n, node in sim_cluster.gpu_nodes.items() if node.node_id == engines[0].node_id)
    survivor = engines[1]

    pool = concurrent.futures.ThreadPoolExecutor(count)
    streams = _open_streams(pool, app_url, model, count)
    removed_at = time.monotonic()
    sim_cluster.cluster.remove_node(lost_node)
    back = None
    try:
        pool.shutdown(wait=True)
        outcomes = [check_stream(parse_sse(s.raw)).status for s in streams]
        failed = [s for s, status in zip(streams, outcomes) if status == "failed"]
        assert set(outcomes) <= {"completed", "failed"}, outcomes
        assert failed, outcomes
        for stream in failed:
            assert stream.ended_at - removed_at < 10
            assert "engine" in check_stream(parse_sse(stream.raw)).error.message
        # New requests succeed on the remaining GPU node.
        for i in range(4):
            events = sdk_scenarios.raw_stream(app_url, {"model": model, "input": f"after the node loss {i}"})
            assert events[-1]["type"] == "response.completed"
        assert [e.node_id for e in alive_replicas(APP, "EngineServer-gpu-echo")] == [survivor.node_id]

        # The node comes back: the lost replica is started on it again.
        back = sim_cluster.add_gpu_node(lost_name)
        assert wait_until(lambda: running_replicas(APP, "EngineServer-gpu-echo") == 2, timeout_s=180, interval_s=1.0)
        assert {e.node_id for e in alive_replicas(APP, "EngineServer-gpu-echo")} == {survivor.node_id, back.node_id}
    finally:
        if back is None:  # later tests need the node's GPUs
            sim_cluster.add_gpu_node(lost_name)

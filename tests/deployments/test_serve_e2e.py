"""End to end through a real Ray cluster: HAProxy -> ResponsesIngress -> EngineServer.

One cluster and one Serve app for the session (`serve_url` in conftest.py); the official
`openai` SDK over HTTP; every stream checked by the contract validator.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import random
import re
import time

import httpx
import pytest

from serve_app.server.routes.event_stream import KEEPALIVE
from tests.deployments.conftest import E2E_APP, E2E_ARGS, engine_stats, session_haproxy_config
from tests.support import sdk_scenarios, socket_scenarios
from tests.support.contract import check_stream, parse_sse
from tests.support.servers import wait_until
from tests.support.vllm_models import have_vllm

LONG_TEXT = "Ray object streaming carries token batches; ünïcödé 日本語 👍🏽. " * 12


@pytest.mark.parametrize("model", sdk_scenarios.REPLAY_MODELS)
@pytest.mark.parametrize("scenario", sdk_scenarios.ALL, ids=lambda f: f.__name__)
def test_scenario(serve_url, scenario, model):
    scenario(serve_url, model)


@pytest.mark.parametrize("model", sdk_scenarios.REPLAY_MODELS)
def test_32_concurrent_streams(serve_url, model):
    sdk_scenarios.concurrent_streams(serve_url, 32, model)


@pytest.mark.parametrize("model", sdk_scenarios.REPLAY_MODELS)
@pytest.mark.parametrize("scenario", socket_scenarios.ALL, ids=lambda f: f.__name__)
def test_websocket_scenario(serve_url, scenario, model):
    """`/v1/responses` over a WebSocket through Serve's HAProxy to either ingress replica."""
    scenario(serve_url, model)


def test_websocket_lanes_run_side_by_side(serve_url):
    socket_scenarios.lanes_run_side_by_side(serve_url, "gpt-oss-replay-slow")


def test_websocket_connections_each_keep_their_chain_on_either_replica(serve_url, ingress_urls):
    """Connections through HAProxy land on either ingress replica, each keeping its own
    `store: false` chain; a stored response made on one replica is continued over a socket
    straight to the other."""
    model = "gpt-oss-replay"

    def chain(index: int) -> str:
        with socket_scenarios.socket(serve_url) as connection:
            previous = None
            for turn in range(3):
                socket_scenarios.create(
                    connection, model=model, input=f"conversation {index} turn {turn}", store=False, previous_response_id=previous
                )
                response = socket_scenarios.response_events(socket_scenarios.until_end(connection))[-1]["response"]
                assert response["status"] == "completed"
                assert response["previous_response_id"] == previous
                previous = response["id"]
            return previous

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert len(set(pool.map(chain, range(8)))) == 8
    first, second = ingress_urls
    with socket_scenarios.socket(first) as connection:
        socket_scenarios.create(connection, model=model, input="stored on the first replica")
        stored = socket_scenarios.response_events(socket_scenarios.until_end(connection))[-1]["response"]
    with socket_scenarios.socket(second) as connection:
        socket_scenarios.create(connection, model=model, input="continued on the second", previous_response_id=stored["id"])
        assert socket_scenarios.until_end(connection)[-1]["response"]["status"] == "completed"


def test_websocket_client_leaving_aborts_engine_requests(serve_url):
    model = "gpt-oss-replay-slow"
    before = engine_stats(model)
    with socket_scenarios.socket(serve_url) as connection:
        for lane in ("a", "b"):
            socket_scenarios.create(connection, model=model, input=f"{lane} {LONG_TEXT * 3}", stream_id=lane, store=False)
        deltas = 0
        while deltas < 6:
            deltas += socket_scenarios.receive(connection)["type"].endswith(".delta")
    assert wait_until(lambda: engine_stats(model)["running"] == 0, timeout_s=10), engine_stats(model)
    after = engine_stats(model)
    assert after["requests"] - before["requests"] == 2
    assert after["aborted"] - before["aborted"] == 2


def test_models_listed(serve_url):
    ids = {m.id for m in sdk_scenarios.client(serve_url).models.list()}
    replay = {
        "gpt-oss-replay",
        "qwen3-replay",
        "qwen3-vl-replay",
        "gpt-oss-replay-slow",
        "gpt-oss-replay-slow-raw",
        "gpt-oss-replay-metrics",
        "gpt-oss-replay-kill",
    }
    replay |= {"gpt-oss-replay-affinity", "gpt-oss-replay-spread", "gpt-oss-replay-tiers"}
    vllm = {"tiny-ngram", "tiny-gpt-oss", "smollm2-135m-instruct"}
    assert ids == (replay | vllm if have_vllm() else replay)
    assert sdk_scenarios.client(serve_url).models.retrieve("qwen3-replay").id == "qwen3-replay"


def test_client_disconnects_abort_engine_requests(serve_url):
    model = "gpt-oss-replay-slow"
    before = engine_stats(model)
    rng = random.Random(7)

    def cut_stream(index: int) -> bool:
        """Read a few chunks, then hang up; True if the response had already finished."""
        chunks_to_read = rng.randint(1, 12)
        body = {"model": model, "input": f"{index} {LONG_TEXT * 3}", "stream": True}
        with httpx.Client(timeout=30) as http, http.stream("POST", f"{serve_url}/responses", json=body) as response:
            assert response.status_code == 200
            raw = b""
            for read, chunk in enumerate(sdk_scenarios.event_chunks(response), start=1):
                raw += chunk
                if read >= chunks_to_read:
                    break  # leaving the block closes the connection mid-stream
        return b"event: response.completed" in raw

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        finished = sum(pool.map(cut_stream, range(20)))
    assert wait_until(lambda: engine_stats(model)["running"] == 0, timeout_s=2.0), engine_stats(model)
    after = engine_stats(model)
    reached_engine = after["requests"] - before["requests"]
    # A client cut right after `response.created` may leave before its engine call starts;
    # a client starved of CPU may read a whole response in a few chunks.
    assert 10 <= reached_engine <= 20
    assert finished <= 2
    assert after["aborted"] - before["aborted"] == reached_engine - finished  # every cut one aborted
    # The server keeps serving.
    sdk_scenarios.raw_stream(serve_url, {"model": model, "input": "still here"})


def test_client_leaving_a_non_streaming_request_aborts_it(serve_url):
    """Nothing reaches the client until the response is complete, so only HAProxy passing on
    the client's close tells the replica to stop: with Serve's kernel splicing it did not
    always (2 such requests in 9 ran to their end); `responses-serve-haproxy` turns it off."""
    model = "gpt-oss-replay-slow"
    before = engine_stats(model)
    body = {"model": model, "input": f"non-streaming {LONG_TEXT * 3}", "stream": False}
    with pytest.raises(httpx.ReadTimeout):  # long before the response could be complete
        httpx.post(f"{serve_url}/responses", json=body, timeout=httpx.Timeout(30, read=2))
    assert wait_until(lambda: engine_stats(model)["aborted"] == before["aborted"] + 1, timeout_s=10), engine_stats(model)
    after = engine_stats(model)
    assert after["requests"] == before["requests"] + 1
    assert after["running"] == 0


def test_our_replicas_run_at_normal_priority_serves_own_actors_at_rays(serve_url):
    """Ray starts its workers at nice 15; our replicas (and what an engine replica starts:
    vLLM's processes) run at 0, every one of their threads (deployments/builder.py
    REPLICA_ENV), while Serve's controller keeps Ray's default."""
    import ray
    from ray import serve
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    sdk_scenarios.raw_stream(serve_url, {"model": "gpt-oss-replay", "input": "priorities"})
    replicas = {
        "engine": engine_stats("gpt-oss-replay")["pid"],
        "ingress": serve.get_deployment_handle("ResponsesIngress", app_name=E2E_APP).memory.remote().result(timeout_s=60)["pid"],
    }
    for name, pid in replicas.items():
        niceness: dict[int, int] = {}
        for tid in map(int, os.listdir(f"/proc/{pid}/task")):
            with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                niceness[tid] = os.getpriority(os.PRIO_PROCESS, tid)  # a thread's own, on Linux
        assert len(niceness) > 5, name  # Ray's core worker, gRPC, the event loop: all of them
        assert set(niceness.values()) == {0}, (name, niceness)
    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    controller_pid = ray.get(controller.__ray_call__.remote(lambda _: os.getpid()), timeout=30)
    assert os.getpriority(os.PRIO_PROCESS, controller_pid) > 0


def test_coalescing_fewer_objects_same_events(serve_url):
    body = {"input": LONG_TEXT, "max_output_tokens": 400}
    results = {}
    for model in ("gpt-oss-replay-slow", "gpt-oss-replay-slow-raw"):
        before = engine_stats(model)
        events = sdk_scenarios.raw_stream(serve_url, {**body, "model": model})
        after = engine_stats(model)
        steps = after["engine_batches"] - before["engine_batches"]
        objects = after["ray_objects"] - before["ray_objects"]
        results[model] = (events, steps, objects)
    coalesced_events, steps, objects = results["gpt-oss-replay-slow"]
    raw_events, raw_steps, raw_objects = results["gpt-oss-replay-slow-raw"]
    assert steps == raw_steps > 20  # the same scripted engine steps
    # Off: one Ray object per engine step, after the acknowledgement (the first step takes 20 ms).
    assert raw_objects == raw_steps + 1
    assert objects < steps / 2  # on: a 100 ms window over 20 ms steps merges ~5 (>2 even when slowed)

    def shape(events):
        """Event types with runs of deltas collapsed, and the final items without ids."""
        types = [e["type"] for e in events]
        collapsed = [t for i, t in enumerate(types) if not (t.endswith(".delta") and i and types[i - 1] == t)]
        items = [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in events[-1]["response"]["output"]]
        return collapsed, items

    assert shape(coalesced_events) == shape(raw_events)


def test_keepalives_pass_through_haproxy(serve_url):
    """The session app's keep-alive (50 ms) is shorter than the slow model's 100 ms batches:
    comments reach the client between events, and the SDK reads the stream as without them."""
    body = {"model": "gpt-oss-replay-slow", "input": "keep me company"}
    raw = httpx.post(f"{serve_url}/responses", json={**body, "stream": True}, timeout=60).content
    assert KEEPALIVE in raw
    events = parse_sse(raw)
    check_stream(events)
    streamed = list(sdk_scenarios.client(serve_url).responses.create(**body, stream=True))
    assert [e.type for e in streamed if not e.type.endswith(".delta")] == [e["type"] for e in events if not e["type"].endswith(".delta")]
    assert streamed[-1].response.output_text == events[-1]["response"]["output"][-1]["content"][0]["text"] == "keep me company"


def _kill_replica(model: str) -> None:
    import ray

    ray.kill(ray.get_actor(engine_stats(model)["actor_name"], namespace="serve"), no_restart=True)


def test_haproxy_keeps_streams_across_its_reloads_as_long_as_the_longest_may_last(serve_url):
    """Serve reloads HAProxy at every change of replicas; the old process cuts what it still
    carries after `hard-stop-after`. The session's HAProxy (started as `make serve` starts
    it) keeps a stream at least the app's longest stream plus the drain margin."""
    from serve_app.config import SHUTDOWN_MARGIN_S, AppConfig
    from serve_app.config.cluster import CLUSTER_ENV, HAPROXY_HARD_STOP_AFTER

    longest = AppConfig.model_validate(E2E_ARGS).max_stream_duration_s
    hard_stop = re.findall(r"^\s*hard-stop-after (\d+)s$", session_haproxy_config(), re.M)
    assert hard_stop == [CLUSTER_ENV[HAPROXY_HARD_STOP_AFTER]], hard_stop
    assert int(hard_stop[0]) >= longest + SHUTDOWN_MARGIN_S


def test_replica_killed_mid_stream_fails_streams_then_recovers(serve_url):
    model = "gpt-oss-replay-kill"
    started = concurrent.futures.ThreadPoolExecutor(5)
    mid_stream = [False] * 5  # a delta arrived: the engine is generating for this stream

    def open_stream(index: int) -> tuple[list[dict], float]:
        with (
            httpx.Client(timeout=60) as http,
            http.stream(
                "POST", f"{serve_url}/responses", json={"model": model, "input": f"{index} {LONG_TEXT}", "stream": True}
            ) as response,
        ):
            raw = b""
            for chunk in response.iter_raw():
                raw += chunk
                mid_stream[index] = mid_stream[index] or b".delta" in raw
            return parse_sse(raw), time.monotonic()

    futures = [started.submit(open_stream, i) for i in range(5)]
    # Kill only once every stream has tokens: before that, the ingress would rightly retry
    # the request once on the restarted replica.
    assert wait_until(lambda: all(mid_stream), timeout_s=30)
    killed_at = time.monotonic()
    _kill_replica(model)
    for future in futures:
        events, ended_at = future.result(timeout=30)
        terminal = check_stream(events)
        assert terminal.status == "failed"
        assert terminal.error.code == "server_error"
        assert "engine" in terminal.error.message
        assert ended_at - killed_at < 10
    started.shutdown()

    def recovered() -> bool:
        try:
            response = sdk_scenarios.client(serve_url).responses.create(model=model, input="back again")
        except Exception:
            return False
        return response.output_text == "back again"

    assert wait_until(recovered, timeout_s=90, interval_s=1.0)


@pytest.mark.parametrize("model", sdk_scenarios.REPLAY_MODELS)
def test_structured_outputs_and_tool_choice_through_serve(serve_url, model):
    """The constraint travels with the GenerationRequest through the engine deployment."""
    from tests.families import test_structured_outputs as structured

    structured.test_json_schema_answer_validates_streaming_and_not(serve_url, model)
    structured.test_tool_choice_required_calls_a_tool_on_a_plain_message(serve_url, model)
    structured.test_named_function_and_allowed_tools_only_call_those(serve_url, model)
    structured.test_tool_choice_none_never_calls(serve_url, model)
    structured.test_agents_sdk_output_type_runs_end_to_end(serve_url, model)

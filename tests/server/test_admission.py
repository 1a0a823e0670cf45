"""Bounded admission in one ingress replica (config.ReplicaLimits), in process: past each
bound the next request is refused at once with Retry-After (a 503 for the replica's bounds,
a 429 for one connection's), never queued without end, and what was admitted goes on.
(Serve's own queues and the engines': tests/deployments/test_configs.py and bench.overload;
the tenants' quotas: tests/server/test_auth.py.)"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from serve_app.config import ReplicaLimits
from serve_app.engines.replay import ReplayBackend, ReplayConfig
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.server.context import app_context
from serve_app.state import ResponseStore
from serve_app.state.connection import ConnectionResponses, KeptBytes
from serve_app.state.memory import MemoryStore
from tests.support import socket_scenarios
from tests.support.servers import uvicorn_server, wait_until

SLOW = ReplayConfig(min_step_tokens=1, max_step_tokens=1, step_delay_s=0.02)
LIMITS = ReplicaLimits(max_background_runs=2, max_websockets=2, max_queued_per_lane=1, max_queued_per_connection=2)
LONG = "a long answer " * 40  # ~200 steps of 20 ms: seconds


@pytest.fixture(scope="module")
def engine():
    return ReplayBackend(SLOW)


@pytest.fixture(scope="module")
def url(engine):
    with uvicorn_server(create_app([ServedModel("slow", engine)], ServerSettings(replica_limits=LIMITS))) as url:
        yield url


@pytest.mark.slow
def test_background_runs_past_the_replicas_bound_are_503s(url, engine):
    with httpx.Client(base_url=url, timeout=30) as http:
        body = {"model": "slow", "input": LONG, "background": True}
        running = [http.post("/responses", json=body).json()["id"] for _ in range(2)]
        begin = time.monotonic()
        refused = http.post("/responses", json=body)
        assert time.monotonic() - begin < 5  # at once, not after the others
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "too_many_background_runs"
        assert "replica_limits.max_background_runs" in refused.json()["error"]["message"]
        assert http.post("/responses", json={"model": "slow", "input": "not in the background"}).status_code == 200
        for response_id in running:  # the admitted ones finish; then there is room again
            http.post(f"/responses/{response_id}/cancel")
        assert wait_until(lambda: engine.num_running() == 0, timeout_s=20)
        again = http.post("/responses", json=body)
        assert again.status_code == 200
        http.post(f"/responses/{again.json()['id']}/cancel")


def test_websocket_connections_past_the_replicas_bound_are_refused_with_503(url):
    with socket_scenarios.socket(url), socket_scenarios.socket(url):
        with pytest.raises(InvalidStatus) as refused, socket_scenarios.socket(url):
            pass
        response = refused.value.response
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert json.loads(response.body)["error"]["code"] == "too_many_connections"
    with socket_scenarios.socket(url) as connection:  # closed ones give their place back
        socket_scenarios.create(connection, model="slow", input="hello")
        assert socket_scenarios.until_end(connection)[-1]["type"] == "response.completed"


@pytest.mark.slow
def test_messages_queued_past_a_connections_bounds_are_429s_on_their_lane(url, engine):
    """One lane runs one response and queues one more (max_queued_per_lane); a third is
    refused on that lane; the connection queues two in all (max_queued_per_connection). The
    admitted ones all complete, in order."""
    with socket_scenarios.socket(url) as connection:
        for lane, text in (("a", LONG), ("a", "a2"), ("a", "a3"), ("b", LONG), ("b", "b2"), ("c", LONG), ("c", "c2")):
            socket_scenarios.create(connection, model="slow", input=text, stream_id=lane, store=False)
        ends: dict[str, list[str]] = {}
        while sum(len(v) for v in ends.values()) < 7:
            event = socket_scenarios.receive(connection)
            if event["type"] == "error":
                assert event["status"] == 429, event
                assert event["error"]["code"] == "too_many_queued", event
                ends.setdefault(event["stream_id"], []).append("429")
            elif event["type"] == "response.completed":
                ends.setdefault(event["stream_id"], []).append(event["response"]["output"][-1]["content"][0]["text"])
    assert ends["a"] == ["429", LONG, "a2"]  # a3: a's queue was full
    assert ends["b"] == [LONG, "b2"]
    assert ends["c"] == ["429", LONG]  # c2: the connection's queue was full (a2, b2)
    assert wait_until(lambda: engine.num_running() == 0, timeout_s=20)


@pytest.mark.slow
def test_a_connection_refused_with_a_429_is_read_again_only_after_its_wait():
    """A client flooding past its connection's queue gets one refusal, then its next message
    is read only once the refusal's wait is over: the flood waits in TCP's buffers instead of
    being read, parsed and refused at line rate."""
    app = create_app([ServedModel("slow", ReplayBackend(SLOW))], ServerSettings(replica_limits=LIMITS))
    with uvicorn_server(app) as url, socket_scenarios.socket(url) as connection:
        for text in (LONG, "queued", "over 1", "over 2", "over 3"):  # one lane: one running, one queued
            socket_scenarios.create(connection, model="slow", input=text, store=False)
        first = socket_scenarios.receive(connection)
        while first["type"] != "error":
            first = socket_scenarios.receive(connection)
        assert first["error"]["code"] == "too_many_queued"
        seen_at, refusals = time.monotonic(), 0
        while time.monotonic() - seen_at < 0.5:  # inside the wait, which began before the refusal was sent
            event = socket_scenarios.receive(connection)
            refusals += event["type"] == "error"
        assert refusals == 0, "the connection's next message was read before the refusal's wait was over"
    assert wait_until(lambda: app_context(app).websockets_open == 0, timeout_s=30)


def _turn(response_id: str, size: int):
    from tests.server.test_websocket import _response, _user

    return _response(response_id, None, "x" * size), _user(response_id)


def test_what_connections_keep_is_bounded_for_the_replica():
    """Two connections, one replica budget: the one that adds a turn past it gives up its own
    least recent lanes (its latest too, if it must); nothing is kept past the budget; a
    closed connection gives its share back."""
    replica = KeptBytes(60_000)
    shared = ResponseStore(MemoryStore(), "t")
    first, second = ConnectionResponses(shared, replica=replica), ConnectionResponses(shared, replica=replica)
    first.remember("a", *_turn("a1", 20_000))
    first.remember("b", *_turn("b1", 20_000))
    second.remember("c", *_turn("c1", 15_000))
    assert replica.total == first.bytes + second.bytes <= 60_000
    second.remember("d", *_turn("d1", 15_000))  # over: the second connection's own least recent lane goes
    assert replica.total <= 60_000
    assert len(first) == 2
    assert len(second) == 1
    second.remember("e", *_turn("e1", 70_000))  # alone over the budget: not kept at all
    assert replica.total <= 60_000
    assert len(second) == 0
    assert len(first) == 2
    first.close()
    assert replica.total == second.bytes == 0


@pytest.mark.slow
def test_request_bytes_in_flight_are_bounded_for_the_replica():
    """Bodies being read and parsed, and WebSocket requests queued or running, hold the
    replica's byte budget: one that does not fit is a 503 at once; the budget comes back."""
    limits = ReplicaLimits(max_request_bytes_in_flight=64 * 1024)
    app = create_app([ServedModel("slow", ReplayBackend(SLOW))], ServerSettings(max_request_bytes=64 * 1024, replica_limits=limits))
    with uvicorn_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        body = json.dumps({"model": "slow", "input": "x" * (40 * 1024), "max_output_tokens": 5}).encode()  # two do not fit

        refused_done = threading.Event()

        def slowly():  # a client that sends most of its body, then waits until the other was answered
            yield body[:-10]
            refused_done.wait(timeout=30)
            yield body[-10:]

        answers = {}
        sender = threading.Thread(target=lambda: answers.setdefault("slow", http.post("/responses", content=slowly())))
        sender.start()
        budget = app_context(app).request_bytes
        assert wait_until(lambda: budget.held >= len(body) - 10, timeout_s=30, interval_s=0.01)  # the first part is read
        with httpx.Client(base_url=url, timeout=30) as other:
            refused = other.post("/responses", content=body, headers={"content-type": "application/json"})
        refused_done.set()
        sender.join()
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "too_many_request_bytes"
        assert refused.headers["retry-after"] == "1"
        assert answers["slow"].status_code == 200
        assert http.post("/responses", content=body, headers={"content-type": "application/json"}).status_code == 200

        text = "x" * (25 * 1024)  # two fit, three do not
        with socket_scenarios.socket(url) as connection:
            short = {"model": "slow", "input": text, "store": False, "max_output_tokens": 20}
            socket_scenarios.create(connection, **short, stream_id="a")  # runs
            socket_scenarios.create(connection, **short, stream_id="a")  # waits
            socket_scenarios.create(connection, **short, stream_id="b")  # does not fit
            first = socket_scenarios.receive(connection)
            while first["type"] != "error":
                first = socket_scenarios.receive(connection)
            assert (first["status"], first["error"]["code"], first.get("stream_id")) == (503, "too_many_request_bytes", None)
            ends = 0
            while ends < 2:  # the admitted two complete; their bytes come back
                ends += socket_scenarios.receive(connection)["type"] == "response.incomplete"
        assert app_context(app).request_bytes.held == 0


# --- slow clients ------------------------------------------------------------------------

PATIENCE = ReplicaLimits(body_read_timeout_s=1.0, client_send_timeout_s=1.0)
WORDS = " w" * 60_000  # an echo of ~60,000 tokens: ~15 MB of events, far more than socket buffers hold


@pytest.fixture(scope="module")
def impatient():
    engine = ReplayBackend()
    app = create_app([ServedModel("fast", engine)], ServerSettings(replica_limits=PATIENCE))
    with uvicorn_server(app) as url:
        yield url, engine, app


def _rest(client) -> bytes:
    """What the server sent until it closed the connection."""
    client.settimeout(10)
    data = bytearray()
    while chunk := client.recv(1 << 20):
        data += chunk
    return bytes(data)


def _raw_client(url: str):
    """A TCP client with a tiny receive buffer: what the server writes to it piles up fast."""
    import socket
    from urllib.parse import urlsplit

    address = urlsplit(url)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect((address.hostname, address.port))
    return client


@pytest.mark.slow
def test_a_body_sent_too_slowly_is_a_408_and_gives_its_bytes_back(impatient):
    url, _, app = impatient
    client = _raw_client(url)
    try:
        head = "POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        client.sendall(head.encode() + b'{"model": "fast", "input": "' + b"x" * 50_000)  # then nothing more
        client.settimeout(10)
        answer = client.recv(65536).decode()
    finally:
        client.close()
    assert answer.startswith("HTTP/1.1 408")
    assert "request_timeout" in answer
    assert "body_read_timeout_s" in answer
    assert wait_until(lambda: app_context(app).request_bytes.held == 0, timeout_s=5)


@pytest.mark.slow
def test_a_client_that_reads_nothing_of_its_stream_is_dropped_and_its_engine_request_aborted(impatient):
    url, engine, _ = impatient
    body = json.dumps({"model": "fast", "input": WORDS, "stream": True, "store": False}).encode()
    client = _raw_client(url)
    try:
        head = f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        client.sendall(head.encode() + body)  # and never reads
        assert wait_until(lambda: engine.num_running() == 1, timeout_s=10)
        assert wait_until(lambda: engine.num_running() == 0, timeout_s=15), "the stalled stream still holds its engine request"
        sent = _rest(client)  # the connection was closed mid-stream: no terminal event
    finally:
        client.close()
    assert b"response.output_text.delta" in sent
    assert b"event: response.completed" not in sent
    assert b"response.incomplete" not in sent


@pytest.mark.slow
def test_a_websocket_client_that_reads_nothing_is_dropped(impatient):
    import base64
    import os

    url, engine, app = impatient
    client = _raw_client(url)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        client.sendall(
            (
                "GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        client.settimeout(10)
        assert client.recv(4096).startswith(b"HTTP/1.1 101")
        message = json.dumps({"type": "response.create", "model": "fast", "input": WORDS, "store": False}).encode()
        mask = os.urandom(4)
        frame = bytes([0x81, 0xFF]) + len(message).to_bytes(8, "big") + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(message))
        client.sendall(frame)  # one masked text frame; then nothing is read
        assert wait_until(lambda: engine.num_running() == 1, timeout_s=10)
        assert wait_until(lambda: engine.num_running() == 0 and app_context(app).websockets_open == 0, timeout_s=15)
        assert app_context(app).request_bytes.held == 0
        sent = _rest(client)
    finally:
        client.close()
    assert b"response.output_text.delta" in sent
    assert b'"response.completed"' not in sent
    assert b'"response.incomplete"' not in sent

"""A tenant's limits keep it from filling the replica's request-byte budget, in process, two
tenants and more on one replica (issue 40, "Quotas before bodies").

The attack a security review made: quotas were checked after the body was read, so a tenant
out of requests (`requests_per_minute` spent, `max_concurrent_requests: 1`) held four
never-finished 64 KiB uploads, the replica's 256 KiB budget was full, and another tenant got
`503 too_many_request_bytes` until they timed out; over a WebSocket, 16 queued full-size
`response.create` behind one long response held the budget as long as it ran. Now a request
is admitted from its headers, before its body is read (a 429 while it is still being sent),
and the bytes one tenant holds, bodies and queued messages alike, count against its share of
the budget (`replica_limits.max_request_bytes_in_flight_per_tenant`)."""

from __future__ import annotations

import json
import select
import socket
from urllib.parse import urlsplit

import httpx
import pytest

from serve_app.config import AppConfig, AuthConfig, ReplicaLimits
from serve_app.engines.replay import ReplayBackend, ReplayConfig
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.server.context import app_context
from serve_app.state import MemoryStore
from tests.support import socket_scenarios
from tests.support.servers import uvicorn_server, wait_until
from tests.support.tenant_scenarios import bearer

pytestmark = pytest.mark.slow  # seconds each (slow uploads, large conversations): make test runs them, test-fast not

KIB = 1024
MAX_REQUEST_BYTES = 64 * KIB
LIMITS = ReplicaLimits(max_request_bytes_in_flight=256 * KIB, body_read_timeout_s=20)  # a tenant's share: 64 KiB
KEYS = {name: f"sk-{name}-0123456789abcdef" for name in ("spent", "single", "bulk", "victim")}
AUTH = AuthConfig.model_validate(
    {
        "keys": [
            {"tenant": "spent", "key_env": "SPENT", "limits": {"requests_per_minute": 1, "max_concurrent_requests": 1}},
            {"tenant": "single", "key_env": "SINGLE", "limits": {"max_concurrent_requests": 1}},
            {"tenant": "bulk", "key_env": "BULK"},  # no limits of its own: only its share of the bytes
            {"tenant": "victim", "key_env": "VICTIM"},
        ]
    }
)
BODY = json.dumps({"model": "fast", "input": "x" * (62 * KIB), "max_output_tokens": 5}).encode()  # within the 64 KiB
SENT = len(BODY) - KIB  # what an unfinished upload sends of it: two do not fit in a tenant's share
LONG = "a long answer " * 400  # one token a step, 50 ms a step: far longer than any test here


@pytest.fixture(scope="module")
def server():
    """One replica; the store's clock stands still, so a spent bucket stays spent."""
    app = create_app(
        [ServedModel("fast", ReplayBackend()), ServedModel("slow", ReplayBackend(ReplayConfig(step_delay_s=0.05)))],
        ServerSettings(auth=AUTH, max_request_bytes=MAX_REQUEST_BYTES, replica_limits=LIMITS),
        store=MemoryStore(clock=lambda: 1000.0),
        environ={name.upper(): key for name, key in KEYS.items()},
    )
    with uvicorn_server(app) as url:
        yield url, app


def _upload(url: str, key: str, sent: int = SENT, body: bytes = BODY) -> socket.socket:
    """A `POST /v1/responses` declaring the whole `body`, of which only `sent` bytes are sent."""
    address = urlsplit(url)
    client = socket.create_connection((address.hostname, address.port), timeout=60)
    head = (
        f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    client.sendall(head.encode() + body[:sent])
    return client


def _answered(client: socket.socket) -> bool:
    """Whether the server has sent something on this connection (without reading it)."""
    return bool(select.select([client], [], [], 0)[0])


def _answer(client: socket.socket) -> tuple[int, dict[str, str], dict]:
    """The status, headers and JSON body of the one answer on this connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(65536)
        assert chunk, f"closed without an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    while len(body) < int(headers["content-length"]):
        chunk = client.recv(65536)
        assert chunk, "closed inside the answer"
        body += chunk
    return int(status_line.split()[1]), headers, json.loads(body)


def _post(url: str, tenant: str, content: bytes = BODY) -> httpx.Response:
    with httpx.Client(timeout=60, headers=bearer(KEYS[tenant])) as http:
        return http.post(f"{url}/responses", content=content, headers={"content-type": "application/json"})


def _settled(app, uploads: list[socket.socket]) -> bool:
    """Each upload answered, or its bytes held by the server (one that reads bodies first)."""
    held = app_context(app).request_bytes.held
    return sum(_answered(upload) for upload in uploads) + held // SENT >= len(uploads)


def _closed(uploads: list[socket.socket], app) -> None:
    for upload in uploads:
        upload.close()
    assert wait_until(lambda: app_context(app).request_bytes.held == 0 and len(app_context(app).leases) == 0, timeout_s=30)


def test_a_tenant_out_of_requests_is_refused_before_its_body_and_holds_no_bytes(server):
    """`spent` uses its one request a minute; then it starts four 62 KiB uploads and never
    finishes them. Each is refused with the 429 of `requests_per_minute` while it is still
    being sent (`requests_per_minute`, or `max_concurrent_requests` while another of them
    held its one place): the server never read it (no byte of it held), and `victim`'s body of the
    same size is served. (Before: the four held 244 KiB of the 256 KiB budget, and `victim`
    got a 503 `too_many_request_bytes`.)"""
    url, app = server
    spent = _post(url, "spent", json.dumps({"model": "fast", "input": "hi"}).encode())
    assert spent.status_code == 200
    assert spent.headers["x-ratelimit-remaining-requests"] == "0"
    uploads = [_upload(url, KEYS["spent"]) for _ in range(4)]
    try:
        assert wait_until(lambda: _settled(app, uploads), timeout_s=30)
        assert _post(url, "victim").status_code == 200
        assert app_context(app).request_bytes.held == 0  # none of the four, still open, was read
        for upload in uploads:
            status, headers, body = _answer(upload)
            assert status == 429, body
            assert body["error"]["code"] == "rate_limit_exceeded"
            # Out of requests; or, while another of the four held its place to find that out, at its one place.
            assert "(requests_per_minute)" in body["error"]["message"] or "(max_concurrent_requests)" in body["error"]["message"]
            assert headers["x-ratelimit-limit-requests"] == "1"
            assert headers["x-ratelimit-remaining-requests"] == "0"
            assert int(headers["retry-after"]) >= 1
    finally:
        _closed(uploads, app)


def test_an_upload_holds_its_tenants_concurrency_place(server):
    """`single` may run one request at a time: an upload it has not finished holds that place,
    so a second upload is refused (429, `max_concurrent_requests`) before its body; the first,
    finished, is answered, and then the place is free again."""
    url, app = server
    first = _upload(url, KEYS["single"])
    second = None
    try:
        assert wait_until(lambda: len(app_context(app).leases) == 1, timeout_s=10), "the unfinished upload was not admitted"
        second = _upload(url, KEYS["single"])
        status, _, body = _answer(second)
        assert status == 429, body
        assert body["error"]["code"] == "rate_limit_exceeded"
        assert "max_concurrent_requests" in body["error"]["message"]
        first.sendall(BODY[SENT:])
        status, _, body = _answer(first)
        assert status == 200, body
        assert _post(url, "single").status_code == 200
    finally:
        _closed([first] + ([second] if second is not None else []), app)


def test_a_tenants_slow_bodies_hold_at_most_its_share_of_the_replicas_bytes(server):
    """`bulk` has no limits of its own; its four unfinished uploads hold at most its share
    (64 KiB of the 256 KiB): one is held, the others are refused (429
    `too_many_request_bytes`, naming the share), and `victim` is served. (Before: the four
    held the budget, and `victim` got a 503.)"""
    url, app = server
    uploads = [_upload(url, KEYS["bulk"]) for _ in range(4)]
    try:
        assert wait_until(lambda: _settled(app, uploads), timeout_s=30)
        assert _post(url, "victim").status_code == 200
        assert app_context(app).request_bytes.held <= LIMITS.tenant_request_bytes(MAX_REQUEST_BYTES)
        refused = [_answer(upload) for upload in uploads if _answered(upload)]
        assert len(refused) == 3
        for status, headers, body in refused:
            assert status == 429, body
            assert body["error"]["code"] == "too_many_request_bytes"
            assert "replica_limits.max_request_bytes_in_flight_per_tenant" in body["error"]["message"]
            assert headers["retry-after"] == "1"
    finally:
        _closed(uploads, app)


def test_queued_websocket_requests_hold_at_most_their_tenants_share(server):
    """`bulk` runs one long response on a lane and queues 16 more full-size `response.create`
    behind it: they count against its share while they wait, so one is queued and 15 are
    refused on the connection (429 `too_many_request_bytes`), and `victim`'s POST is served
    while the long response runs. (Before: four were queued, twelve refused with a 503, and
    `victim` got a 503 for as long as the response ran.)"""
    url, app = server
    big = {"model": "fast", "input": "x" * (56 * KIB), "max_output_tokens": 5, "store": False, "stream_id": "a"}
    with socket_scenarios.socket(url, bearer(KEYS["bulk"])) as connection:
        socket_scenarios.create(connection, model="slow", input=LONG, store=False, stream_id="a")
        for _ in range(16):
            socket_scenarios.create(connection, **big)
        socket_scenarios.create(connection, model="missing", input="hi", stream_id="marker")  # after the 16, an error of its own
        refusals = []
        while (event := socket_scenarios.receive(connection)).get("stream_id") != "marker" or event["type"] != "error":
            if event["type"] == "error":
                refusals.append((event["status"], event["error"]["code"]))
        assert refusals == [(429, "too_many_request_bytes")] * 15
        assert app_context(app).request_bytes.held <= LIMITS.tenant_request_bytes(MAX_REQUEST_BYTES)
        assert _post(url, "victim").status_code == 200
    assert wait_until(lambda: app_context(app).request_bytes.held == 0, timeout_s=30)


# -- no leaked admission: a request admitted before its body gives its place back however it ends


def test_a_body_that_fails_gives_its_place_back(server):
    """`single` may run one request at a time: after a body that does not parse, one over the
    size limit (declared, and sent without a length), and one whose client went away halfway,
    it still gets its place, and this replica holds no lease and no byte."""
    url, app = server
    with httpx.Client(timeout=60, headers=bearer(KEYS["single"])) as http:
        bad = http.post(f"{url}/responses", content=b'{"model": "fast", "input": ', headers={"content-type": "application/json"})
        assert bad.status_code == 400
        assert len(app_context(app).leases) == 0
        assert _post(url, "single").status_code == 200

        huge = json.dumps({"model": "fast", "input": "x" * MAX_REQUEST_BYTES}).encode()
        declared = http.post(f"{url}/responses", content=huge, headers={"content-type": "application/json"})
        assert declared.status_code == 413
        unannounced = http.post(f"{url}/responses", content=iter([huge[:40_000], huge[40_000:]]))  # chunked: no length
        assert unannounced.status_code == 413
        assert unannounced.json()["error"]["code"] == "request_too_large"
        assert len(app_context(app).leases) == 0
        assert _post(url, "single").status_code == 200

    gone = _upload(url, KEYS["single"])
    assert wait_until(lambda: len(app_context(app).leases) == 1, timeout_s=10)
    _closed([gone], app)  # the client went away mid-body: its lease and bytes are given back
    assert _post(url, "single").status_code == 200


# -- the share itself ---------------------------------------------------------------------------


def test_a_tenants_share_defaults_to_a_quarter_and_fits_the_largest_request():
    limits = ReplicaLimits()
    assert limits.tenant_request_bytes(8 * 1024 * KIB) == 64 * 1024 * KIB  # a quarter of 256 MiB
    assert ReplicaLimits(max_request_bytes_in_flight=16 * 1024 * KIB).tenant_request_bytes(8 * 1024 * KIB) == 8 * 1024 * KIB
    assert ReplicaLimits(max_request_bytes_in_flight_per_tenant=32 * KIB).tenant_request_bytes(16 * KIB) == 32 * KIB
    model = {"name": "m"}
    with pytest.raises(ValueError, match="max_request_bytes_in_flight_per_tenant"):
        AppConfig.model_validate({"models": [model], "replica_limits": {"max_request_bytes_in_flight_per_tenant": 4096}})
    with pytest.raises(ValueError, match="max_request_bytes_in_flight_per_tenant"):
        AppConfig.model_validate(
            {
                "models": [model],
                "max_request_bytes": 4096,
                "replica_limits": {"max_request_bytes_in_flight": 8192, "max_request_bytes_in_flight_per_tenant": 16384},
            }
        )


def test_without_tenants_the_one_caller_has_the_whole_budget():
    """Without `auth` everyone is one tenant: no share of its own, the replica's budget is its."""
    app = create_app([ServedModel("fast", ReplayBackend())], ServerSettings(max_request_bytes=MAX_REQUEST_BYTES, replica_limits=LIMITS))
    budget = app_context(app).request_bytes
    assert budget.per_tenant is None
    for _ in range(4):
        budget.take(SENT, "anonymous")
    assert budget.held == 4 * SENT

"""Quotas through the HTTP API, in-process: two apps on one store stand for two ingress replicas
(the same scenarios through Serve: tests/deployments/test_tenants_e2e.py)."""

from __future__ import annotations

import httpx
import pytest

from serve_app.config import AuthConfig
from serve_app.engines.replay import ReplayBackend, ReplayConfig
from serve_app.runtime.metrics import NoMetrics
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.state import MemoryStore
from tests.support import socket_scenarios, tenant_scenarios
from tests.support.contract import parse_sse
from tests.support.servers import uvicorn_server
from tests.support.tenant_scenarios import bearer

KEYS = {name: f"sk-{name}-0123456789abcdef" for name in ("burst", "busy", "tokens", "free", "socket", "metered", "single", "pair")}
AUTH = AuthConfig.model_validate(
    {
        "keys": [
            {"tenant": "burst", "key_env": "BURST", "limits": {"requests_per_minute": 12}},
            {"tenant": "busy", "key_env": "BUSY", "limits": {"max_concurrent_requests": 2, "max_background": 1}},
            {"tenant": "tokens", "key_env": "TOKENS", "limits": {"tokens_per_minute": 300}},
            {"tenant": "free", "key_env": "FREE"},
            {"tenant": "socket", "key_env": "SOCKET", "limits": {"requests_per_minute": 1}},
            {"tenant": "metered", "key_env": "METERED", "limits": {"requests_per_minute": 3, "tokens_per_minute": 1_000_000}},
            {"tenant": "single", "key_env": "SINGLE", "limits": {"max_concurrent_requests": 1}},
            {"tenant": "pair", "key_env": "PAIR", "limits": {"max_concurrent_requests": 2}},
        ]
    }
)
ENVIRON = {name.upper(): key for name, key in KEYS.items()}


class Refusals(NoMetrics):
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str]] = []

    def refused(self, tenant: str, status: int, reason: str) -> None:
        self.seen.append((tenant, status, reason))


@pytest.fixture(scope="module")
def metrics() -> Refusals:
    return Refusals()


@pytest.fixture(scope="module")
def replica_urls(metrics):
    """Two apps (replicas) on one store, each with a slow model for requests that must overlap."""
    store = MemoryStore()
    apps = [
        create_app(
            [ServedModel("gpt-oss-replay", ReplayBackend()), ServedModel("slow", ReplayBackend(ReplayConfig(step_delay_s=0.05)))],
            ServerSettings(auth=AUTH),
            store=store,
            environ=ENVIRON,
            metrics=metrics,
        )
        for _ in range(2)
    ]
    with uvicorn_server(apps[0]) as first, uvicorn_server(apps[1]) as second:
        yield [first, second]


@pytest.mark.slow
def test_requests_per_minute_holds_across_replicas_and_the_sdk_retries(replica_urls, metrics):
    tenant_scenarios.burst_within_requests_per_minute(replica_urls, KEYS["burst"], per_minute=12)
    tenant_scenarios.the_sdk_retries_after_a_429(replica_urls[1], KEYS["burst"])
    assert ("burst", 429, "requests_per_minute") in metrics.seen


def test_max_concurrent_requests_holds_across_replicas(replica_urls):
    tenant_scenarios.max_concurrent_requests_refuses_the_next(replica_urls[0], KEYS["busy"], "slow", limit=2)


def test_followers_of_background_responses_hold_concurrent_places(replica_urls):
    tenant_scenarios.followers_hold_concurrent_places(replica_urls[0], replica_urls[1], KEYS["single"], KEYS["pair"], "slow")


def test_max_background_refuses_the_next(replica_urls):
    tenant_scenarios.max_background_refuses_the_next(replica_urls[1], KEYS["busy"], "slow", limit=1)


def test_a_stream_is_never_cut_for_tokens_and_its_tokens_are_a_debt(replica_urls):
    """300 tokens a minute; one stream of far more runs to its end, then the tenant waits."""
    with httpx.Client(timeout=120, headers=bearer(KEYS["tokens"])) as http:
        first = http.post(f"{replica_urls[0]}/responses", json={"model": "gpt-oss-replay", "input": "many tokens " * 200, "stream": True})
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit-tokens"] == "300"
        assert b"response.completed" in first.content
        refused = http.post(f"{replica_urls[1]}/responses", json={"model": "gpt-oss-replay", "input": "more"})
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "tokens"
        assert "tokens_per_minute" in refused.json()["error"]["message"]
        assert int(refused.headers["retry-after"]) > 10  # hundreds of tokens of debt at 5 a second


def test_every_answer_carries_rate_headers_and_only_writes_count(replica_urls):
    tenant_scenarios.every_answer_carries_rate_headers_and_only_writes_count(replica_urls, KEYS["metered"], requests_per_minute=3)


def test_a_tenant_without_rate_limits_gets_no_rate_headers(replica_urls):
    for tenant in ("free", "busy"):  # no limits; only concurrency limits
        with httpx.Client(timeout=60, headers=bearer(KEYS[tenant])) as http:
            made = http.post(f"{replica_urls[0]}/responses", json={"model": "gpt-oss-replay", "input": "x"})
            read = http.get(f"{replica_urls[1]}/responses/{made.json()['id']}")
        for answer in (made, read):
            assert answer.status_code == 200
            assert not [h for h in answer.headers if h.startswith("x-ratelimit")]


def test_a_websocket_create_counts_and_is_refused_with_an_error_event(replica_urls, metrics):
    with socket_scenarios.socket(replica_urls[0], bearer(KEYS["socket"])) as connection:
        socket_scenarios.create(connection, model="gpt-oss-replay", input="first")
        assert socket_scenarios.until_end(connection)[-1]["type"] == "response.completed"
        socket_scenarios.create(connection, model="gpt-oss-replay", input="second")
        (error,) = socket_scenarios.until_end(connection)
        assert error["status"] == 429
        assert error["error"]["code"] == "rate_limit_exceeded"
        assert "requests_per_minute" in error["error"]["message"]
    assert ("socket", 429, "requests_per_minute") in metrics.seen


@pytest.mark.slow
def test_tokens_per_minute_counts_exactly_the_usage_of_every_generation():
    """The tokens bucket is charged what `usage.total_tokens` reports, input and output, for a
    plain response and for one whose MCP listing (made before the first generation, which it
    changes) and tool call add a second prompt. The store's clock stands still, so nothing
    refills: each admission's remaining tokens are the limit minus every token charged before."""
    from serve_app.config import ToolsConfig
    from tests.server.test_tool_loop import CALL_ECHO, LOOPBACK
    from tests.support.mcp_servers import mcp_servers, mcp_tool

    limit = 10_000_000
    auth = AuthConfig.model_validate({"keys": [{"tenant": "metered", "key_env": "METERED", "limits": {"tokens_per_minute": limit}}]})
    key = "sk-metered-0123456789abcdef"
    app = create_app(
        [ServedModel("gpt-oss-replay", ReplayBackend())],
        ServerSettings(auth=auth, tools=ToolsConfig.model_validate({"mcp": {"allowed_urls": LOOPBACK}})),
        store=MemoryStore(clock=lambda: 1000.0),
        environ={"METERED": key},
    )
    with mcp_servers() as servers, uvicorn_server(app) as base, httpx.Client(timeout=60, headers=bearer(key)) as http:
        bodies = [
            {"model": "gpt-oss-replay", "input": "count my prompt " * 50},
            {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [mcp_tool(servers.streamable, require_approval="never")]},
            {"model": "gpt-oss-replay", "input": CALL_ECHO, "tools": [mcp_tool(servers.sse, require_approval="never")], "stream": True},
            {"model": "gpt-oss-replay", "input": "last"},
        ]
        charged = 0
        for body in bodies:
            answer = http.post(f"{base}/responses", json=body)
            assert answer.status_code == 200, answer.text
            assert int(answer.headers["x-ratelimit-remaining-tokens"]) == limit - charged, body
            final = parse_sse(answer.content)[-1]["response"] if body.get("stream") else answer.json()
            usage = final["usage"]
            assert usage["input_tokens"] > 0
            assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
            if body.get("tools"):  # the listing went into the first prompt, and the call's output into a second
                assert [item["type"] for item in final["output"]][:3] == ["mcp_list_tools", "reasoning", "mcp_call"]
            charged += usage["total_tokens"]


class TakeFails(MemoryStore):
    """A store whose token buckets fail while `down` (everything else answers)."""

    down = False

    async def take(self, key, **bucket):
        if self.down:
            raise ConnectionError("the store is down")
        return await super().take(key, **bucket)


def test_a_read_is_answered_without_rate_headers_when_the_store_cannot_count():
    auth = AuthConfig.model_validate({"keys": [{"tenant": "metered", "key_env": "METERED", "limits": {"requests_per_minute": 60}}]})
    store = TakeFails()
    app = create_app(
        [ServedModel("gpt-oss-replay", ReplayBackend())], ServerSettings(auth=auth), store=store, environ={"METERED": KEYS["metered"]}
    )
    with uvicorn_server(app) as base, httpx.Client(timeout=60, headers=bearer(KEYS["metered"])) as http:
        assert http.get(f"{base}/models").headers["x-ratelimit-limit-requests"] == "60"
        store.down = True
        models = http.get(f"{base}/models")
        assert models.status_code == 200
        assert not [h for h in models.headers if h.startswith("x-ratelimit")]
        refused = http.post(f"{base}/responses", json={"model": "gpt-oss-replay", "input": "x"})  # the limits are not skipped
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "store_unavailable"


# -- the routes that write or compute count a request ---------------------------------------------

COUNTED_KEYS = {name: f"sk-{name}-0123456789abcdef" for name in ("writer", "counter", "bystander", "free", "tokencounter")}
COUNTED_AUTH = AuthConfig.model_validate(
    {
        "keys": [
            {"tenant": "writer", "key_env": "WRITER", "limits": {"requests_per_minute": 2}},
            {"tenant": "counter", "key_env": "COUNTER", "limits": {"requests_per_minute": 2, "tokens_per_minute": 1_000_000}},
            {"tenant": "bystander", "key_env": "BYSTANDER", "limits": {"requests_per_minute": 2}},
            {"tenant": "tokencounter", "key_env": "TOKENCOUNTER", "limits": {"tokens_per_minute": 1000}},
            {"tenant": "free", "key_env": "FREE"},
        ]
    }
)
BIG_MESSAGE = "x" * 400_000


@pytest.fixture(scope="module")
def still_urls(metrics):
    """Two apps (replicas) on one store whose clock stands still: no bucket refills, so every
    take shows exactly."""
    store = MemoryStore(clock=lambda: 1000.0)
    environ = {name.upper(): key for name, key in COUNTED_KEYS.items()}
    apps = [
        create_app(
            [ServedModel("gpt-oss-replay", ReplayBackend())],
            ServerSettings(auth=COUNTED_AUTH),
            store=store,
            environ=environ,
            metrics=metrics,
        )
        for _ in range(2)
    ]
    with uvicorn_server(apps[0]) as first, uvicorn_server(apps[1]) as second:
        yield [first, second]


def assert_refused(answer: httpx.Response, limit: int) -> None:
    assert answer.status_code == 429, answer.text[:300]
    assert answer.json()["error"]["code"] == "rate_limit_exceeded"
    assert "requests_per_minute" in answer.json()["error"]["message"]
    assert int(answer.headers["retry-after"]) >= 1
    assert answer.headers["x-ratelimit-limit-requests"] == str(limit)
    assert answer.headers["x-ratelimit-remaining-requests"] == "0"


def test_conversation_writes_count_and_are_refused_past_the_limit(still_urls, metrics):
    """Two requests a minute: a conversation and a response use them up; the next response, 20
    conversations of 400 KB each, items added and metadata updated are all 429s, on either
    replica. Reading and deleting the conversation are still answered."""
    with httpx.Client(timeout=60, headers=bearer(COUNTED_KEYS["writer"])) as http:
        made = http.post(f"{still_urls[0]}/conversations", json={"items": [{"role": "user", "content": "hi"}]})
        assert made.status_code == 200
        assert made.headers["x-ratelimit-remaining-requests"] == "1"  # its own take
        conversation = made.json()["id"]
        answered = http.post(f"{still_urls[1]}/responses", json={"model": "gpt-oss-replay", "input": "x", "conversation": conversation})
        assert answered.status_code == 200
        assert answered.headers["x-ratelimit-remaining-requests"] == "0"
        assert_refused(http.post(f"{still_urls[0]}/responses", json={"model": "gpt-oss-replay", "input": "x"}), limit=2)
        before = http.get(f"{still_urls[0]}/conversations/{conversation}/items").json()["data"]
        for index in range(20):
            big = {"items": [{"role": "user", "content": BIG_MESSAGE}]}
            assert_refused(http.post(f"{still_urls[index % 2]}/conversations", json=big), limit=2)
        assert_refused(
            http.post(f"{still_urls[1]}/conversations/{conversation}/items", json={"items": [{"role": "user", "content": "more"}]}), 2
        )
        assert_refused(http.post(f"{still_urls[0]}/conversations/{conversation}", json={"metadata": {"topic": "quotas"}}), limit=2)
        items = http.get(f"{still_urls[1]}/conversations/{conversation}/items")
        assert items.status_code == 200
        assert items.json()["data"] == before  # nothing added
        assert http.get(f"{still_urls[0]}/conversations/{conversation}").status_code == 200
        assert http.delete(f"{still_urls[1]}/conversations/{conversation}").status_code == 200
    assert ("writer", 429, "requests_per_minute") in metrics.seen


def test_input_tokens_counts_and_is_refused_past_the_limit(still_urls):
    """Counting input tokens renders the input: each call takes a request (its answer carries
    the headers of its own take, and the tokens bucket's) and is charged the tokens it counted,
    as a response's prompt is; the third is a 429, and so is a response after it."""
    body = {"model": "gpt-oss-replay", "input": "how many tokens " * 1000}
    with httpx.Client(timeout=60, headers=bearer(COUNTED_KEYS["counter"])) as http:
        for index, remaining in enumerate(("1", "0")):
            counted = http.post(f"{still_urls[index]}/responses/input_tokens", json=body)
            assert counted.status_code == 200
            assert counted.json()["input_tokens"] > 1000
            assert counted.headers["x-ratelimit-remaining-requests"] == remaining
        for url in still_urls:
            refused = http.post(f"{url}/responses/input_tokens", json=body)
            assert_refused(refused, limit=2)
            assert refused.headers["x-ratelimit-limit-tokens"] == "1000000"
        assert_refused(http.post(f"{still_urls[0]}/responses", json={"model": "gpt-oss-replay", "input": "x"}), limit=2)


def test_input_tokens_are_charged_to_tokens_per_minute(still_urls, metrics):
    """A token count is charged the tokens it counted, as a response's prompt is: a tenant of
    1,000 tokens a minute counts a prompt of more than 1,000 once; then it owes them, and its
    next count and its next response are 429s `tokens_per_minute`, on either replica, before
    their bodies are read (1,786 pathological token counts in 30 s cost nothing but requests
    before)."""
    body = {"model": "gpt-oss-replay", "input": "how many tokens " * 1000}
    with httpx.Client(timeout=60, headers=bearer(COUNTED_KEYS["tokencounter"])) as http:
        counted = http.post(f"{still_urls[0]}/responses/input_tokens", json=body)
        assert counted.status_code == 200
        assert counted.json()["input_tokens"] > 1000
        for answer in (
            http.post(f"{still_urls[1]}/responses/input_tokens", json=body),
            http.post(f"{still_urls[0]}/responses/input_tokens", json={"model": "gpt-oss-replay", "input": "hi"}),
            http.post(f"{still_urls[1]}/responses", json={"model": "gpt-oss-replay", "input": "hi"}),
        ):
            assert answer.status_code == 429, answer.text[:300]
            assert "tokens_per_minute" in answer.json()["error"]["message"]
            assert answer.headers["x-ratelimit-remaining-tokens"] == "0"
            assert int(answer.headers["retry-after"]) >= 1
    assert ("tokencounter", 429, "tokens_per_minute") in metrics.seen


def test_a_tenant_past_its_limit_takes_nothing_from_another(still_urls):
    """`writer` (above) has no requests left; `bystander` has its own two, which its own
    writes take, then it is refused too. A tenant without limits counts nothing and gets no
    headers."""
    with httpx.Client(timeout=60, headers=bearer(COUNTED_KEYS["writer"])) as writer:
        assert_refused(writer.post(f"{still_urls[0]}/conversations", json={}), limit=2)
    with httpx.Client(timeout=60, headers=bearer(COUNTED_KEYS["bystander"])) as http:
        made = http.post(f"{still_urls[1]}/conversations", json={"items": [{"role": "user", "content": BIG_MESSAGE}]})
        assert made.status_code == 200
        assert made.headers["x-ratelimit-remaining-requests"] == "1"
        counted = http.post(f"{still_urls[0]}/responses/input_tokens", json={"model": "gpt-oss-replay", "input": "hi"})
        assert counted.status_code == 200
        assert counted.headers["x-ratelimit-remaining-requests"] == "0"
        assert_refused(http.post(f"{still_urls[1]}/conversations", json={}), limit=2)
    with httpx.Client(timeout=60, headers=bearer(COUNTED_KEYS["free"])) as http:
        for index in range(5):
            free = http.post(f"{still_urls[index % 2]}/conversations", json={"items": [{"role": "user", "content": "hi"}]})
            assert free.status_code == 200
            assert not [h for h in free.headers if h.startswith("x-ratelimit")]


class CountsTakes(MemoryStore):
    """A store that counts its token-bucket calls (takes and reads)."""

    takes = 0

    async def take(self, key, **bucket):
        self.takes += 1
        return await super().take(key, **bucket)


def test_a_counted_route_answers_with_its_own_take_and_reads_nothing_more():
    """A counted write makes one bucket call, its take, whose headers its answer carries (a
    second read could see another request's take); a read makes one, the read."""
    auth = AuthConfig.model_validate({"keys": [{"tenant": "writer", "key_env": "WRITER", "limits": {"requests_per_minute": 60}}]})
    store = CountsTakes(clock=lambda: 1000.0)
    app = create_app(
        [ServedModel("gpt-oss-replay", ReplayBackend())], ServerSettings(auth=auth), store=store, environ={"WRITER": COUNTED_KEYS["writer"]}
    )
    with uvicorn_server(app) as base, httpx.Client(timeout=60, headers=bearer(COUNTED_KEYS["writer"])) as http:
        for call, remaining in (
            (lambda: http.post(f"{base}/conversations", json={}), "59"),
            (lambda: http.get(f"{base}/models"), "59"),
            (lambda: http.post(f"{base}/responses/input_tokens", json={"model": "gpt-oss-replay", "input": "hi"}), "58"),
        ):
            before = store.takes
            answer = call()
            assert answer.status_code == 200
            assert answer.headers["x-ratelimit-remaining-requests"] == remaining
            assert store.takes - before == 1

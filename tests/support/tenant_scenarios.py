"""Authentication and tenancy from the client side, shared by the in-process suite
(tests/server/test_auth.py) and the Ray Serve one (tests/deployments/test_tenants_e2e.py): the same
assertions whichever stack serves the app, under whatever route prefix `base_url` has."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from tests.support import socket_scenarios

MODEL = "gpt-oss-replay"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def unauthenticated_everywhere(base_url: str, key: str, paths: list[str]) -> None:
    """No key, a wrong key, a malformed header: 401 with `invalid_api_key` on every path and
    method (paths relative to `base_url`'s origin, prefix included); the health route is open."""
    origin = re.match(r"https?://[^/]+", base_url)
    assert origin is not None
    wrong_headers: list[dict[str, str]] = [
        {},
        bearer("sk-" + "0" * 40),
        bearer(key[:-1]),
        bearer(key + "x"),
        {"Authorization": key},  # no scheme
        {"Authorization": f"Basic {key}"},
        {"Authorization": "Bearer " + "k" * 100_000},  # far over any key: refused before any work
    ]
    with httpx.Client(timeout=30) as http:
        for path in paths:
            for method in ("GET", "POST", "DELETE", "HEAD", "OPTIONS", "PUT", "PATCH"):
                for headers in wrong_headers:
                    answer = http.request(method, origin.group(0) + path, headers=headers, json={} if method == "POST" else None)
                    huge = len(headers.get("Authorization", "")) > 8192  # a proxy in front may refuse it first (400, 431)
                    assert answer.status_code in ((400, 401, 431) if huge else (401,)), (
                        method,
                        path,
                        answer.status_code,
                        answer.text[:200],
                    )
                    if answer.status_code == 401 and method != "HEAD":
                        assert answer.json()["error"]["code"] == "invalid_api_key"
                        assert key not in answer.text
        health = http.get(base_url.removesuffix("/v1") + "/health")
        assert health.status_code == 200, health.text
        assert http.get(f"{base_url}/models", headers=bearer(key)).status_code == 200
    for headers in (None, bearer("sk-" + "1" * 40)):
        with pytest.raises(InvalidStatus) as refused, socket_scenarios.socket(base_url, headers):
            pass
        assert refused.value.response.status_code == 401


def _answer(http: httpx.Client, method: str, url: str, body: Any) -> tuple[int, dict]:
    answer = http.request(method, url, json=body)
    return answer.status_code, answer.json()


def _same_as_missing(http: httpx.Client, base_url: str, method: str, path: str, foreign: dict[str, str], body: Any = None) -> None:
    """`method path` with another tenant's ids answers exactly as with ids that exist nowhere."""
    missing = {name: value[:-6] + "zzzzzz" for name, value in foreign.items()}

    def fill(text: str, ids: dict[str, str]) -> str:
        for name, value in ids.items():
            text = text.replace("{" + name + "}", value)
        return text

    def filled_body(ids: dict[str, str]) -> Any:
        return None if body is None else json.loads(fill(json.dumps(body), ids))

    theirs = _answer(http, method, base_url + fill(path, foreign), filled_body(foreign))
    nowhere = _answer(http, method, base_url + fill(path, missing), filled_body(missing))
    assert theirs[0] in (400, 404), (method, path, theirs)
    unmasked = json.dumps(nowhere[1])
    for name, value in missing.items():
        unmasked = unmasked.replace(value, foreign[name])
    assert (theirs[0], theirs[1]) == (nowhere[0], json.loads(unmasked)), (method, path, theirs, nowhere)


def tenants_cannot_see_each_other(base_url: str, key_a: str, key_b: str, background_model: str = MODEL) -> None:
    """Tenant A's responses, background runs and conversations: tenant B gets what a missing id
    gets for each (never a 403), over HTTP and a WebSocket; A's objects are untouched."""
    with httpx.Client(timeout=60, headers=bearer(key_a)) as a:
        first = a.post(f"{base_url}/responses", json={"model": MODEL, "input": "a secret of A"}).json()
        second = a.post(f"{base_url}/responses", json={"model": MODEL, "input": "more", "previous_response_id": first["id"]}).json()
        background = a.post(f"{base_url}/responses", json={"model": background_model, "input": "in the background", "background": True})
        assert background.status_code == 200, background.text
        conversation = a.post(f"{base_url}/conversations", json={"items": [{"role": "user", "content": "A's conversation"}]}).json()
        item = a.get(f"{base_url}/conversations/{conversation['id']}/items").json()["data"][0]
        a_views = {
            path: a.get(f"{base_url}{path}").json()
            for path in (
                f"/responses/{first['id']}",
                f"/responses/{first['id']}/input_items",
                f"/responses/{second['id']}/input_items",
                f"/conversations/{conversation['id']}",
                f"/conversations/{conversation['id']}/items",
            )
        }
    ids = {"resp": first["id"], "bg": background.json()["id"], "conv": conversation["id"], "item": item["id"]}
    with httpx.Client(timeout=60, headers=bearer(key_b)) as b:
        for method, path, body in [
            ("GET", "/responses/{resp}", None),
            ("GET", "/responses/{bg}", None),
            ("GET", "/responses/{bg}?stream=true", None),
            ("GET", "/responses/{bg}?stream=true&starting_after=0", None),
            ("GET", "/responses/{resp}/input_items", None),
            ("POST", "/responses/{bg}/cancel", None),
            ("DELETE", "/responses/{resp}", None),
            ("DELETE", "/responses/{bg}", None),
            ("POST", "/responses", {"model": MODEL, "input": "continue A", "previous_response_id": "{resp}"}),
            ("POST", "/responses", {"model": MODEL, "input": "continue A", "previous_response_id": "{resp}", "stream": True}),
            ("POST", "/responses", {"model": MODEL, "input": "join A", "conversation": "{conv}"}),
            ("POST", "/responses/input_tokens", {"model": MODEL, "input": "x", "previous_response_id": "{resp}"}),
            ("POST", "/responses/input_tokens", {"model": MODEL, "input": "x", "conversation": "{conv}"}),
            ("GET", "/conversations/{conv}", None),
            ("POST", "/conversations/{conv}", {"metadata": {"owner": "B"}}),
            ("DELETE", "/conversations/{conv}", None),
            ("GET", "/conversations/{conv}/items", None),
            ("POST", "/conversations/{conv}/items", {"items": [{"role": "user", "content": "B was here"}]}),
            ("GET", "/conversations/{conv}/items/{item}", None),
            ("DELETE", "/conversations/{conv}/items/{item}", None),
        ]:
            _same_as_missing(b, base_url, method, path, ids, body)
    with socket_scenarios.socket(base_url, bearer(key_b)) as connection:  # a WebSocket continuation
        socket_scenarios.create(connection, model=MODEL, input="continue A", previous_response_id=first["id"])
        (error,) = socket_scenarios.until_end(connection)
        assert error["type"] == "error"
        assert error["error"]["code"] == "previous_response_not_found"
    with httpx.Client(timeout=60, headers=bearer(key_a)) as a:  # A's objects: all there, unchanged
        for path, view in a_views.items():
            assert a.get(f"{base_url}{path}").json() == view, path
        assert a.get(f"{base_url}/responses/{ids['bg']}").status_code == 200
        follow_up = a.post(f"{base_url}/responses", json={"model": MODEL, "input": "on", "previous_response_id": second["id"]})
        assert follow_up.status_code == 200
        assert follow_up.json()["status"] == "completed"


# -- quotas --------------------------------------------------------------------------------------


def burst_within_requests_per_minute(urls: list[str], key: str, per_minute: int) -> None:
    """A concurrent burst of twice the limit, spread over `urls` (the ingress replicas): the
    limit is admitted plus at most what refills while the burst lasts; every answer carries
    OpenAI's rate-limit headers, every refusal is a 429 naming the limit with Retry-After."""
    import concurrent.futures
    import time

    body = {"model": MODEL, "input": "burst"}

    def post(index: int) -> httpx.Response:
        with httpx.Client(timeout=60, headers=bearer(key)) as http:
            return http.post(f"{urls[index % len(urls)]}/responses", json=body)

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(post, range(2 * per_minute)))
    lasted_s = time.monotonic() - started
    admitted = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code != 200]
    by_url = [sum(a.status_code == 200 for a in answers[i :: len(urls)]) for i in range(len(urls))]
    assert all(by_url), f"admitted per replica: {by_url}"  # each counted against the one limit
    refills = per_minute * lasted_s / 60
    assert per_minute <= len(admitted) <= per_minute + int(refills) + 1, (len(admitted), lasted_s)
    for answer in answers:
        assert answer.headers["x-ratelimit-limit-requests"] == str(per_minute)
        assert int(answer.headers["x-ratelimit-remaining-requests"]) >= 0
        assert answer.headers["x-ratelimit-reset-requests"].endswith("s")
    for answer in refused:
        assert answer.status_code == 429, answer.text
        error = answer.json()["error"]
        assert error["code"] == "rate_limit_exceeded"
        assert "requests_per_minute" in error["message"]
        assert 1 <= int(answer.headers["retry-after"]) <= 60 / per_minute + 1
        assert answer.headers["x-ratelimit-remaining-requests"] == "0"


def the_sdk_retries_after_a_429(base_url: str, key: str) -> None:
    """With the tenant's requests used up, the official SDK's own retry waits as told and succeeds."""
    import openai

    sdk = openai.OpenAI(base_url=base_url, api_key=key, max_retries=4, timeout=60)
    raw = sdk.responses.with_raw_response.create(model=MODEL, input="after the limit")
    assert raw.retries_taken >= 1
    assert raw.http_response.status_code == 200
    assert "x-ratelimit-remaining-requests" in raw.headers
    assert raw.parse().status == "completed"
    with pytest.raises(openai.RateLimitError) as refused:  # no retries: the 429 itself
        openai.OpenAI(base_url=base_url, api_key=key, max_retries=0).responses.create(model=MODEL, input="again")
    assert refused.value.code == "rate_limit_exceeded"
    assert refused.value.response.headers["retry-after"]


def max_concurrent_requests_refuses_the_next(base_url: str, key: str, slow_model: str, limit: int) -> None:
    """`limit` open streams (on any replica): the next request, of any kind, is a 429 until one ends."""
    import contextlib

    readers = []  # each stream's reader kept: a reader dropped closes its stream
    with contextlib.ExitStack() as streams:
        for index in range(limit):
            http = streams.enter_context(httpx.Client(timeout=120, headers=bearer(key)))
            stream = streams.enter_context(
                http.stream("POST", f"{base_url}/responses", json={"model": slow_model, "input": f"hold {index} " * 300, "stream": True})
            )
            assert stream.status_code == 200
            readers.append(stream.iter_raw())
            next(readers[-1])  # it is running
        with httpx.Client(timeout=60, headers=bearer(key)) as http:
            for body in ({"model": MODEL, "input": "one more"}, {"model": MODEL, "input": "one more", "stream": True}):
                refused = http.post(f"{base_url}/responses", json=body)
                assert refused.status_code == 429, refused.text[:300]
                assert "max_concurrent_requests" in refused.json()["error"]["message"], refused.text[:300]
                assert refused.headers["retry-after"] == "1"
    with httpx.Client(timeout=60, headers=bearer(key)) as http:  # the streams ended: their places are free
        assert _eventually_admitted(http, f"{base_url}/responses", {"model": MODEL, "input": "now"})


def max_background_refuses_the_next(base_url: str, key: str, slow_model: str, limit: int) -> None:
    """`limit` background responses running: the next one is a 429 until one is cancelled."""
    body = {"model": slow_model, "input": "long " * 600, "background": True}
    with httpx.Client(timeout=60, headers=bearer(key)) as http:
        running = [http.post(f"{base_url}/responses", json=body) for _ in range(limit)]
        assert all(r.status_code == 200 for r in running), [r.text for r in running]
        refused = http.post(f"{base_url}/responses", json=body)
        assert refused.status_code == 429
        assert "max_background" in refused.json()["error"]["message"]
        assert http.post(f"{base_url}/responses", json={"model": MODEL, "input": "in the foreground"}).status_code == 200
        for answer in running:
            assert http.post(f"{base_url}/responses/{answer.json()['id']}/cancel").json()["status"] == "cancelled"
        again = _eventually_admitted(http, f"{base_url}/responses", body)
        http.post(f"{base_url}/responses/{again.json()['id']}/cancel")


def followers_hold_concurrent_places(run_url: str, follow_url: str, single_key: str, pair_key: str, slow_model: str) -> None:
    """A follower of a background response (`GET /responses/{id}?stream=true`) holds a place
    among its tenant's `max_concurrent_requests`, as a stream does, until it leaves. The run is
    started at `run_url` and followed at `follow_url` (another replica). A tenant limited to 1,
    its background response running: its follower is a 429. A tenant limited to 2, its run and
    one follower: a second follower and a new response are 429s; the first follower leaves:
    the second is admitted."""
    body = {"model": slow_model, "input": "long " * 600, "background": True}
    with httpx.Client(timeout=60, headers=bearer(single_key)) as http:
        run = http.post(f"{run_url}/responses", json=body)
        assert run.status_code == 200, run.text
        refused = http.get(f"{follow_url}/responses/{run.json()['id']}", params={"stream": "true"})
        assert refused.status_code == 429, refused.text[:300]
        assert "max_concurrent_requests" in refused.json()["error"]["message"]
        assert refused.headers["retry-after"] == "1"
        assert http.post(f"{run_url}/responses/{run.json()['id']}/cancel").json()["status"] == "cancelled"
    with httpx.Client(timeout=60, headers=bearer(pair_key)) as http:
        run = http.post(f"{run_url}/responses", json=body)
        assert run.status_code == 200, run.text
        url = f"{follow_url}/responses/{run.json()['id']}"
        with (
            httpx.Client(timeout=60, headers=bearer(pair_key)) as first_client,
            first_client.stream("GET", url, params={"stream": "true"}) as first,
        ):
            assert first.status_code == 200
            reader = first.iter_raw()  # kept: a reader dropped closes its stream
            assert b"response.created" in next(reader)  # following
            second = http.get(url, params={"stream": "true"})
            assert second.status_code == 429, second.text[:300]
            assert "max_concurrent_requests" in second.json()["error"]["message"]
            more = http.post(f"{follow_url}/responses", json={"model": MODEL, "input": "one more"})
            assert more.status_code == 429, more.text[:300]
        # The first follower left: its place is free (a moment after its connection closed).
        import time

        deadline = time.monotonic() + 10
        while True:
            with http.stream("GET", url, params={"stream": "true"}) as second:
                if second.status_code != 429 or time.monotonic() > deadline:
                    assert second.status_code == 200
                    break
            time.sleep(0.1)
        assert http.post(f"{run_url}/responses/{run.json()['id']}/cancel").json()["status"] == "cancelled"


def _eventually_admitted(http: httpx.Client, url: str, body: dict) -> httpx.Response:
    """Released places are freed as the ending request's last step (a moment after its client saw the end)."""
    import time

    deadline = time.monotonic() + 10
    while True:
        answer = http.post(url, json=body)
        if answer.status_code != 429 or time.monotonic() > deadline:
            assert answer.status_code == 200, answer.text
            return answer
        time.sleep(0.1)


def every_answer_carries_rate_headers_and_only_writes_count(urls: list[str], key: str, requests_per_minute: int) -> None:
    """A tenant with rate limits (one request refills in 20 s or more), on each of `urls` (the
    ingress replicas) in turn: every answer of every route carries OpenAI's `x-ratelimit-*`
    headers. Reads, deletes and cancels (models, responses, input items, conversations and
    their items, a 404, /openapi.json) take no request: the remaining requests only grow
    (refills). Every write takes one (`POST /responses`, conversation create, update and items
    create, `input_tokens`): the scenario lasts under 20 s, so no more than the limit of them
    are admitted, and each write route is then refused with a 429. Health and readiness carry
    no headers."""
    import time

    assert 60 / requests_per_minute >= 20
    started = time.monotonic()
    with httpx.Client(timeout=60, headers=bearer(key)) as http:

        def call(index: int, method: str, path: str, body: Any = None) -> httpx.Response:
            url = urls[index % len(urls)]
            answer = http.request(method, url.removesuffix("/v1") + path if path == "/openapi.json" else url + path, json=body)
            assert answer.status_code < 500, (method, path, answer.status_code, answer.text[:300])
            assert answer.headers.get("x-ratelimit-limit-requests") == str(requests_per_minute), (method, path, dict(answer.headers))
            assert answer.headers["x-ratelimit-reset-requests"].endswith("s")
            assert "x-ratelimit-limit-tokens" in answer.headers
            return answer

        made = call(0, "POST", "/responses", {"model": MODEL, "input": "counted"})
        conversation = call(1, "POST", "/conversations", {"items": [{"role": "user", "content": "hi"}]})
        assert made.status_code == conversation.status_code == 200, (made.text, conversation.text)
        response_id, conversation_id = made.json()["id"], conversation.json()["id"]
        reads: list[tuple[str, str, Any]] = [
            ("GET", "/models", None),
            ("GET", f"/models/{MODEL}", None),
            ("GET", f"/responses/{response_id}", None),
            ("GET", f"/responses/{response_id}/input_items", None),
            ("POST", f"/responses/{response_id}/cancel", None),  # not a background response: a 400
            ("GET", f"/conversations/{conversation_id}", None),
            ("GET", f"/conversations/{conversation_id}/items", None),
            ("GET", "/responses/resp_nowhere", None),  # a 404
            ("GET", "/openapi.json", None),
        ]
        seen = [int(conversation.headers["x-ratelimit-remaining-requests"])]
        for index, (method, path, body) in enumerate(reads):
            seen.append(int(call(index, method, path, body).headers["x-ratelimit-remaining-requests"]))
        writes: list[tuple[str, str, Any]] = [
            ("POST", "/conversations", {"items": [{"role": "user", "content": "another"}]}),
            ("POST", f"/conversations/{conversation_id}/items", {"items": [{"role": "user", "content": "more"}]}),
            ("POST", f"/conversations/{conversation_id}", {"metadata": {"topic": "quotas"}}),
            ("POST", "/responses/input_tokens", {"model": MODEL, "input": "how many"}),
            ("POST", "/responses", {"model": MODEL, "input": "counted too"}),
        ]
        admitted, refused = 2, set()
        for index, (method, path, body) in enumerate(writes * 2):  # each route twice: the limit is reached on the way
            answer = call(index, method, path, body)
            if answer.status_code == 429:
                assert answer.json()["error"]["code"] == "rate_limit_exceeded"
                assert int(answer.headers["retry-after"]) >= 1
                assert answer.headers["x-ratelimit-remaining-requests"] == "0"
                refused.add(path)
            else:
                assert answer.status_code == 200, (path, answer.text[:300])
                admitted += 1
        for index, path in enumerate(
            (f"/conversations/{conversation_id}/items", f"/responses/{response_id}", f"/conversations/{conversation_id}")
        ):
            method = "GET" if index == 0 else "DELETE"
            assert call(index, method, path).status_code == 200, path  # reads and deletes are still answered
        for path in ("/health", "/ready"):
            assert not [h for h in http.get(urls[0].removesuffix("/v1") + path).headers if h.startswith("x-ratelimit")], path
    assert time.monotonic() - started < 60 / requests_per_minute  # at most one request refilled meanwhile
    assert seen == sorted(seen), seen
    assert seen[-1] - seen[0] <= 1, seen  # reads took none
    assert admitted <= requests_per_minute, admitted  # under 20 s: `limit × (1 + t/60)` admitted at most
    assert refused == {path for _, path, _ in writes}, refused


def cached_prefixes_are_each_tenants_own(urls: list[str], key_a: str, key_b: str) -> None:
    """A long prompt new to the engines is a prefix-cache hit for the tenant that sent it,
    through any of `urls` (the ingress replicas), and no hit for another tenant, who finds
    only what its own requests left (the prompt's fixed start), as the sender did the first
    time (each engine request carries its tenant's `cache_salt`)."""
    import secrets

    nonce = secrets.token_hex(8)

    def cached(url: str, key: str, text: str) -> int:
        with httpx.Client(timeout=60, headers=bearer(key)) as http:
            answer = http.post(f"{url}/responses", json={"model": MODEL, "input": text})
        assert answer.status_code == 200, answer.text
        return answer.json()["usage"]["input_tokens_details"]["cached_tokens"]

    for key in (key_a, key_b):  # each tenant's cache holds the fixed start of every prompt
        cached(urls[0], key, f"{nonce} warm up {key[-6:]}")
    text = f"{nonce} a long shared system prompt " * 40
    a_first = cached(urls[0], key_a, text)
    b_first = cached(urls[0], key_b, text)
    assert b_first == a_first, (a_first, b_first)  # A's prompt is no hit for B
    a_again, b_again = cached(urls[-1], key_a, text), cached(urls[-1], key_b, text)
    assert a_again > a_first + 200, (a_first, a_again, b_again)
    assert b_again > b_first + 200, (a_first, a_again, b_again)  # each its own, from either replica

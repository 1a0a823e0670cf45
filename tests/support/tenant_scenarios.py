"""Authentication and tenancy from the client side, shared by the in-process suite
(tests/server/test_auth.py) and the Ray Serve one (tests/serve/test_tenants_e2e.py): the same
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
                    assert answer.status_code in (401, 431), (method, path, answer.status_code, answer.text[:200])
                    if answer.status_code == 401 and method != "HEAD":
                        assert answer.json()["error"]["code"] == "invalid_api_key"
                        assert key not in answer.text
        health = http.get(base_url.removesuffix("/v1") + "/health")
        assert health.status_code == 200, health.text
        assert http.get(f"{base_url}/models", headers=bearer(key)).status_code == 200
    for headers in (None, bearer("sk-" + "1" * 40)):
        with pytest.raises(InvalidStatus) as refused:
            with socket_scenarios.socket(base_url, headers):
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
        assert error["type"] == "error" and error["error"]["code"] == "previous_response_not_found"
    with httpx.Client(timeout=60, headers=bearer(key_a)) as a:  # A's objects: all there, unchanged
        for path, view in a_views.items():
            assert a.get(f"{base_url}{path}").json() == view, path
        assert a.get(f"{base_url}/responses/{ids['bg']}").status_code == 200
        follow_up = a.post(f"{base_url}/responses", json={"model": MODEL, "input": "on", "previous_response_id": second["id"]})
        assert follow_up.status_code == 200 and follow_up.json()["status"] == "completed"

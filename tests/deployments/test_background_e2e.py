"""Background responses and conversations through a real Serve cluster: 2 ingress replicas
behind Serve's HTTP proxy sharing the embedded store (tests/conftest.py `serve_url`), with
the official SDKs. Runs go on one replica while the calls about them land on either."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from tests.deployments.conftest import engine_stats
from tests.support import bg_scenarios

MODEL = "gpt-oss-replay"
SLOW = "gpt-oss-replay-slow"


def test_background_poll(serve_url):
    bg_scenarios.background_poll(serve_url, MODEL)


@pytest.mark.parametrize("stop", [bg_scenarios.background_cancel, bg_scenarios.background_delete_while_running])
def test_cancel_or_delete_while_running_aborts_the_engine_request(serve_url, stop):
    before = engine_stats(SLOW)["aborted"]
    stop(serve_url, SLOW)
    after = engine_stats(SLOW)
    assert after["aborted"] == before + 1
    assert after["running"] == 0


def test_background_stream_resumed_on_the_other_replica(serve_url):
    bg_scenarios.background_stream_resume(serve_url, SLOW, other_replica=True)


def test_background_followed_live_on_the_other_replica(serve_url):
    bg_scenarios.background_followed_live_on_the_other_replica(serve_url, SLOW)


def test_background_errors(serve_url):
    bg_scenarios.background_errors(serve_url, MODEL)


def test_conversations(serve_url):
    bg_scenarios.conversations_crud(serve_url)
    bg_scenarios.conversation_items(serve_url)
    bg_scenarios.responses_in_a_conversation(serve_url, MODEL)


def test_concurrent_turns_on_one_conversation(serve_url):
    bg_scenarios.concurrent_turns(serve_url, MODEL, turns=12)


def test_agents_sdk_conversations_session(serve_url):
    bg_scenarios.agents_session(serve_url, MODEL)


def _replica_pid(replica_id: str) -> int:
    """The header names the replica by Serve's id (opaque to clients); Ray's GCS knows its
    process (the state API would need the dashboard, which the session cluster does not run)."""
    import ray
    from ray._private import state

    actor = ray.get_actor(f"SERVE_REPLICA::responses#ResponsesIngress#{replica_id}", namespace="serve")
    return state.actors(actor._actor_id.hex())["Pid"]


def test_killed_replica_leaves_no_background_response_in_progress(serve_url):
    """SIGKILL the ingress replica running a background response: the run's lease runs out
    and the next reader, on any replica, ends it `failed`. Last in this file: Serve then
    restarts the replica, and the test waits until both serve again."""
    from ray import serve

    with httpx.Client(timeout=60) as http:
        body = {"model": SLOW, "input": bg_scenarios.LONG_TEXT * 3, "background": True}
        created = http.post(f"{serve_url}/responses", json=body)
        assert created.status_code == 200, created.text
        response_id = created.json()["id"]
        pid = _replica_pid(created.headers[bg_scenarios.REPLICA_HEADER])
        with http.stream("GET", f"{serve_url}/responses/{response_id}", params={"stream": "true"}) as stream:
            for line in stream.iter_lines():  # generation is under way
                if line == "event: response.output_text.delta":
                    break
        os.kill(pid, signal.SIGKILL)

        def ended():
            try:  # while Serve notices the dead replica, a request may fail: ask again
                response = http.get(f"{serve_url}/responses/{response_id}")
            except httpx.HTTPError:
                return None
            if response.status_code != 200:
                return None
            data = response.json()
            return data if data["status"] not in ("queued", "in_progress") else None

        final = bg_scenarios.wait_until(ended, "the orphaned response to end")
        assert final["status"] == "failed"
        assert final["error"]["code"] == "server_error"
        events = bg_scenarios.parse_sse(http.get(f"{serve_url}/responses/{response_id}", params={"stream": "true"}).content)
        assert events[-1]["type"] == "response.failed"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))

    def both_replicas_running():
        ingress = serve.status().applications["responses"].deployments["ResponsesIngress"]
        return ingress.status == "HEALTHY" and ingress.replica_states.get("RUNNING") == 2

    bg_scenarios.wait_until(both_replicas_running, "Serve to replace the killed replica")

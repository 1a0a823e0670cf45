"""The engines' request router (deployments/routing.py).

Conversation affinity: an engine request goes to the engine replica its conversation's key
prefers, while that replica is not much busier than the others, so its prefix cache holds
the conversation. Pure parts here; then through Serve (2 ingress replicas behind HAProxy, 3
engine replicas whose replay engines count cached prompt tokens as vLLM's prefix caching
would), with affinity and without.

Tiers: requests waiting for a full engine replica are placed `priority` before `flex`,
through Serve (an engine replica that takes one request at a time).
"""

from __future__ import annotations

import collections
import concurrent.futures
import inspect
import itertools
import threading
import time

import httpx
import openai
from hypothesis import given
from hypothesis import strategies as st
from ray.serve.request_router import FIFOMixin, RequestRouter

from deployments.routing import first_choice, preferred_replica, within_imbalance
from serve_app.api.request import ResponsesRequest
from serve_app.engines.replay import PrefixCache
from serve_app.runtime.run import affinity_key
from tests.support.servers import wait_until


@given(st.lists(st.text("abcdef", min_size=1, max_size=8), min_size=2, max_size=6, unique=True), st.text(max_size=20))
def test_a_key_keeps_its_replica_unless_that_one_goes(replicas, key):
    chosen = preferred_replica(key, replicas)
    assert chosen in replicas
    assert preferred_replica(key, list(reversed(replicas))) == chosen  # order does not matter
    assert preferred_replica(key, [*replicas, "new replica"]) in (chosen, "new replica")  # it stays or goes to the new one
    for gone in replicas:  # another replica leaving moves nobody
        if gone != chosen:
            assert preferred_replica(key, [replica for replica in replicas if replica != gone]) == chosen


def test_keys_spread_evenly_over_replicas():
    counts = collections.Counter(preferred_replica(f"conversation {i}", ["a", "b", "c", "d"]) for i in range(4000))
    assert set(counts) == {"a", "b", "c", "d"}
    assert all(800 < n < 1200 for n in counts.values())


def test_a_busy_preferred_replica_is_passed_over():
    assert within_imbalance(6, [2, 3], max_imbalance=4)
    assert not within_imbalance(7, [2, 9], max_imbalance=4)
    assert within_imbalance(0, [0], max_imbalance=0)
    assert within_imbalance(9, [], max_imbalance=0)  # nothing to compare with


def test_a_tool_loops_next_round_goes_back_to_its_replica_whatever_the_imbalance():
    loads = {"a": 9, "b": 0, "c": 0}
    choose = {"replica_ids": list(loads), "load": loads.__getitem__, "full": lambda replica: False, "max_imbalance": 4}
    key = next(key for key in (f"k{i}" for i in range(100)) if preferred_replica(key, list(loads)) == "a")
    assert first_choice(pinned=None, key=key, **choose) is None  # "a" is too busy for its conversation
    assert first_choice(pinned="a", key=key, **choose) == "a"  # but the round it generated comes back
    assert first_choice(pinned="gone", key=key, **choose) is None  # a replica that left: routed as any other
    assert first_choice(pinned=None, key=key, **{**choose, "load": {"a": 4, "b": 0, "c": 0}.__getitem__}) == "a"


def _request(**body) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", **body})


def test_the_affinity_key_is_what_every_turn_of_a_conversation_shares():
    first = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "plan a trip"}]
    later = [*first, {"role": "assistant", "content": "where to?"}, {"role": "user", "content": "Rome"}]
    keys = [affinity_key(request, request.input_items()) for request in (_request(input=first), _request(input=later))]
    assert keys[0] == keys[1]
    assert keys[0].startswith("user:")
    other = _request(input=[{"role": "user", "content": "plan a hike"}])
    assert affinity_key(other, other.input_items()) != keys[0]
    keyed = _request(input=later, prompt_cache_key="session-7")
    assert affinity_key(keyed, keyed.input_items()) == "key:session-7"
    in_conversation = _request(input="hi", conversation="conv_1")
    assert affinity_key(in_conversation, in_conversation.input_items()) == "conversation:conv_1"
    no_user = _request(input=[{"role": "developer", "content": "x"}])
    assert affinity_key(no_user, no_user.input_items()) is None


def test_the_replay_prefix_cache_counts_whole_blocks_of_a_prompt_seen_before():
    cache = PrefixCache(block_size=16, max_blocks=8)
    prompt = list(range(100))
    assert cache.cached_tokens(prompt) == 0
    assert cache.cached_tokens(prompt) == 96  # never the last token; whole blocks only
    assert cache.cached_tokens(prompt + [7] * 40) == 96
    assert cache.cached_tokens([1, *prompt]) == 0  # a prefix, not any shared run
    assert cache.cached_tokens(list(range(500, 700))) == 0  # 12 new blocks push the first ones out
    assert cache.cached_tokens(prompt) == 0


# -- through Serve --------------------------------------------------------------------------

CONVERSATIONS = 24


def _turns(serve_url: str, model: str) -> list[list[dict]]:
    """24 conversations of 3 turns (`previous_response_id` chains, interleaved): each turn's usage."""
    usages: list[list[dict]] = [[] for _ in range(CONVERSATIONS)]
    previous: list[str | None] = [None] * CONVERSATIONS
    with httpx.Client(base_url=serve_url, timeout=60) as http:
        for turn in range(3):
            for index in range(CONVERSATIONS):
                body = {
                    "model": model,
                    "input": f"conversation {index}, turn {turn}: " + "words " * 40,
                    "previous_response_id": previous[index],
                }
                response = http.post("/responses", json=body)
                assert response.status_code == 200, response.text
                previous[index] = response.json()["id"]
                usages[index].append(response.json()["usage"])
    return usages


def _follow_ups_on_their_replica(usages: list[list[dict]]) -> tuple[int, int]:
    """(follow-up turns that found the whole earlier prompt cached, all follow-up turns)."""
    hits = total = 0
    for turns in usages:
        for earlier, later in itertools.pairwise(turns):
            total += 1
            hits += later["input_tokens_details"]["cached_tokens"] >= earlier["input_tokens"] // 16 * 16
    return hits, total


def test_each_conversation_stays_on_its_engine_replica(serve_url):
    usages = _turns(serve_url, "gpt-oss-replay-affinity")
    assert _follow_ups_on_their_replica(usages) == (2 * CONVERSATIONS, 2 * CONVERSATIONS)
    # Every first turn but one per replica found the system message cached (the prompts all
    # start with it): the conversations went to more than one replica.
    replicas_used = sum(turns[0]["input_tokens_details"]["cached_tokens"] == 0 for turns in usages)
    assert replicas_used >= 2


def test_a_burst_of_one_conversation_spills_over_to_other_replicas(serve_url):
    """24 requests with one key at once: past `max_imbalance` (4) requests more than another
    replica, the conversation's replica is passed over. Only the first request of this
    prompt on a replica finds less than its whole prompt cached, so those count replicas."""
    body = {"model": "gpt-oss-replay-affinity", "input": "one hot prompt " + "x " * 60, "prompt_cache_key": "hot", "max_output_tokens": 64}

    def send(_: int) -> dict:
        response = httpx.post(f"{serve_url}/responses", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()["usage"]

    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        usages = list(pool.map(send, range(24)))
    whole = (usages[0]["input_tokens"] - 1) // 16 * 16  # all a replica that saw it can find
    assert sum(usage["input_tokens_details"]["cached_tokens"] < whole for usage in usages) >= 2


def test_without_affinity_follow_ups_land_anywhere(serve_url):
    hits, total = _follow_ups_on_their_replica(_turns(serve_url, "gpt-oss-replay-spread"))
    assert hits < total  # by chance all 48 would have found their replica with p = 3**-48


# -- tiers, through Serve --------------------------------------------------------------------


def test_serves_hook_for_the_request_a_replica_goes_to_is_still_there():
    """EngineRouter orders waiting requests by overriding the private method Serve's
    `FIFOMixin` overrides, with the helpers that mixin uses; a Ray upgrade that renames one
    would silently make the queue unordered again, or break routing."""
    assert "self._fulfill_next_pending_request(" in inspect.getsource(RequestRouter._fulfill_pending_requests)
    helpers = [
        "_fulfill_next_pending_request",
        "_get_pending_request_matching_internal_request_id",
        "_record_queue_wait_time",
        "_cancel_routing_task_for_pending_request",
        "_remove_pending_request_from_indices",
    ]
    assert all(callable(getattr(RequestRouter, helper, None)) for helper in helpers)
    assert "_pending_requests_to_fulfill" in FIFOMixin.__annotations__


class _TimedStream(threading.Thread):
    """One streamed request: `created` is set once the ingress has it, `started` is when its
    first delta arrived (the engine replica took it: it takes one at a time)."""

    def __init__(self, client: openai.OpenAI, tier: str, text: str):
        super().__init__(daemon=True)
        self.client, self.tier, self.text = client, tier, text
        self.created = threading.Event()
        self.started: float | None = None
        self.status: str | None = None

    def run(self) -> None:
        try:
            stream = self.client.responses.create(model="gpt-oss-replay-tiers", input=self.text, stream=True, service_tier=self.tier)
            for event in stream:
                self.created.set()
                if self.started is None and event.type.endswith(".delta"):
                    self.started = time.monotonic()
                if event.type == "response.completed":
                    self.status = event.response.status
        finally:
            self.created.set()


def test_waiting_priority_requests_are_placed_before_waiting_flex_ones(ingress_urls):
    """A long `flex` request from one ingress replica holds the engine replica. Then the other
    ingress replica (addressed directly, as HAProxy forwards to it) gets 12 `flex` requests and
    then 4 `priority` ones, which wait in its router. Each place its router finds goes to a
    waiting `priority` request first, so they start among the first, where arrival order
    (Serve's own router) would start them last (checked: without the ordering, some start
    among the last 8). Not always exactly first: two of the router's requests can be sent to
    one freed place at once, and the replica takes whichever reaches it first. (Between
    ingress replicas there is no order at all: a freed place goes to whichever router asks
    first; hence one router here.)"""
    assert len(ingress_urls) == 2
    holder, router = (openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120) for url in ingress_urls)
    blocker = _TimedStream(holder, "flex", "hold the engine " + "x " * 300)
    blocker.start()
    assert wait_until(lambda: blocker.started is not None, timeout_s=30)
    waiting = [_TimedStream(router, "flex", f"flex {index}") for index in range(12)]
    waiting += [_TimedStream(router, "priority", f"priority {index}") for index in range(4)]
    for stream in waiting:  # in this order, each with the ingress before the next is sent
        stream.start()
        assert stream.created.wait(timeout=30)
    assert blocker.status is None  # still running: everything sent is waiting
    for stream in [blocker, *waiting]:
        stream.join(timeout=120)
        assert stream.status == "completed"
    started = sorted(waiting, key=lambda stream: stream.started)
    assert blocker.started < started[0].started  # nothing overtook the request it waited for
    tiers = [stream.tier for stream in started]
    assert "priority" not in tiers[8:], tiers  # unordered, they start late (they came last)

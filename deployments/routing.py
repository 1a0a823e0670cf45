"""The Serve request router of the `EngineServer` deployments: requests waiting for an engine
replica are placed most urgent `service_tier` first, and a conversation's requests go to the
engine replica whose prefix cache still holds it.

Tiers. When every engine replica is at its `max_ongoing_requests`, requests wait in the
router of the ingress replica that took them, and a few of them at a time (two per engine
replica) look for a place. Serve gives a place found to the oldest waiting request; here, for a
tiered model (`ModelConfig.tiered`), to the oldest of the lowest `GenerationRequest.priority`
(the order a priority-scheduled vLLM engine keeps inside), whichever request it was found
for. Each ingress replica orders the requests it holds; between ingress replicas, a freed
place goes to whichever router asks first.

A response's next round in the tool loop (`GenerationRequest.replica`) goes to the replica
that generated its previous round, whatever the load: its prefix cache holds everything but
the tool's output (Serve passes it over only when that replica is full).

Affinity (`routing.conversation_affinity`). vLLM keeps the KV cache of the prompts it
computed (automatic prefix caching), per engine replica. Serve's default router picks the
less loaded of two random replicas, so with N engine replicas an agent's next turn lands
where its history is cached about once in N, and the rest recompute the whole history: for
a 100k-token agent conversation that is most of the time to its first token. Here each request carries its conversation's key
(`GenerationRequest.affinity_key`: the request's `prompt_cache_key`, as OpenAI routes by
it, else its `conversation`, else its first user message), and the key picks one replica
by rendezvous hashing: the same replica while the set of replicas stays, and when a
replica comes or goes, only the conversations it wins or held move. Load still counts: a
preferred replica with more than `max_imbalance` requests beyond the least loaded one is
passed over for the power of two choices, as is a full one, and requests without a key
are routed as Serve routes them. A replica's load is the larger of the requests this
router has in flight there (always current) and its queue length as Serve's cache last
saw it (all callers' requests, but it expires after 10 s without traffic: a replica that
affinity keeps idle would otherwise look unknown, and a burst of one key pile up).
"""

from __future__ import annotations

import collections
import hashlib
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ray.serve.request_router import LocalityMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from serve_app.core.tokens import GenerationRequest

if TYPE_CHECKING:
    from ray.serve._private.common import RequestMetadata

DEFAULT_MAX_IMBALANCE = 4


def preferred_replica(key: str, replica_ids: list[str]) -> str:
    """The replica a conversation goes to: the highest of `hash(key, replica)` (rendezvous
    hashing), so each replica is preferred by an equal share of keys."""
    return max(replica_ids, key=lambda replica: hashlib.blake2b(f"{key}\x00{replica}".encode(), digest_size=8).digest())


def within_imbalance(preferred: int, others: list[int], max_imbalance: int) -> bool:
    """Whether the preferred replica's load is at most `max_imbalance` requests above the
    least loaded other replica's."""
    return not others or preferred - min(others) <= max_imbalance


def first_choice(
    *,
    pinned: str | None,
    key: str | None,
    replica_ids: list[str],
    load: Callable[[str], int],
    full: Callable[[str], bool],
    max_imbalance: int,
) -> str | None:
    """The replica a request is offered to first, before Serve's two random ones; None: none.
    A tool loop's next round (`pinned`) goes back to its replica whatever the imbalance (Serve
    passes it over only when it is full); a conversation's request to the replica its key
    prefers, unless that one is full or busier than `max_imbalance` allows."""
    if pinned in replica_ids:
        return pinned
    if key is None or len(replica_ids) < 2:
        return None
    preferred = preferred_replica(key, replica_ids)
    others = [load(replica) for replica in replica_ids if replica != preferred]
    if full(preferred) or not within_imbalance(load(preferred), others, max_imbalance):
        return None  # full (Serve would probe it again every round) or too busy
    return preferred


class EngineRouter(LocalityMixin, RequestRouter):
    """Serve's power of two choices, but a request with an affinity key is offered to its
    conversation's replica first, and a replica found goes to a more urgent waiting request if
    there is one (see the module's docstring). Else not FIFO (Serve's `FIFOMixin` gives a
    replica found for one request to the oldest waiting one): a replica chosen for a request
    goes to that request, so affinity holds."""

    def initialize_state(
        self, conversation_affinity: bool = True, max_imbalance: int = DEFAULT_MAX_IMBALANCE, tiered: bool = False, **kwargs: Any
    ) -> None:
        self.conversation_affinity = conversation_affinity
        self.max_imbalance = max_imbalance
        self.tiered = tiered
        self._in_flight: collections.Counter[ReplicaID] = collections.Counter()  # sent, not completed

    def on_send_request(self, replica_id: ReplicaID) -> None:
        super().on_send_request(replica_id)
        self._in_flight[replica_id] += 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        self._in_flight[replica_id] -= 1
        if self._in_flight[replica_id] <= 0:
            del self._in_flight[replica_id]

    def load(self, replica: RunningReplica) -> int:
        """Requests at `replica`: ours in flight, or all callers' as last seen if more."""
        return max(self._in_flight[replica.replica_id], self.replica_queue_len_cache.get(replica.replica_id) or 0)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        two_choices = self._two_choices(candidate_replicas, pending_request)
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        first = first_choice(
            pinned=_generation_field(pending_request, "replica", None),
            key=_generation_field(pending_request, "affinity_key", None) if self.conversation_affinity else None,
            replica_ids=list(by_id),
            load=lambda replica_id: self.load(by_id[replica_id]),
            full=lambda replica_id: self.load(by_id[replica_id]) >= by_id[replica_id].max_ongoing_requests,
            max_imbalance=self.max_imbalance,
        )
        return two_choices if first is None else [[by_id[first]], *two_choices]

    def _fulfill_next_pending_request(self, replica: RunningReplica, request_metadata: RequestMetadata | None = None) -> None:
        """Give a replica found for one request to the most urgent waiting request (the oldest
        of the lowest priority) when that one is more urgent; else to the request it was found
        for, as Serve's router does. Overrides the hook Serve's `FIFOMixin` overrides, with the
        helpers it uses; tests/deployments/test_routing.py checks that they are still there."""
        if self.tiered:
            own = self._get_pending_request_matching_internal_request_id(request_metadata)
            waiting = (request for request in self._pending_requests_to_fulfill if not request.future.done())
            urgent = min(waiting, key=_priority, default=None)  # the first of the lowest: arrival order within a tier
            if urgent is not None and (own is None or _priority(urgent) < _priority(own)):
                self._cancel_routing_task_for_pending_request(urgent)
                self._record_queue_wait_time(urgent)
                urgent.future.set_result(replica)
                self._remove_pending_request_from_indices(urgent)
                return
        super()._fulfill_next_pending_request(replica, request_metadata)

    def _two_choices(self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None) -> list[list[RunningReplica]]:
        """Two random replicas (same-node ones first, as Serve's own router prefers them)."""
        ids = list(self.apply_locality_routing(pending_request)) if pending_request is not None else []
        replicas = [self._replicas[i] for i in ids if i in self._replicas] or candidate_replicas
        return [random.sample(replicas, min(2, len(replicas)))] if replicas else []


def _priority(pending_request: PendingRequest) -> int:
    return cast(int, _generation_field(pending_request, "priority", 0))  # GenerationRequest.priority


def _generation_field(pending_request: PendingRequest | None, name: str, default: Any) -> Any:
    """A field of the `GenerationRequest` among a pending request's arguments (health checks
    and aborts carry none)."""
    if pending_request is None:
        return default
    return next(
        (value for arg in pending_request.args if isinstance(arg, GenerationRequest) and (value := getattr(arg, name)) is not None), default
    )

"""Engine requests of one conversation go to the same engine replica, so its prefix cache
still holds the conversation: a Serve request router for the `EngineServer` deployments.

vLLM keeps the KV cache of the prompts it computed (automatic prefix caching), per engine
replica. Serve's default router picks the less loaded of two random replicas, so with N
engine replicas an agent's next turn lands where its history is cached about once in N,
and the rest recompute the whole history: for a 100k-token agent conversation that is most
of the time to its first token. Here each request carries its conversation's key
(`GenerationRequest.affinity_key`: the request's `prompt_cache_key`, as OpenAI routes by
it, else its `conversation`, else its first user message), and the key picks one replica
by rendezvous hashing: the same replica while the set of replicas stays, and when a
replica comes or goes, only the conversations it wins or held move. Load still counts: a
preferred replica with `max_imbalance` more requests than the least loaded one (as far as
this router knows its replicas' queues) is passed over for the power of two choices, as
is a full one (Serve then tries the others), and requests without a key are routed as
Serve routes them.
"""

from __future__ import annotations

import hashlib
import random
from typing import Optional

from ray.serve.request_router import LocalityMixin, PendingRequest, RequestRouter, RunningReplica

DEFAULT_MAX_IMBALANCE = 4


def preferred_replica(key: str, replica_ids: list[str]) -> str:
    """The replica a conversation goes to: the highest of `hash(key, replica)` (rendezvous
    hashing), so each replica is preferred by an equal share of keys."""
    return max(replica_ids, key=lambda replica: hashlib.blake2b(f"{key}\x00{replica}".encode(), digest_size=8).digest())


def within_imbalance(preferred: int | None, others: list[int | None], max_imbalance: int) -> bool:
    """Whether the preferred replica's queue (None: unknown, probed when routed) is at most
    `max_imbalance` requests above the shortest known queue."""
    known = [length for length in others if length is not None]
    return preferred is None or not known or preferred - min(known) <= max_imbalance


class ConversationAffinityRouter(LocalityMixin, RequestRouter):
    """Serve's power of two choices, but a request with an affinity key is offered to its
    conversation's replica first (see the module's docstring). Not FIFO (Serve's `FIFOMixin`
    gives a replica found for one request to the oldest waiting one): a replica chosen for a
    request goes to that request."""

    def initialize_state(self, max_imbalance: int = DEFAULT_MAX_IMBALANCE, **kwargs) -> None:
        self.max_imbalance = max_imbalance

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> list[list[RunningReplica]]:
        two_choices = self._two_choices(candidate_replicas, pending_request)
        key = _affinity_key(pending_request)
        if key is None or len(candidate_replicas) < 2:
            return two_choices
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        preferred = by_id[preferred_replica(key, list(by_id))]
        queue = self.replica_queue_len_cache.get
        others = [queue(replica.replica_id) for replica in candidate_replicas if replica is not preferred]
        if not within_imbalance(queue(preferred.replica_id), others, self.max_imbalance):
            return two_choices
        return [[preferred], *two_choices]

    def _two_choices(self, candidate_replicas: list[RunningReplica], pending_request: Optional[PendingRequest]) -> list[list[RunningReplica]]:
        """Two random replicas (same-node ones first, as Serve's own router prefers them)."""
        ids = list(self.apply_locality_routing(pending_request)) if pending_request is not None else []
        replicas = [self._replicas[i] for i in ids if i in self._replicas] or candidate_replicas
        return [random.sample(replicas, min(2, len(replicas)))] if replicas else []


def _affinity_key(pending_request: Optional[PendingRequest]) -> str | None:
    if pending_request is None:
        return None
    return next((key for arg in pending_request.args if (key := getattr(arg, "affinity_key", None))), None)

"""The responses one WebSocket connection made, kept in its memory: `previous_response_id`
chains on the connection need no store, and work with `store: false` (as the OpenAI API's
WebSocket mode does).

A connection is served by one ingress replica from its first message to its last, so this is
the one piece of Responses state that may live in a replica's memory: it goes with the
connection. Responses of other connections and of HTTP requests come from the shared store.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

from openai.types.responses import Response

from serve_app.families.harmony import HistoryItem
from serve_app.state.responses import ResponseStore, StoredTurn

MAX_LANES = 64  # lanes whose latest response a connection keeps; the least recently used goes
MAX_BYTES = 64 * 1024 * 1024  # the turns a connection keeps, measured as stored records


class KeptBytes:
    """What all of a replica's connections keep together, against one budget (`max_bytes`)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.total = 0


class ConnectionResponses(ResponseStore):
    """A `ResponseStore` that first looks in the connection's own turns.

    Each lane's latest response is kept with every turn before it on its chain, and nothing
    else: a lane that moves on (or forks from an older response) lets the turns it no longer
    reaches go. So memory follows the conversations being continued, not the connection's age.
    Bounded three times: at most `max_lanes` lanes, at most `max_bytes` of turns (as their
    stored records measure them), and `replica` (if given), what all the replica's connections keep;
    past either of the first two the least recently used lanes go whole (the latest one
    stays), past the replica's budget the connection that adds a turn gives up its lanes
    until it fits, its latest too. Continuing a response that went is then a 400 unless it
    was also stored. `close` gives the connection's share of the replica's budget back.
    """

    def __init__(
        self, shared: ResponseStore, max_lanes: int = MAX_LANES, max_bytes: int = MAX_BYTES, replica: KeptBytes | None = None
    ) -> None:
        super().__init__(shared.base, shared.tenant, shared.ttl_s, shared.cache)
        self.max_lanes = max_lanes
        self.max_bytes = max_bytes
        self.replica = replica
        self._turns: dict[str, tuple[StoredTurn, int]] = {}  # response id -> its turn, the bytes of its record
        self.bytes = 0  # of the turns kept, as stored records (a turn two lanes share counts once)
        self._latest: collections.OrderedDict[str | None, str] = collections.OrderedDict()  # lane -> response id

    def remember(
        self, lane: str | None, response: Response, input_items: list[HistoryItem], tool_texts: Mapping[str, str] | None = None
    ) -> None:
        """Keep a finished response (completed or incomplete) as its lane's latest, with what
        the model read of its built-in tool calls (`StoredTurn.tool_texts`)."""
        turn = StoredTurn.of(response, input_items, tool_texts)
        self._turns[response.id] = (turn, len(turn.encode()))
        self._latest[lane] = response.id
        self._latest.move_to_end(lane)
        self._keep_reachable()
        while len(self._latest) > 1 and (len(self._latest) > self.max_lanes or self.bytes > self.max_bytes):
            self._latest.popitem(last=False)
            self._keep_reachable()
        while self._latest and self.replica is not None and self.replica.total > self.replica.max_bytes:
            self._latest.popitem(last=False)
            self._keep_reachable()

    def forget(self, response_id: str) -> None:
        """A continuation of `response_id` failed: the connection keeps it no more (as OpenAI's
        WebSocket mode evicts the cached response), so continuing it again reads the store:
        `previous_response_not_found` unless it was stored."""
        self._turns.pop(response_id, None)
        for lane in [lane for lane, latest in self._latest.items() if latest == response_id]:
            del self._latest[lane]
        self._keep_reachable()

    def close(self) -> None:
        """Keep nothing more (the connection closed)."""
        self._latest.clear()
        self._keep_reachable()

    def __len__(self) -> int:
        """The turns kept in memory."""
        return len(self._turns)

    async def chain(self, response_id: str) -> list[StoredTurn] | None:
        """The connection's own turns from memory (no store round trip); the shared store
        only for the part of the chain made elsewhere."""
        mine: list[StoredTurn] = []
        seen: set[str] = set()
        next_id: str | None = response_id
        while next_id in self._turns and next_id not in seen:
            seen.add(next_id)
            mine.append(self._turns[next_id][0])
            next_id = mine[-1].previous_response_id
        if next_id in seen:  # a cycle is no chain
            return None
        earlier = [] if next_id is None else await super().chain(next_id)
        return None if earlier is None else earlier + mine[::-1]

    def _keep_reachable(self) -> None:
        kept: dict[str, tuple[StoredTurn, int]] = {}
        for response_id in self._latest.values():
            next_id: str | None = response_id
            while next_id in self._turns and next_id not in kept:
                kept[next_id] = self._turns[next_id]
                next_id = kept[next_id][0].previous_response_id
        self._turns = kept
        kept_bytes = sum(size for _, size in kept.values())
        if self.replica is not None:
            self.replica.total += kept_bytes - self.bytes
        self.bytes = kept_bytes

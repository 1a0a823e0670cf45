"""What a replica holds of its requests' bytes, against one budget.

A request body is read, decoded and validated with all three in memory at once; a WebSocket
message's request waits in its lane's queue and then runs, one of up to
`max_lanes_per_connection` × `max_websockets` at a time. Each is bounded on its own
(`max_request_bytes`), but many at once are not: so the bytes of the bodies being read and
parsed and of the WebSocket requests queued or running count against
`replica_limits.max_request_bytes_in_flight`, and one that does not fit is a 503 at once.
"""

from __future__ import annotations

from serve_app.api.errors import APIError, server_full


class ByteBudget:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0

    def take(self, size: int) -> None:
        """Hold `size` more bytes, or raise a 503 (nothing held then)."""
        if self.held + size > self.max_bytes:
            raise self.full()
        self.held += size

    def give(self, size: int) -> None:
        self.held -= size

    def full(self) -> APIError:
        return server_full(
            f"This server holds as many request bytes as it takes ({self.max_bytes}, replica_limits.max_request_bytes_in_flight). "
            "Retry shortly.",
            code="too_many_request_bytes",
        )

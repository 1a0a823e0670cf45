"""What a replica holds of its requests' bytes, against one budget, and each tenant's share of it.

A request body is read, decoded and validated with all three in memory at once; a WebSocket
message's request waits in its lane's queue and then runs, one of up to
`max_lanes_per_connection` × `max_websockets` at a time. Each is bounded on its own
(`max_request_bytes`), but many at once are not: so the bytes of the bodies being read and
parsed and of the WebSocket requests queued or running count against
`replica_limits.max_request_bytes_in_flight`, and one that does not fit is a 503 at once.

With tenants (`auth`), the bytes one tenant holds count against its share too
(`replica_limits.max_request_bytes_in_flight_per_tenant`; `ReplicaLimits.tenant_request_bytes`):
past it, a 429 for that tenant, while the rest of the budget stays for the others. Without
tenants everyone is one caller: the whole budget is its.
"""

from __future__ import annotations

from serve_app.api.errors import APIError, retry_after, server_full


class ByteBudget:
    """The bytes held on a replica (`max_bytes`), and by each tenant (`per_tenant`; None: no share)."""

    def __init__(self, max_bytes: int, per_tenant: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.per_tenant = per_tenant
        self.held = 0
        self.by_tenant: dict[str, int] = {}  # the tenants holding any, and how many

    def take(self, size: int, tenant: str) -> None:
        """Hold `size` more bytes for `tenant`, or raise (nothing held then): a 429 past the
        tenant's share, a 503 past the replica's budget."""
        mine = self.by_tenant.get(tenant, 0)
        if self.per_tenant is not None and mine + size > self.per_tenant:
            raise self.tenant_full()
        if self.held + size > self.max_bytes:
            raise self.full()
        self.held += size
        self.by_tenant[tenant] = mine + size

    def give(self, size: int, tenant: str) -> None:
        """Give back `size` bytes `tenant` held."""
        self.held -= size
        left = self.by_tenant.get(tenant, 0) - size
        if left > 0:
            self.by_tenant[tenant] = left
        else:
            self.by_tenant.pop(tenant, None)

    def full(self) -> APIError:
        return server_full(
            f"This server holds as many request bytes as it takes ({self.max_bytes}, replica_limits.max_request_bytes_in_flight). "
            "Retry shortly.",
            code="too_many_request_bytes",
        )

    def tenant_full(self) -> APIError:
        error = APIError(
            f"This API key's tenant has as many request bytes in flight on this server as it may ({self.per_tenant}, "
            "replica_limits.max_request_bytes_in_flight_per_tenant): bodies being sent and WebSocket requests queued or "
            "running. Retry when one of them has finished.",
            status_code=429,
            code="too_many_request_bytes",
        )
        return retry_after(error, 1)

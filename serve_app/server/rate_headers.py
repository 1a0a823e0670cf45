"""OpenAI's `x-ratelimit-*` headers on every response to a tenant with rate limits, and the
one place where a route that writes or computes counts a request (`counted`).

`POST /v1/responses` carries the headers of its own admission, and a 429 those of its
refusal. The other routes that write or compute (conversation create, update and items
create) depend on `counted` (`COUNTED`): one request from the tenant's
`requests_per_minute` bucket before any of their work (a 429 when it is empty), whose
headers their answer carries; `input_tokens` on `counted_tokens` (`COUNTED_TOKENS`), which
also needs `tokens_per_minute` left, the tokens it counts then charged to it. Every other response of the tenant (reads, deletes, cancel, a
404) gets the tenant's buckets as they are, read here without taking anything. Only `/health`
and `/ready` (no tenant needed) never get them. A pure ASGI middleware inside `AuthMiddleware`
(which names the tenant): it only adds to the headers of the response's start, and a tenant
without rate limits costs nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import Depends
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.server.auth import OPEN_PATHS, route_path, tenant_of
from serve_app.server.context import tenant_state
from serve_app.state.quotas import TenantQuota
from serve_app.state.store import StoreUnavailable

logger = logging.getLogger(__name__)

MARKERS = ("x-ratelimit-limit-requests", "x-ratelimit-limit-tokens")  # set by the route: its own admission's
TAKEN = "rate_headers"  # `request.state` of a counted request: the headers of its take


async def counted(request: Request) -> None:
    """A dependency of the routes that write or compute without an admission of their own:
    one request from the tenant's `requests_per_minute` (a 429 `RateLimited` when it has none
    left, before the body is read), whose headers its answer then carries."""
    quota = tenant_state(request).quota
    if quota is not None and quota.limits.requests_per_minute is not None:
        setattr(request.state, TAKEN, await quota.take_request())


async def counted_tokens(request: Request) -> None:
    """`counted`, for a route whose work is a prompt's tokens (`input_tokens`): it also needs
    some of the tenant's `tokens_per_minute` left (a 429 before the body is read), and charges
    the tokens it rendered after (`TenantQuota.charge`)."""
    quota = tenant_state(request).quota
    if quota is not None and (quota.limits.requests_per_minute is not None or quota.limits.tokens_per_minute is not None):
        setattr(request.state, TAKEN, await quota.take_request(tokens=True))


COUNTED = [Depends(counted)]  # the `dependencies` of a route that counts a request
COUNTED_TOKENS = [Depends(counted_tokens)]  # of one that counts a request and the tokens it renders


class RateLimitHeaders:
    """Adds the tenant's `x-ratelimit-*` headers to a response that has none (`quotas`: each
    tenant's, None for one without limits)."""

    def __init__(self, app: ASGIApp, quotas: Mapping[str, TenantQuota | None]) -> None:
        self.app = app
        self.quotas = quotas

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        quota = self.quotas.get(tenant_of(scope)) if scope["type"] == "http" and route_path(scope) not in OPEN_PATHS else None
        if quota is None or (quota.limits.requests_per_minute is None and quota.limits.tokens_per_minute is None):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if not any(marker in headers for marker in MARKERS):
                    try:
                        taken = scope.get("state", {}).get(TAKEN)  # a counted request's own (`counted`)
                        for name, value in (taken if taken is not None else await quota.headers()).items():
                            headers.append(name, value)
                    except StoreUnavailable as exc:  # the answer itself does not need the store's counters
                        logger.warning("rate-limit headers left out: %s", exc.message)
            await send(message)

        await self.app(scope, receive, send_with_headers)

"""Optional API-key check (`Authorization: Bearer <key>`) for the `/v1/` routes.

A pure ASGI middleware, not Starlette's `BaseHTTPMiddleware`: that one runs every response
body, each SSE chunk of every stream, through a memory channel of its own. This one only
looks at the request's headers and then hands the connection on untouched. Installed only
when a key is configured. The key is compared in constant time.
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .protocol.errors import APIError


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/") and not self._authorized(scope):
            error = APIError("Incorrect API key provided.", status_code=401, code="invalid_api_key")
            await JSONResponse(error.body(), status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
        return hmac.compare_digest(given, self._expected)

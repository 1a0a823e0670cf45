"""Optional API-key check (`Authorization: Bearer <key>`) for the `/v1/` routes, HTTP and
WebSocket (checked at the handshake).

A pure ASGI middleware, not Starlette's `BaseHTTPMiddleware`: that one runs every response
body, each SSE chunk of every stream, through a memory channel of its own. This one only
looks at the request's headers and then hands the connection on untouched. Installed only
when a key is configured. The key is compared in constant time.
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from responses_serve.api.errors import APIError


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and scope["path"].startswith("/v1/") and not self._authorized(scope):
            error = APIError("Incorrect API key provided.", status_code=401, code="invalid_api_key")
            response = JSONResponse(error.body(), status_code=401)
            if scope["type"] == "http":
                await response(scope, receive, send)
            elif "websocket.http.response" in scope.get("extensions", {}):  # refused at the handshake, with the 401
                await WebSocket(scope, receive, send).send_denial_response(response)
            else:  # a server without denial responses refuses it with a bare 403
                await WebSocket(scope, receive, send).close(code=1008)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
        return hmac.compare_digest(given, self._expected)

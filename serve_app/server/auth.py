"""Who is calling: API keys to tenants, denied by default, for every route but the health check.

A pure ASGI middleware, not Starlette's `BaseHTTPMiddleware`: that one runs every response
body, each SSE chunk of every stream, through a memory channel of its own. This one only
looks at the request's headers and then hands the connection on untouched.

- With keys configured (`auth` in the config), every HTTP request and WebSocket handshake
  needs `Authorization: Bearer <key>`, whatever its path or method, under any Serve
  `route_prefix` (`/openapi.json` too): only `OPEN_PATHS` (relative to the prefix) are open.
  No key or a wrong one: 401 with an OpenAI-shaped body; a WebSocket is refused at the
  handshake.
- Without keys everything is open and every caller is the one tenant `ANONYMOUS`.

The tenant goes into the request's scope (`request.state.tenant`, `tenant_of(scope)`), where
the routes take it from to reach that tenant's state and quotas. Keys are known by their
SHA-256 only (a key read from the environment is hashed when the replica starts); a
presented key is hashed and compared with every configured digest in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from serve_app.api.errors import APIError
from serve_app.config import AuthConfig

logger = logging.getLogger(__name__)

ANONYMOUS = "anonymous"  # the one tenant of a server without keys
OPEN_PATHS = frozenset({"/health", "/ready"})  # liveness and readiness (below the route prefix): no key needed
MIN_KEY_CHARS = 16
MAX_AUTHORIZATION_BYTES = 1024  # longer is no key of ours: refused before hashing


class UnusableKey(ValueError):
    """A configured key that cannot be used (its variable unset, too short); names the variable, never the value."""


@dataclass(frozen=True, slots=True)
class Keyring:
    """The configured keys, as (SHA-256 digest, tenant) pairs."""

    digests: tuple[tuple[bytes, str], ...]

    @classmethod
    def from_config(cls, auth: AuthConfig, environ: Mapping[str, str] = os.environ) -> Keyring:
        """Read each `key_env` now (a replica's start): an unset or unusable variable is a
        `UnusableKey` naming it. Surrounding whitespace (a Secret made from a file ends in a
        newline) is not part of a key."""
        digests = []
        for index, entry in enumerate(auth.keys):
            where = f"auth.keys[{index}] (tenant {entry.tenant!r})"
            if entry.key_sha256 is not None:
                digests.append((bytes.fromhex(entry.key_sha256), entry.tenant))
                continue
            assert entry.key_env is not None  # the config requires one of the two
            key = environ.get(entry.key_env, "").strip()
            if not key:
                raise UnusableKey(f"{where}: the environment variable {entry.key_env} that should hold the API key is not set or empty")
            if len(key) < MIN_KEY_CHARS or any(c.isspace() for c in key) or not key.isprintable():
                raise UnusableKey(
                    f"{where}: the API key in {entry.key_env} must be at least {MIN_KEY_CHARS} printable characters without whitespace"
                )
            digests.append((hashlib.sha256(key.encode()).digest(), entry.tenant))
        return cls(tuple(digests))

    def tenant(self, key: bytes) -> str | None:
        """The tenant of `key`, or None. Every digest is compared (in constant time), whichever matches."""
        digest = hashlib.sha256(key).digest()
        found = None
        for expected, tenant in self.digests:
            if hmac.compare_digest(digest, expected):
                found = tenant
        return found


def tenant_of(scope: Scope) -> str:
    """The tenant the middleware put into this request's scope (a route never runs without one)."""
    return cast(str, scope["state"]["tenant"])


def route_path(scope: Scope) -> str:
    """The path below the app's route prefix, exactly as Starlette's router matches it
    (`starlette._utils.get_route_path`, private there; tests/server/test_auth.py holds them equal)."""
    path: str = scope["path"]
    root_path = scope.get("root_path", "")
    if not root_path or not path.startswith(root_path):
        return path
    if path == root_path:
        return ""
    return path[len(root_path) :] if path[len(root_path)] == "/" else path


def _bearer(scope: Scope) -> bytes | None:
    """The token of the one `Authorization: Bearer <token>` header; None if absent or not that."""
    values = [value for name, value in scope["headers"] if name.lower() == b"authorization"]
    if len(values) != 1 or len(values[0]) > MAX_AUTHORIZATION_BYTES:
        return None
    scheme, _, token = values[0].strip().partition(b" ")
    token = token.strip()
    return token if scheme.lower() == b"bearer" and token else None


class AuthMiddleware:
    """Puts the caller's tenant into the scope, or answers 401 (`keyring` None: everyone is `ANONYMOUS`)."""

    def __init__(self, app: ASGIApp, keyring: Keyring | None) -> None:
        self.app = app
        self.keyring = keyring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        if self.keyring is None:
            tenant: str | None = ANONYMOUS
        else:
            token = _bearer(scope)
            tenant = self.keyring.tenant(token) if token is not None else None
            if tenant is None and route_path(scope) not in OPEN_PATHS:
                await _refuse(scope, receive, send, missing=token is None)
                return
        # A copy: the server's own `state` (lifespan state) is shared by every request.
        scope["state"] = {**scope.get("state", {}), "tenant": tenant}
        await self.app(scope, receive, send)


async def _refuse(scope: Scope, receive: Receive, send: Send, *, missing: bool) -> None:
    message = (
        "You didn't provide an API key. Provide it in an Authorization header using Bearer auth (Authorization: Bearer YOUR_KEY)."
        if missing
        else "Incorrect API key provided."
    )
    error = APIError(message, status_code=401, code="invalid_api_key")
    response = JSONResponse(error.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})
    if scope["type"] == "http":
        await response(scope, receive, send)
    elif "websocket.http.response" in scope.get("extensions", {}):  # refused at the handshake, with the 401
        await WebSocket(scope, receive, send).send_denial_response(response)
    else:  # a server without denial responses refuses it with a bare 403
        await WebSocket(scope, receive, send).close(code=1008)


def warn_if_open(host: str) -> None:
    """An open server (no `auth`) is fine on loopback; anywhere else, say so at start."""
    if _loopback(host):
        return
    logger.warning(
        "no `auth` section: every client that reaches this server (listening on %s) can use it, as one anonymous "
        "tenant; configure auth.keys to require API keys",
        host,
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

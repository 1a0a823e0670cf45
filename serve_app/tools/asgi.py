"""The type of an ASGI application, for the tool servers' MCP apps (the `mcp` SDK builds
them on Starlette; `tools/` names none of it: HTTP frameworks stay in `server/` and `cli/`)."""

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

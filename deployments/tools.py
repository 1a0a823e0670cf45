"""The embedded built-in tools as Serve deployments of the app (`tools.builtin.*.embedded`):
`PythonToolServer` (sandboxed containers) and `BrowserToolServer` (browsing sessions), CPU
replicas scaled like the ingress, called by the ingress through `HandleToolTransport`.

A tool's state lives in one replica: a python container, a response's browsing session. So
every reply names the replica that answered, and a later call on the same state carries it
(`ToolRequest.route`); `ToolRouter` sends such a call to that replica only, waiting for
room there rather than going elsewhere. A replica that is gone takes its state with it: the
call goes to any replica, which answers that it has no such container (`not_found`) or
starts a new browsing session, and the response goes on.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import mcp_types
from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from deployments import use_serve_logging
from serve_app.config import EmbeddedBrowserConfig, EmbeddedPythonConfig
from serve_app.engines.cpu_cores import leave_batch_policy
from serve_app.tools.builtin.transport import ToolReply, ToolRequest, ToolUnavailable

logger = logging.getLogger(__name__)


def _replica_id() -> str:
    return serve.get_replica_context().replica_id.unique_id


def _reply(result: mcp_types.CallToolResult) -> tuple[dict[str, Any], str]:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True), _replica_id()


class PythonToolServer:
    """Serve deployment class: the python tool's containers in this replica."""

    async def __init__(self, config: dict[str, Any]) -> None:  # type: ignore[misc]  # Serve awaits an async constructor
        from serve_app.tools.builtin.embedded import start_python  # the tools' code: only in their replicas

        use_serve_logging()
        leave_batch_policy()
        self.manager = await start_python(EmbeddedPythonConfig.model_validate(config))

    async def call(self, request: ToolRequest) -> tuple[dict[str, Any], str]:
        from serve_app.tools.python.mcp_server import call_python

        params = mcp_types.CallToolRequestParams.model_validate(request.params)
        return _reply(await call_python(self.manager, params))

    async def __del__(self) -> None:
        from serve_app.tools.builtin.embedded import aclose_python

        await aclose_python(self.manager)


class BrowserToolServer:
    """Serve deployment class: the browser and the browsing sessions of this replica."""

    def __init__(self, config: dict[str, Any]) -> None:
        from serve_app.tools.builtin.embedded import make_browser  # the tools' code: only in their replicas

        use_serve_logging()
        leave_batch_policy()
        self.embedded = make_browser(EmbeddedBrowserConfig.model_validate(config))

    async def call(self, request: ToolRequest) -> tuple[dict[str, Any], str]:
        from serve_app.tools.browser.server import call_browser

        params = mcp_types.CallToolRequestParams.model_validate(request.params)
        return _reply(await call_browser(self.embedded.browser, self.embedded.sessions, params))

    async def __del__(self) -> None:
        await self.embedded.aclose()


class ToolRouter(RequestRouter):
    """A call with a route goes to that replica only (it waits there for room: its state is
    nowhere else); a call without one, or whose replica is gone, to the less loaded of two
    random replicas, as Serve routes."""

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        route = next((arg.route for arg in pending_request.args if isinstance(arg, ToolRequest)), None) if pending_request else None
        if route is not None:
            pinned = [replica for replica in candidate_replicas if replica.replica_id.unique_id == route]
            if pinned:
                return [pinned]
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))] if candidate_replicas else []


class HandleToolTransport:
    """`ToolTransport` over an embedded tool's deployment handle."""

    def __init__(self, handle: DeploymentHandle[PythonToolServer | BrowserToolServer]) -> None:
        self._handle = handle

    async def call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any], route: str | None) -> ToolReply:
        params = {"name": name, "arguments": arguments, "_meta": meta}
        try:
            result, replica = await self._handle.call.remote(ToolRequest(params, route))
        except Exception as exc:  # a replica that died mid-call, Serve's errors: the details go to the log
            logger.warning("built-in tool call failed: %s", exc, exc_info=True)
            raise ToolUnavailable("the tool's replica failed during the call") from None
        return ToolReply(mcp_types.CallToolResult.model_validate(result), replica)

    async def aclose(self) -> None:
        pass

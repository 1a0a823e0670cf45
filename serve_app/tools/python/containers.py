"""Containers of the python tool: sandboxed interpreters that keep their state between calls.

A container is an unguessable id (`cntr_` + 128 random bits), the owner it belongs to (an opaque
string: the ingress passes the tenant) and, while it lives, one sandboxed interpreter. Calls on
one container run one at a time, in order; calls on different containers run side by side.
Bounded: containers per server and per owner, a TTL after the last use (then the interpreter is
killed and its files, which live only in the sandbox's tmpfs, are gone).

An id of another owner is answered exactly as an unknown id. Nothing here knows about MCP: the
MCP server (mcp_server.py) and any other front (a Ray Serve deployment) wrap `ContainerManager`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from dataclasses import dataclass, field

from serve_app.config import ContainerLimits, SandboxLimits
from serve_app.tools.python.sandbox import CellResult, Interpreter, Runtime, SandboxError

logger = logging.getLogger(__name__)

CONTAINER_ID = re.compile(r"cntr_[0-9a-f]{32}")
MAX_OWNER_CHARS = 256


class ContainerError(Exception):
    """A call that cannot run: `reason` is `not_found`, `limit`, `busy`, `invalid` or `sandbox`."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Container:
    id: str
    owner: str
    last_used: float
    interpreter: Interpreter | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    removed: bool = False


class ContainerManager:
    """Creates containers, runs code in them, expires and deletes them."""

    def __init__(self, runtime: Runtime, limits: SandboxLimits | None = None, container_limits: ContainerLimits | None = None):
        self.runtime = runtime
        self.limits = limits or SandboxLimits()
        self.container_limits = container_limits or ContainerLimits()
        self._containers: dict[str, Container] = {}
        self._reaper: asyncio.Task[None] | None = None

    @classmethod
    async def create(
        cls,
        limits: SandboxLimits | None = None,
        container_limits: ContainerLimits | None = None,
        *,
        python: str | None = None,
        seccomp: bool = True,
        sandbox_uid: int = 65534,
    ) -> ContainerManager:
        runtime = await Runtime.discover(python, seccomp=seccomp, sandbox_uid=sandbox_uid)
        return cls(runtime, limits, container_limits)

    async def __aenter__(self) -> ContainerManager:
        self._reaper = asyncio.create_task(self._reap_forever())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*(self._remove(container) for container in list(self._containers.values())))

    async def run(self, owner: str, container_id: str | None, code: str, *, create: bool = False) -> tuple[str, CellResult]:
        """Run `code` in the owner's container `container_id` (a new container when None; with
        `create`, the container of that id, made if it does not exist)."""
        if not isinstance(code, str) or len(code.encode("utf-8", errors="surrogatepass")) > self.container_limits.max_code_bytes:
            raise ContainerError("invalid", f"code must be a string of at most {self.container_limits.max_code_bytes} bytes")
        if not isinstance(owner, str) or len(owner) > MAX_OWNER_CHARS:
            raise ContainerError("invalid", f"the owner must be a string of at most {MAX_OWNER_CHARS} characters")
        made = container_id is None or (create and container_id not in self._containers)
        if container_id is not None and not made:
            container = self._find(owner, container_id)
        elif container_id is not None and not CONTAINER_ID.fullmatch(container_id):
            raise ContainerError("invalid", "a container id to create must be cntr_ and 32 hexadecimal digits")
        else:
            container = self._new(owner, container_id)
        try:
            await asyncio.wait_for(container.lock.acquire(), self.limits.timeout_s)
        except TimeoutError:
            raise ContainerError("busy", f"container {container.id} is still running an earlier call") from None
        try:
            if container.removed:
                raise ContainerError("not_found", _not_found(container.id))
            container.last_used = time.monotonic()
            if container.interpreter is None or not container.interpreter.alive:
                try:
                    container.interpreter = await Interpreter.start(self.runtime, self.limits)
                except SandboxError as error:
                    logger.error("python tool: %s", error)
                    if made:  # a container that never ran does not count against the limits
                        await self._remove(container)
                    raise ContainerError("sandbox", "the sandbox could not start; see the tool server's log") from error
            result = await container.interpreter.run(code)
            container.last_used = time.monotonic()
            return container.id, result
        finally:
            container.lock.release()

    async def delete(self, owner: str, container_id: str) -> bool:
        """Remove a container now; False when the owner has no such container."""
        container = self._containers.get(container_id)
        if container is None or container.owner != owner:
            return False
        await self._remove(container)
        return True

    def owned(self, owner: str) -> list[str]:
        return [container.id for container in self._containers.values() if container.owner == owner]

    def interpreter_pid(self, owner: str, container_id: str) -> int | None:
        """The sandbox's outermost process, if running (for operators and tests)."""
        container = self._containers.get(container_id)
        if container is None or container.owner != owner or container.interpreter is None or not container.interpreter.alive:
            return None
        return container.interpreter.pid

    async def expire(self) -> int:
        """Remove the containers idle longer than the TTL; returns how many."""
        deadline = time.monotonic() - self.container_limits.ttl_s
        idle = [c for c in self._containers.values() if c.last_used < deadline and not c.lock.locked()]
        await asyncio.gather(*(self._remove(container) for container in idle))
        return len(idle)

    def _new(self, owner: str, container_id: str | None = None) -> Container:
        if len(self._containers) >= self.container_limits.max_containers:
            raise ContainerError(
                "limit", f"the python tool runs {self.container_limits.max_containers} containers, its limit; try again later"
            )
        if len(self.owned(owner)) >= self.container_limits.max_containers_per_owner:
            raise ContainerError(
                "limit",
                f"this owner has {self.container_limits.max_containers_per_owner} containers, the limit; reuse one or wait until one expires",
            )
        container = Container(id=container_id or "cntr_" + secrets.token_hex(16), owner=owner, last_used=time.monotonic())
        self._containers[container.id] = container
        return container

    def _find(self, owner: str, container_id: str) -> Container:
        container = self._containers.get(container_id) if isinstance(container_id, str) and CONTAINER_ID.fullmatch(container_id) else None
        if container is None or container.owner != owner:
            raise ContainerError("not_found", _not_found(container_id))
        return container

    async def _remove(self, container: Container) -> None:
        container.removed = True
        self._containers.pop(container.id, None)
        if container.interpreter is not None:
            await container.interpreter.kill()

    async def _reap_forever(self) -> None:
        period = min(self.container_limits.ttl_s / 4, 10.0)
        while True:
            await asyncio.sleep(period)
            try:
                await self.expire()
            except Exception:
                logger.exception("python tool: expiring containers failed")


def _not_found(container_id: object) -> str:
    shown = container_id if isinstance(container_id, str) and CONTAINER_ID.fullmatch(container_id) else "with that id"
    return f"no container {shown}: it expired, was deleted, or never existed"

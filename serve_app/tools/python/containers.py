"""Containers of the python tool: sandboxed interpreters that keep their state between calls.

A container is an unguessable id (`cntr_` + 128 random bits), the owner it belongs to (an opaque
string: the ingress passes the tenant) and, while it lives, one sandboxed interpreter. Calls on
one container run one at a time, in order; calls on different containers run side by side.
A call that names no container runs in a one-shot container, removed when the call ends.

Bounded by memory: the server holds as many containers as its memory budget has room for
(`ContainerLimits.memory_budget_mb // SandboxLimits.footprint_mb`), one-shot ones included.
When it is full, a new container takes the place of an idle one (no call running or waiting on
it), chosen for fairness: the least recently used of the owner that holds the most, if that
owner holds at least two more than the caller; else the caller's own least recently used; else
the call is refused (`limit`). So no owner is held to a fixed count while there is room, and
under contention the owners' shares even out. A container is also removed after a TTL since
its last use (then the interpreter is killed and its files, which live only in the sandbox's
tmpfs, are gone).

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
    calls: int = 0  # calls running or waiting on it: never evicted while any


class ContainerManager:
    """Creates containers, runs code in them, expires and deletes them."""

    def __init__(self, runtime: Runtime, limits: SandboxLimits | None = None, container_limits: ContainerLimits | None = None):
        self.runtime = runtime
        self.limits = limits or SandboxLimits()
        self.container_limits = container_limits or ContainerLimits()
        self.max_containers = self.container_limits.max_containers(self.limits)
        if self.max_containers < 1:
            raise SandboxError(
                f"the memory budget ({self.container_limits.memory_budget_mb} MiB) holds no sandbox of "
                f"{self.limits.footprint_mb} MiB (memory_mb + 3 × disk_mb)"
            )
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

    async def run(self, owner: str, container_id: str | None, code: str, *, create: bool = False) -> tuple[str | None, CellResult]:
        """Run `code` in the owner's container `container_id` (with `create`, the container of
        that id, made if it does not exist); with None, in a one-shot container, removed when the
        call ends (the id returned is None: there is nothing to continue)."""
        if not isinstance(code, str) or len(code.encode("utf-8", errors="surrogatepass")) > self.container_limits.max_code_bytes:
            raise ContainerError("invalid", f"code must be a string of at most {self.container_limits.max_code_bytes} bytes")
        if not isinstance(owner, str) or len(owner) > MAX_OWNER_CHARS:
            raise ContainerError("invalid", f"the owner must be a string of at most {MAX_OWNER_CHARS} characters")
        one_shot = container_id is None
        made = one_shot or (create and container_id not in self._containers)
        evicted: Container | None = None
        if container_id is not None and not made:
            container = self._find(owner, container_id)
        elif container_id is not None and not CONTAINER_ID.fullmatch(container_id):
            raise ContainerError("invalid", "a container id to create must be cntr_ and 32 hexadecimal digits")
        else:
            container, evicted = self._new(owner, container_id)
        container.calls += 1  # before any await: from now on it is never evicted
        try:
            if evicted is not None:
                await self._remove(evicted)
            return await self._run_in(container, code, made=made, one_shot=one_shot)
        finally:
            container.calls -= 1
            if one_shot:
                await self._remove(container)

    async def _run_in(self, container: Container, code: str, *, made: bool, one_shot: bool) -> tuple[str | None, CellResult]:
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
                    container.interpreter = await Interpreter.start(self.runtime, self.limits, one_shot=one_shot)
                except SandboxError as error:
                    logger.error("python tool: %s", error)
                    if made:  # a container that never ran does not count against the limits
                        await self._remove(container)
                    raise ContainerError("sandbox", "the sandbox could not start; see the tool server's log") from error
            result = await container.interpreter.run(code)
            container.last_used = time.monotonic()
            return (None if one_shot else container.id), result
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
        idle = [c for c in self._containers.values() if c.last_used < deadline and c.calls == 0 and not c.lock.locked()]
        await asyncio.gather(*(self._remove(container) for container in idle))
        return len(idle)

    def _new(self, owner: str, container_id: str | None = None) -> tuple[Container, Container | None]:
        """A new container for `owner`, and the idle container it replaces when the server is
        full (already forgotten: the caller kills it). No await: nothing runs in between."""
        evicted = None
        if len(self._containers) >= self.max_containers:
            evicted = self._victim(owner)
            if evicted is None:
                raise ContainerError(
                    "limit",
                    f"the python tool holds {self.max_containers} containers, as many as its memory allows, and none "
                    "can make room for this call now; try again later",
                )
            evicted.removed = True
            self._containers.pop(evicted.id, None)
            logger.info("python tool: container of another call freed for a new one (the server is full)")
        container = Container(id=container_id or "cntr_" + secrets.token_hex(16), owner=owner, last_used=time.monotonic())
        self._containers[container.id] = container
        return container, evicted

    def _victim(self, owner: str) -> Container | None:
        """The idle container a new one of `owner` replaces on a full server: fair shares, not
        first come. The least recently used of the owner holding the most (with at least two
        more than `owner`: a swap would only move the shortage), else `owner`'s own."""
        held: dict[str, int] = {}
        for container in self._containers.values():
            held[container.owner] = held.get(container.owner, 0) + 1
        idle = [container for container in self._containers.values() if container.calls == 0 and not container.lock.locked()]
        mine = held.get(owner, 0)
        others = [container for container in idle if container.owner != owner and held[container.owner] >= mine + 2]
        if others:
            most = max(held[container.owner] for container in others)
            return min((c for c in others if held[c.owner] == most), key=lambda c: c.last_used)
        own = [container for container in idle if container.owner == owner]
        return min(own, key=lambda c: c.last_used) if own else None

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
    return f"no container {shown}: it expired, was deleted or freed for others, or never existed"

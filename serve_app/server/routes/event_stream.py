"""The HTTP side of a stream of server-sent events, with keep-alive comments.

A stream can be quiet for long: a request queued at a busy engine before its first token, a
chat-template tool call held until its JSON is whole, a background response followed while
it waits. Load balancers in front of a server close connections idle longer than their
timeout (60 s on many), which would cut such a stream without a terminal event. So when
`keepalive_s` passes with nothing written, the response writes an SSE comment, which every
SSE client skips (the `openai` SDK's decoder, Codex's, the WHATWG spec).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Any

import anyio
from starlette.requests import HTTPConnection
from starlette.responses import StreamingResponse
from starlette.types import Message, Send

from serve_app.api.sse import OPEN_RESPONSES_HEADER, in_open_responses_dialect

logger = logging.getLogger(__name__)

KEEPALIVE = b": keep-alive\n\n"
CLOSE_TIMEOUT_S = 5.0  # the longest a stream's own cleanup may hold its end
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # X-Accel: nginx must not buffer it


async def _in_open_responses_dialect(frames: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    async with contextlib.aclosing(frames):
        async for data in frames:
            yield in_open_responses_dialect(data)


def wants_open_responses(request: HTTPConnection) -> bool:
    """The client asked for Open Responses' event names (its `OpenResponses-Version` header)."""
    return OPEN_RESPONSES_HEADER in request.headers


class ClientStalled(Exception):
    """A client took nothing of its stream for the send timeout."""


class EventStreamResponse(StreamingResponse):
    """`text/event-stream` of `frames` (whole events), with `KEEPALIVE` after `keepalive_s`
    of quiet (None or 0: never)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        keepalive_s: float | None,
        headers: dict[str, str] | None = None,
        send_timeout_s: float | None = None,
        open_responses: bool = False,
    ) -> None:
        """`send_timeout_s`: a client that takes no write for this long is dropped (the
        stream ends, its events closed: the engine request aborted). `open_responses`: the
        events in Open Responses' names (`api.sse.in_open_responses_dialect`)."""
        super().__init__(_in_open_responses_dialect(frames) if open_responses else frames, headers={**HEADERS, **(headers or {})})
        self.keepalive_s = keepalive_s
        self.send_timeout_s = send_timeout_s
        self._last_write = 0.0

    async def _send(self, send: Send, message: Message) -> None:
        """`send(message)`, within the send timeout: a client that reads nothing (its socket's
        buffers full) must not hold the stream, and what it holds, forever."""
        if self.send_timeout_s is None:
            return await send(message)
        try:
            async with asyncio.timeout(self.send_timeout_s):
                await send(message)
        except TimeoutError:
            raise ClientStalled(f"the client took nothing for {self.send_timeout_s:g} s") from None

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        loop = asyncio.get_running_loop()
        self._last_write = loop.time()
        keepalive = asyncio.create_task(self._keep_alive(send)) if self.keepalive_s else None
        try:
            async for frame in self.body_iterator:
                self._last_write = loop.time()
                await self._send(send, {"type": "http.response.body", "body": frame, "more_body": True})
        except ClientStalled as stalled:
            logger.warning("SSE stream dropped: %s", stalled)
            return  # its connection is closed under it (the response is left unfinished)
        finally:
            # A client that went away cancels this: the events' own `finally` blocks (aborting
            # the engine request, giving the tenant's places back) run now, not whenever the
            # garbage collector finds the abandoned generator (Starlette leaves it open).
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT_S):
                await _close(self.body_iterator)
            # Before the last write: no comment may follow the end of the body. `wait`, not
            # `await keepalive`: a cancellation of this task must go on propagating.
            if keepalive is not None:
                keepalive.cancel()
                await asyncio.wait([keepalive])
                if not keepalive.cancelled() and (error := keepalive.exception()) is not None:
                    logger.warning("SSE keep-alives stopped early: %r", error)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _keep_alive(self, send: Send) -> None:
        """Sends are whole messages (the ASGI server writes each at once), so a comment can
        only fall between two events."""
        loop = asyncio.get_running_loop()
        keepalive_s = self.keepalive_s or 0.0  # only started with one
        while True:
            quiet = loop.time() - self._last_write
            if quiet < keepalive_s:
                await asyncio.sleep(keepalive_s - quiet)
                continue
            self._last_write = loop.time()
            await self._send(send, {"type": "http.response.body", "body": KEEPALIVE, "more_body": True})


async def _close(iterator: Any) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()

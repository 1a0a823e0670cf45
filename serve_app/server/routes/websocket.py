"""`/v1/responses` over a WebSocket: the SDK's `client.responses.connect()` (the protocol:
serve_app/api/websocket.py).

One connection carries many responses. Each `response.create` joins its lane (`stream_id`);
a lane runs its responses one after the other, lanes run side by side, and every response
runs as `POST /v1/responses` with `stream: true` runs it (`start_turn`, `run_turn`): the same
events, stored the same way. A finished response is also kept with the connection
(`ConnectionResponses`), so the next turn continues it without a store read, with
`store: false` too. A client that goes away ends its responses: their engine requests are
aborted. A message's bytes are held, queued or running, against the replica's budget and
its tenant's share of it (runtime/admission.py); its tenant's quotas admit it as its response
starts (`begin_turn`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
from typing import Any

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect

from serve_app.api.errors import APIError, retry_after, server_error, server_full
from serve_app.api.websocket import CreateEvent, SteerEvent, error_message, event_message, parse_client_event, steer_failed_message
from serve_app.config import ReplicaLimits
from serve_app.runtime.admission import ByteBudget
from serve_app.runtime.metrics import RequestTrace, report_once, report_refusal
from serve_app.runtime.offload import parse_body_off_loop
from serve_app.runtime.run import REFUSAL_WINDOW_S, PromptOnly, run_turn
from serve_app.server.context import app_context, tenant_state
from serve_app.server.routes.event_stream import wants_open_responses
from serve_app.server.routes.responses import begin_turn, first_events, prepended, reported
from serve_app.state.connection import ConnectionResponses

logger = logging.getLogger(__name__)

router = APIRouter()

PROMPT_ONLY = PromptOnly()
# After a 429 the connection's next message is read only once its Retry-After has passed (at
# most this long): a client flooding past its limits is slowed by TCP, not answered message by
# message (reading, parsing and refusing 60 KB messages at line rate took the replica's CPU).
MAX_REFUSAL_PAUSE_S = 1.0


@router.websocket("/v1/responses")
async def responses_socket(websocket: WebSocket) -> None:
    await ResponsesSocket(websocket).serve()


def _too_many(message: str, code: str) -> APIError:
    return retry_after(APIError(f"{message}. Wait for the responses before it.", status_code=429, param="stream_id", code=code), 1)


async def _deny(websocket: WebSocket, error: APIError) -> None:
    """Refuse a WebSocket before it opens: with the HTTP answer (status, Retry-After, the
    error body) where the server can send one, else closed with 1013 (try again later)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse(error.body(), status_code=error.status_code, headers=error.headers))
    else:
        await websocket.close(code=1013, reason=error.message[:120])


class ClientGone(Exception):
    """A send found the connection closed."""


class ResponsesSocket:
    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.open_responses = wants_open_responses(websocket)  # the handshake's OpenResponses-Version
        self.context = app_context(websocket)
        self.settings = self.context.settings
        self.tenant = tenant_state(websocket)
        self.limits: ReplicaLimits = self.settings.replica_limits
        # The connection's turns (its tenant's), within its own bounds and the replica's.
        self.responses = ConnectionResponses(
            self.tenant.responses,
            self.limits.max_lanes_per_connection,
            self.limits.max_kept_bytes_per_connection,
            self.context.websocket_turns,
        )
        # Lanes with work: their requests (the running one first), each with the bytes of its message held.
        self.lanes: dict[str | None, collections.deque[tuple[CreateEvent, int]]] = {}
        self.budget: ByteBudget = self.context.request_bytes
        self._receiver: asyncio.Task[Any] | None = None  # the task serving the connection
        self._dropped = False
        self.workers: set[asyncio.Task[None]] = set()
        self._sending = asyncio.Lock()  # lanes send side by side: one whole message at a time
        self._read_after = 0.0  # loop time before which the next message is not read (a 429's wait)

    async def serve(self) -> None:
        limit = self.limits.max_websockets
        if self.context.websockets_open >= limit:  # refused before it opens: a 503, as over HTTP
            error = server_full(
                f"This server holds as many WebSocket connections as it takes ({limit}, replica_limits.max_websockets). Retry shortly.",
                code="too_many_connections",
            )
            await _deny(self.websocket, error)
            return
        per_tenant = self.limits.max_websockets_per_tenant
        if self.context.tenanted and self.context.websockets_by_tenant.get(self.tenant.name, 0) >= per_tenant:
            error = APIError(
                f"This API key's tenant holds as many WebSocket connections on this server as it may ({per_tenant}, "
                "replica_limits.max_websockets_per_tenant). Close one, or retry shortly.",
                status_code=429,
                code="too_many_connections",
            )
            await _deny(self.websocket, retry_after(error, 1))
            return
        # Counted before the first await (the handshake's accept): checks and counts of
        # concurrent handshakes then never interleave, so no number of them passes a cap.
        self._count_open(+1)
        self._receiver = asyncio.current_task()  # cancelled to end a connection whose client stalled
        try:
            await self.websocket.accept()
            while (message := await self._receive()) is not None:
                await self._dispatch(message)
                if (wait := self._read_after - asyncio.get_running_loop().time()) > 0:
                    await asyncio.sleep(wait)
        except asyncio.CancelledError:
            if not self._dropped:  # not our own ending of a stalled client's connection
                raise
        finally:
            # Counted closed first, its kept turns let go last: the wait between may itself be
            # cancelled (the client is gone), and a worker may still keep its turn until then.
            self._count_open(-1)
            try:
                for worker in self.workers:
                    worker.cancel()
                await asyncio.gather(*self.workers, return_exceptions=True)
            finally:
                self.responses.close()

    def _count_open(self, change: int) -> None:
        self.context.websockets_open += change
        by_tenant = self.context.websockets_by_tenant
        by_tenant[self.tenant.name] = by_tenant.get(self.tenant.name, 0) + change
        self.context.metrics.websockets_open(self.context.websockets_open)

    async def _receive(self) -> str | bytes | None:
        message = await self.websocket.receive()
        if message["type"] == "websocket.disconnect":
            return None
        return message["text"] if message.get("text") is not None else message.get("bytes") or b""

    async def _dispatch(self, message: str | bytes) -> None:
        lane = None
        try:
            size = message_bytes(message)
            if size > self.settings.max_request_bytes:
                raise APIError(
                    f"The message is larger than this server accepts ({self.settings.max_request_bytes} bytes).",
                    status_code=413,
                    code="request_too_large",
                )
            # Given back when its response has ended, or it was refused. Queued or running, it
            # counts against its tenant's share (a 429 past it), not only the replica's budget.
            self.budget.take(size, self.tenant.name)
            try:
                event = await parse_body_off_loop(message, functools.partial(parse_client_event, limits=self.settings.request_limits))
                lane = event.lane
                if isinstance(event, SteerEvent):
                    await self._send(steer_failed_message(event))
                    self.budget.give(size, self.tenant.name)
                    return
                self._enqueue(event, size)
            except BaseException:
                self.budget.give(size, self.tenant.name)
                raise
        except APIError as error:
            with contextlib.suppress(ClientGone):
                await self._send_error(error, lane)
        except ClientGone:
            pass  # the next receive sees the disconnect

    def _enqueue(self, event: CreateEvent, size: int) -> None:
        """Into its lane's queue, within the connection's bounds (a 429: it sends faster than
        it is served; the message is answered with an error on its lane, never kept)."""
        limits = self.limits
        queue = self.lanes.get(event.lane)
        if queue is not None and len(queue) > limits.max_queued_per_lane:  # the running one and those waiting
            raise _too_many(
                f"{limits.max_queued_per_lane} response.create messages wait on lane {event.lane!r} (replica_limits.max_queued_per_lane)",
                "too_many_queued",
            )
        waiting = sum(len(queued) - 1 for queued in self.lanes.values())
        if queue is not None and waiting >= limits.max_queued_per_connection:
            raise _too_many(
                f"{waiting} response.create messages wait on this connection (replica_limits.max_queued_per_connection)", "too_many_queued"
            )
        if queue is None:
            if len(self.lanes) >= limits.max_lanes_per_connection:
                raise _too_many(
                    f"At most {limits.max_lanes_per_connection} lanes (stream_id) may have responses running or queued on one "
                    "connection (replica_limits.max_lanes_per_connection)",
                    "too_many_lanes",
                )
            queue = self.lanes[event.lane] = collections.deque()
            worker = asyncio.create_task(self._run_lane(event.lane, queue))
            self.workers.add(worker)
            worker.add_done_callback(self.workers.discard)
        queue.append((event, size))

    async def _run_lane(self, lane: str | None, queue: collections.deque[tuple[CreateEvent, int]]) -> None:
        """The lane's responses in order; the lane is gone once its queue is empty (no await
        between the last check and the removal, so a new create starts a new worker)."""
        try:
            while queue:
                event, _ = queue[0]
                try:
                    await self._respond(event)
                except ClientGone:
                    raise
                except Exception:  # a bug of ours: the client still hears of it, the lane goes on
                    logger.exception("unexpected error")
                    await self._send(error_message(server_error("The server had an error while processing your request."), event.lane))
                self.budget.give(queue.popleft()[1], self.tenant.name)
        except ClientGone:
            pass
        finally:
            if self.lanes.get(lane) is queue:
                del self.lanes[lane]
            while queue:  # the connection went: what waited is dropped, its bytes given back
                self.budget.give(queue.popleft()[1], self.tenant.name)

    async def _respond(self, event: CreateEvent) -> None:
        metrics = self.context.metrics
        trace = RequestTrace(tenant=self.tenant.name)
        try:
            if event.error is not None:
                raise event.error
            assert event.request is not None  # a create without an error has its request
            turn = await begin_turn(event.request, self.context, self.tenant, self.responses, trace)
        except APIError as error:
            report_once(metrics, trace, "rejected", error.code)
            report_refusal(metrics, self.websocket.scope, error)
            self._forget_parent(event)
            await self._send_error(error, event.lane)
            return
        events = run_turn(
            turn,
            self.responses,
            self.settings.max_stream_duration_s,
            source=None if event.generate else PROMPT_ONLY,
            refusal_window_s=REFUSAL_WINDOW_S,
        )
        try:
            first = await first_events(events)
        except APIError as error:  # engines at capacity: refused before it started
            report_once(metrics, trace, "rejected", error.code)
            report_refusal(metrics, self.websocket.scope, error)
            await self._send_error(error, event.lane)
            return
        async with contextlib.aclosing(reported(prepended(first, events), turn, metrics)) as batches:
            async for batch in batches:
                for response_event in batch:
                    await self._send(event_message(response_event, event.lane, open_responses=self.open_responses))
        if turn.stream.continuable:
            self.responses.remember(event.lane, turn.stream.response, turn.input_items, turn.stream.tool_texts)
        elif turn.stream.response.status == "failed":
            self._forget_parent(event)

    def _forget_parent(self, event: CreateEvent) -> None:
        """A failed continuation evicts the response it continued from the connection."""
        if event.request is not None and event.request.previous_response_id is not None:
            self.responses.forget(event.request.previous_response_id)

    async def _send_error(self, error: APIError, lane: str | None) -> None:
        if error.status_code == 429:
            wait = min(float(error.headers.get("retry-after-ms", 1000)) / 1000, MAX_REFUSAL_PAUSE_S)
            self._read_after = max(self._read_after, asyncio.get_running_loop().time() + wait)
        await self._send(error_message(error, lane))

    async def _send(self, message: str) -> None:
        """One whole message; a client that takes nothing for the send timeout is dropped:
        the connection is ended (its responses aborted), not held by a reader that never reads."""
        try:
            async with self._sending, asyncio.timeout(self.limits.client_send_timeout_s):
                await self.websocket.send_text(message)
        except TimeoutError:
            logger.warning("WebSocket dropped: the client took nothing for %g s", self.limits.client_send_timeout_s)
            if self._receiver is not None and not self._dropped:
                self._dropped = True
                self._receiver.cancel()
            raise ClientGone from None
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:  # closed under us
            raise ClientGone from exc


def message_bytes(message: str | bytes) -> int:
    """A message's size in bytes, as a POST's body is measured (a text message's characters
    take up to four bytes each in UTF-8: counting characters let 4x the limit through)."""
    if isinstance(message, bytes):
        return len(message)
    return len(message.encode("utf-8", "surrogatepass"))

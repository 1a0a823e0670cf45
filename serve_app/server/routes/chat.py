"""`/v1/chat/completions`: a chat request served as the Responses request it stands for
(api/chat.py), on the same turn machinery, written back as a chat completion or chunks."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.responses import Response
from openai.types.responses import ResponseStreamEvent

from serve_app.api.chat import DONE, ChatChunks, chat_completion, parse_chat_request
from serve_app.api.errors import APIError
from serve_app.runtime.metrics import Metrics, RequestTrace
from serve_app.runtime.run import REFUSAL_WINDOW_S, run_turn
from serve_app.runtime.turn import Turn
from serve_app.server.auth import tenant_of
from serve_app.server.context import AppContext, app_context, tenant_state
from serve_app.server.routes.event_stream import EventStreamResponse
from serve_app.server.routes.responses import admit, begin_turn, first_events, prepended, read_request, release, reported, run_to_end
from serve_app.server.turn_headers import response_headers

router = APIRouter()


@router.post("/v1/chat/completions")
async def create_chat_completion(http_request: Request) -> Response:
    context = app_context(http_request)
    settings = context.settings
    trace = http_request.state.trace = RequestTrace(tenant=tenant_of(http_request.scope), endpoint="chat.completions")
    tenant = tenant_state(http_request)
    admission = await admit(tenant)  # before the body, as a response's
    try:
        chat, request = await read_request(http_request, parse_chat_request)
        try:
            turn = await begin_turn(request, context, tenant, tenant.responses, trace, admission, stop=chat.stop_sequences)
        except APIError as exc:  # named as the chat request's (an image part: `messages[i].content[j]`)
            raise chat.name_error(exc) from None
    except BaseException:
        await release(admission)
        raise
    events = run_turn(turn, tenant.responses, settings.max_stream_duration_s, refusal_window_s=REFUSAL_WINDOW_S)
    headers = response_headers(turn)
    if chat.stream:
        return await legacy_stream(events, turn, context, ChatChunks(chat.model, include_usage=chat.include_usage), headers)
    response = await run_to_end(turn, events, context.metrics)
    body = chat_completion(response, chat.model, with_logprobs=chat.logprobs)
    return Response(body.model_dump_json(exclude_unset=True), media_type="application/json", headers=headers)


async def legacy_stream(
    events: AsyncGenerator[list[ResponseStreamEvent], None], turn: Turn, context: AppContext, chunker: Frames, headers: dict[str, str]
) -> EventStreamResponse:
    """The streamed answer of a Chat Completions or Completions request; engines at capacity
    are a 503 before it starts, not a stream."""
    first = await first_events(events)
    settings = context.settings
    return EventStreamResponse(
        legacy_sse(prepended(first, events), turn, context.metrics, chunker),
        settings.sse_keepalive_s,
        headers=headers,
        send_timeout_s=settings.replica_limits.client_send_timeout_s,
    )


class Frames(Protocol):
    def frames(self, events: list[ResponseStreamEvent]) -> bytes: ...


async def legacy_sse(
    events: AsyncGenerator[list[ResponseStreamEvent], None], turn: Turn, metrics: Metrics, chunker: Frames
) -> AsyncGenerator[bytes, None]:
    """A Chat Completions or Completions stream: the frames of each batch of events (an
    `error` object after a response that failed, as OpenAI's streams do), then `[DONE]`."""
    async with contextlib.aclosing(reported(events, turn, metrics)) as batches:
        async for batch in batches:
            if frames := chunker.frames(batch):
                yield frames
    yield DONE

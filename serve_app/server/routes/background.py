"""Background responses over HTTP: start one (`POST /v1/responses` with `background: true`),
cancel it (`POST /v1/responses/{id}/cancel`), follow its events from a sequence number on
(`GET /v1/responses/{id}?stream=true&starting_after=N`). The run itself is
`serve_app.runtime.background`; every answer names the replica that gave it in `REPLICA_HEADER`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from fastapi import APIRouter, Request
from fastapi.responses import Response
from openai.types.responses import Response as APIResponse
from starlette.datastructures import QueryParams

from serve_app.api.errors import invalid_request, response_not_found, server_full
from serve_app.api.sse import response_json
from serve_app.runtime.background import BackgroundRuns
from serve_app.runtime.metrics import report_response
from serve_app.runtime.run import run_turn
from serve_app.runtime.turn import Turn
from serve_app.server.context import AppContext, app_context, tenant_state
from serve_app.server.routes.event_stream import EventStreamResponse, wants_open_responses
from serve_app.server.tenants import TenantState
from serve_app.server.turn_headers import response_headers
from serve_app.state.quotas import Admission

router = APIRouter()

REPLICA_HEADER = "x-responses-serve-replica"


def _headers(background: BackgroundRuns) -> dict[str, str]:
    return {REPLICA_HEADER: background.replica_id}


def check_background_room(context: AppContext) -> None:
    """A 503 when this replica already runs `replica_limits.max_background_runs` background
    responses (all tenants'); a tenant's own `max_background` is its quota (a 429)."""
    limit = context.settings.replica_limits.max_background_runs
    if sum(tenant.background.running for tenant in context.tenants.values()) >= limit:
        raise server_full(
            f"This server runs as many background responses as it takes ({limit}, replica_limits.max_background_runs). Retry shortly.",
            code="too_many_background_runs",
            param="background",
        )


async def start_background(turn: Turn, context: AppContext, tenant: TenantState, *, open_responses: bool = False) -> Response:
    """Start `turn` as a background run of `tenant` on this replica; answer at once (the
    response, `in_progress`) or, with `stream`, follow its events (a client that goes away
    stops following, not the run)."""
    background = tenant.background
    responses = tenant.responses

    async def finish(response: APIResponse) -> None:
        # The request is counted when its run ends, like a stream when it closes.
        report_response(context.metrics, turn.trace, response)
        # run_turn stored it if it is continuable (and the store answered); a background
        # response is retrievable whatever its end (failed, cancelled).
        if not turn.stream.continuable or turn.store_error is not None:
            await responses.save(response, turn.input_items, turn.stream.tool_texts)

    try:
        check_background_room(context)  # again: others may have started while this one rendered
        snapshot = await background.start(
            turn.stream, run_turn(turn, responses, context.settings.max_stream_duration_s), turn.input_items, finish
        )
    except BaseException:  # no run: its place within the tenant's quotas goes back now
        if turn.admission is not None:
            await turn.admission.release()
        raise
    headers = {**_headers(background), **response_headers(turn)}
    if turn.request.stream:
        return EventStreamResponse(
            background.follow(snapshot.id, -1),
            context.settings.sse_keepalive_s,
            headers=headers,
            send_timeout_s=context.settings.replica_limits.client_send_timeout_s,
            open_responses=open_responses,
        )
    return Response(response_json(snapshot), media_type="application/json", headers=headers)


def _event_stream(frames: AsyncGenerator[bytes, None], background: BackgroundRuns, request: Request) -> EventStreamResponse:
    settings = app_context(request).settings
    return EventStreamResponse(
        frames,
        settings.sse_keepalive_s,
        headers=_headers(background),
        send_timeout_s=settings.replica_limits.client_send_timeout_s,
        open_responses=wants_open_responses(request),
    )


def wants_stream(query: QueryParams) -> bool:
    value = query.get("stream", "false").lower()
    if value not in ("true", "false"):
        raise invalid_request(f"Invalid 'stream': '{value}'. It must be true or false.", param="stream")
    return value == "true"


async def follow_response(response_id: str, request: Request, admission: Admission | None = None) -> EventStreamResponse:
    """`GET /v1/responses/{id}?stream=true[&starting_after=N]`: the events after N, live.
    `admission`: the follower's place among its tenant's concurrent requests, given back when
    it leaves (or here, if it is refused)."""
    try:
        background = tenant_state(request).background
        text = request.query_params.get("starting_after", "-1")
        try:
            starting_after = int(text)
        except ValueError:
            starting_after = -2
        if starting_after < -1:
            raise invalid_request(f"Invalid 'starting_after': '{text}'. It must be an integer, -1 or more.", param="starting_after")
        response = await background.background_response(response_id)
        if not response.background:
            raise invalid_request(
                f"Response '{response_id}' was not created with 'background': true; only background responses can be streamed.",
                param="stream",
            )
    except BaseException:
        if admission is not None:
            await admission.release()
        raise
    return _event_stream(_admitted(background.follow(response_id, starting_after), admission), background, request)


async def _admitted(frames: AsyncGenerator[bytes, None], admission: Admission | None) -> AsyncGenerator[bytes, None]:
    """`frames`, the place of `admission` held until they end or their client leaves."""
    try:
        async with contextlib.aclosing(frames):
            async for data in frames:
                yield data
    finally:
        if admission is not None:
            await admission.release()


async def current_response(response_id: str, request: Request) -> APIResponse:
    """The stored response as it is now (a background one whose replica is gone: failed)."""
    tenant = tenant_state(request)
    background = tenant.background
    turn = await tenant.responses.get(response_id)
    if turn is None:
        raise response_not_found(response_id)
    return await background.refresh(turn.response)


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request) -> Response:
    background = tenant_state(request).background
    response = await background.cancel(response_id)
    return Response(response_json(response), media_type="application/json", headers=_headers(background))

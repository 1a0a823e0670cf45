"""`/v1/responses`: create, compact, retrieve, delete, list input items."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response
from openai.types.responses import Response as OpenAIResponse
from openai.types.responses import ResponseStreamEvent

from serve_app.api.errors import APIError, invalid_request, model_not_found, model_unavailable, response_not_found, server_error
from serve_app.api.limits import RequestLimits
from serve_app.api.request import ResponsesRequest, parse_compact_request, parse_request
from serve_app.api.sse import encode_events, response_json
from serve_app.runtime.admission import ByteBudget
from serve_app.runtime.compaction import KEEP_USER_CHARS, compacted_window, compaction_object, sealed_item, summary_request
from serve_app.runtime.metrics import Metrics, RequestTrace, report_once, report_response
from serve_app.runtime.offload import parse_body_off_loop
from serve_app.runtime.run import REFUSAL_WINDOW_S, run_turn, start_turn, summarize
from serve_app.runtime.turn import ServedModel, Turn
from serve_app.runtime.vector_stores import check_file_search
from serve_app.server.auth import tenant_of
from serve_app.server.context import AppContext, app_context, tenant_state
from serve_app.server.routes.background import (
    check_background_room,
    current_response,
    follow_response,
    start_background,
    wants_stream,
)
from serve_app.server.routes.event_stream import EventStreamResponse, wants_open_responses
from serve_app.server.tenants import TenantState
from serve_app.server.turn_headers import response_headers
from serve_app.state import ResponseStore
from serve_app.state.quotas import Admission

logger = logging.getLogger(__name__)

router = APIRouter()

T = TypeVar("T")


def _json(data: str | bytes, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(data, status_code=status_code, media_type="application/json", headers=headers)


@router.post("/v1/responses")
async def create_response(http_request: Request) -> Response:
    context = app_context(http_request)
    settings = context.settings
    # Reported when the request ends (metrics).
    trace = http_request.state.trace = RequestTrace(tenant=tenant_of(http_request.scope))
    tenant = tenant_state(http_request)
    admission = await admit(tenant)  # before the body: a tenant at its limits sends none
    try:
        request = await read_request(http_request, parse_request)
        if request.background:
            check_background_room(context)  # before any work: the replica's bound, not the tenant's
        turn = await begin_turn(request, context, tenant, tenant.responses, trace, admission)
    except BaseException:
        await release(admission)
        raise
    if request.background:
        return await start_background(turn, context, tenant, open_responses=wants_open_responses(http_request))
    events = run_turn(turn, tenant.responses, settings.max_stream_duration_s, refusal_window_s=REFUSAL_WINDOW_S)
    headers = response_headers(turn)
    if request.stream:
        # The first events before the response starts: engines at capacity are a 503, not a stream.
        first = await first_events(events)
        return EventStreamResponse(
            _sse(prepended(first, events), turn, context.metrics),
            settings.sse_keepalive_s,
            headers=headers,
            send_timeout_s=settings.replica_limits.client_send_timeout_s,
            open_responses=wants_open_responses(http_request),
        )
    response = await run_to_end(turn, events, context.metrics)
    # The same serialization as the terminal event of a stream: one source of truth.
    return _json(response_json(response), headers=headers)


@router.post("/v1/responses/compact")
async def compact_response(http_request: Request) -> Response:
    """The conversation of `input` and/or `previous_response_id` as the model summarised it:
    the latest user messages and a `compaction` item sealing the summary for this tenant."""
    context = app_context(http_request)
    trace = http_request.state.trace = RequestTrace(tenant=tenant_of(http_request.scope), endpoint="responses.compact")
    tenant = tenant_state(http_request)
    admission = await admit(tenant)  # before the body, as a response's
    try:
        compact = await read_request(http_request, parse_compact_request)
        model = await served_model(context, compact.model, trace)
        asked = summary_request(
            compact.model,
            compact.input,
            instructions=compact.instructions,
            previous_response_id=compact.previous_response_id,
            prompt_cache_key=compact.prompt_cache_key,
        )
        summary = await summarize(
            asked,
            model,
            tenant.responses,
            tenant.conversations,
            tenant.cipher,
            tenant=tenant.name,
            cache_salt=tenant.cache_salt,
            files=tenant.file_inputs,
        )
        if admission is not None and summary.usage is not None:
            await admission.charge_tokens(summary.usage.total_tokens)
    finally:
        await release(admission)
    item = sealed_item(summary.text, KEEP_USER_CHARS, tenant.cipher)
    body = compaction_object(compacted_window(summary.window, item, KEEP_USER_CHARS), summary.usage)
    if summary.usage is not None:
        trace.prompt_tokens, trace.output_tokens = summary.usage.input_tokens, summary.usage.output_tokens
    report_once(context.metrics, trace, "completed")
    logger.info("compaction %s: model=%s items=%d summary_chars=%d", body["id"], model.name, len(summary.window), len(summary.text))
    return _json(json.dumps(body, separators=(",", ":")))


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request) -> Response:
    if wants_stream(request.query_params):  # a background response's events, live
        # A follower holds a place among the tenant's concurrent requests, as a stream does.
        admission = await admit(tenant_state(request), follower=True)
        return await follow_response(response_id, request, admission)
    return _json(response_json(await current_response(response_id, request)))


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> Response:
    if not await tenant_state(request).background.delete(response_id):
        raise response_not_found(response_id)
    # What the OpenAI API answers (the SDK's `responses.delete` returns None and ignores it).
    return _json(json.dumps({"id": response_id, "object": "response", "deleted": True}))


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(response_id: str, request: Request) -> Response:
    # `include` is accepted and needs nothing: stored items are whole.
    query = request.query_params
    after, order, limit_text = query.get("after"), query.get("order", "desc"), query.get("limit", "20")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= 100:
        raise invalid_request(f"Invalid 'limit': '{limit_text}'. It must be an integer between 1 and 100.", param="limit")
    limit = int(limit_text)
    if order not in ("asc", "desc"):
        raise invalid_request(f"Invalid 'order': '{order}'. It must be 'asc' or 'desc'.", param="order")
    items = await tenant_state(request).responses.input_items(response_id)
    if items is None:
        raise response_not_found(response_id)
    if order == "desc":
        items.reverse()
    start = 0
    if after is not None:
        ids = [item.id for item in items]
        if after not in ids:
            raise invalid_request(f"No input item with id '{after}' in response '{response_id}'.", param="after")
        start = ids.index(after) + 1
    page = items[start : start + limit]
    body = {
        "object": "list",
        "data": [item.model_dump(mode="json", exclude_none=True) for item in page],
        "first_id": page[0].id if page else None,
        "last_id": page[-1].id if page else None,
        "has_more": start + limit < len(items),
    }
    return _json(json.dumps(body, separators=(",", ":")))


async def admit(tenant: TenantState, *, background: bool = False, follower: bool = False) -> Admission | None:
    """A place for one request of `tenant` within its quotas (None: it has none), or a 429
    `RateLimited` with its `x-ratelimit-*` headers. An HTTP request takes it from its headers,
    before its body is read, so a tenant at its limits holds none of the replica's request
    bytes; whoever takes it releases it (`release`) unless a turn took it over. A `follower`
    of a background response takes only its place among the concurrent requests."""
    if tenant.quota is None:
        return None
    return await tenant.quota.admit(background=background, follower=follower)


async def release(admission: Admission | None) -> None:
    if admission is not None:
        await admission.release()


async def begin_turn(
    request: ResponsesRequest,
    context: AppContext,
    tenant: TenantState,
    responses: ResponseStore,
    trace: RequestTrace,
    admission: Admission | None = None,
    raw_prompt: Callable[[ServedModel], list[int]] | None = None,
    stop: Sequence[str] = (),
    prompt_logprobs: int | None = None,
) -> Turn:
    """`tenant`'s turn of the served model for `request` (history read from `responses`, the
    tenant's own or a view of them), logged; a 404 for a model not served, a 503 for one
    whose engine is down. `admission`: the request's, taken before its body was read (the
    turn takes it over; released here if the turn does not start); None: taken here (a
    WebSocket message, as its response starts). `raw_prompt`: the prompt's tokens for the
    model, instead of a rendered conversation (`/v1/completions`). `stop`: stop sequences
    (Chat Completions and Completions). `prompt_logprobs`: the prompt's logprobs asked of
    the engine (`/v1/completions` with `echo`)."""
    try:
        model = await served_model(context, request.model, trace)
        prompt = raw_prompt(model) if raw_prompt is not None else None
        # Within the tenant's quotas (or a 429), then counted: the prompt's tokens now, the output's
        # as `run_turn` produces them; `run_turn` releases the admission when the turn ends.
        request, unavailable_tools = await served_request(request, context, tenant)  # nothing charged yet
        if admission is None:
            admission = await admit(tenant, background=request.background)
        elif request.background:
            await admission.lease_background()
    except BaseException:
        await release(admission)
        raise
    try:
        turn = await start_turn(
            request,
            model,
            responses,
            tenant.conversations,
            tenant.cipher,
            trace,
            tenant.service_tiers,
            context.server_tools,
            tenant.name,
            tenant.cache_salt,
            prompt,
            stop=stop,
            prompt_logprobs=prompt_logprobs,
            files=tenant.file_inputs,
        )
        if admission is not None:  # and a `context_management` summary written first
            await admission.charge_tokens(
                len(turn.prompt) + turn.generation.image_tokens + (turn.compaction_usage.total_tokens if turn.compaction_usage else 0)
            )
    except BaseException:
        await release(admission)
        raise
    turn.admission, turn.unavailable_tools = admission, unavailable_tools
    if unavailable_tools:
        logger.info("response %s: not offered, this server does not run them: %s", turn.generation.request_id, ", ".join(unavailable_tools))
    logger.info(
        "response %s: model=%s stream=%s prompt_tokens=%d max_tokens=%d render_ms=%.1f reused_tokens=%d%s",
        turn.generation.request_id,
        model.name,
        request.stream,
        len(turn.prompt),
        turn.generation.max_tokens,
        (trace.render_s or 0) * 1e3,
        trace.prompt_reused_tokens,
        f" truncated_items={trace.truncated_items}" if trace.truncated_items else "",
    )
    return turn


async def served_request(request: ResponsesRequest, context: AppContext, tenant: TenantState) -> tuple[ResponsesRequest, list[str]]:
    """`request` as this server serves it to `tenant` (a response, or its `input_tokens` count):
    the hosted tools it does not run left out (their types, second), 400s for tools it cannot
    serve before anything is read or connected to (`ServerToolRuntime.admit`), and a 404 for a
    `file_search` store that is not the tenant's (`check_file_search`)."""
    served, unavailable_tools = context.server_tools.admit(request)
    await check_file_search(request, tenant.vector_stores)
    return served, unavailable_tools


async def served_model(context: AppContext, name: str, trace: RequestTrace) -> ServedModel:
    """The served model `name`: a 404 for a model not served, a 503 for one whose engine is down."""
    model = context.served.get(name)
    if model is None:
        raise model_not_found(name)
    trace.model = model.name
    if model.unavailable is not None and (why := await model.unavailable(model.name)):
        raise model_unavailable(model.name, why.reason)
    return model


async def run_to_end(turn: Turn, events: AsyncGenerator[list[ResponseStreamEvent], None], metrics: Metrics) -> OpenAIResponse:
    """A turn that is not streamed, run to its end: its response, or the error that ended it
    (a 400 for a prompt the engine refused, a 503 for an engine or store failure)."""
    try:
        async with contextlib.aclosing(events):
            async for _ in events:
                pass
    except asyncio.CancelledError:  # Serve cancels the request when its client goes away
        report_once(metrics, turn.trace, "cancelled")
        raise
    _finished(turn, metrics)
    if turn.store_error is not None:
        raise turn.store_error
    response = turn.stream.response
    if response.status == "failed":
        assert response.error is not None  # a failed response says why
        if response.error.code == "invalid_prompt":  # the engine refused the request itself
            raise invalid_request(response.error.message, code="invalid_prompt")
        raise server_error(response.error.message, status_code=503)
    return response


def _finished(turn: Turn, metrics: Metrics) -> None:
    """Log and report a response that ran to its end."""
    response = turn.stream.response
    usage = response.usage
    logger.info(
        "response %s: %s output_tokens=%d in %.3fs",
        response.id,
        response.status,
        usage.output_tokens if usage else 0,
        time.perf_counter() - turn.trace.started,
    )
    report_response(metrics, turn.trace, response)


async def first_events(events: AsyncGenerator[list[ResponseStreamEvent], None]) -> list[ResponseStreamEvent]:
    """The first events of a turn; what refuses it before it starts (an `APIError`) is raised
    here, and `events` closed."""
    try:
        return await anext(events)
    except BaseException:
        await events.aclose()
        raise


async def prepended(
    first: list[ResponseStreamEvent], rest: AsyncGenerator[list[ResponseStreamEvent], None]
) -> AsyncGenerator[list[ResponseStreamEvent], None]:
    async with contextlib.aclosing(rest):
        yield first
        async for events in rest:
            yield events


async def _sse(events: AsyncGenerator[list[ResponseStreamEvent], None], turn: Turn, metrics: Metrics) -> AsyncGenerator[bytes, None]:
    async with contextlib.aclosing(reported(events, turn, metrics)) as batches:
        async for batch_events in batches:
            yield encode_events(batch_events)


async def reported(
    events: AsyncGenerator[list[ResponseStreamEvent], None], turn: Turn, metrics: Metrics
) -> AsyncGenerator[list[ResponseStreamEvent], None]:
    """A streamed turn's `events`, counted as an open stream while they flow, then logged and
    reported once: finished, or cancelled when its client went away."""
    model = turn.model.name
    metrics.stream_opened(model)
    try:
        async with contextlib.aclosing(events):
            async for batch_events in events:
                yield batch_events
    finally:
        metrics.stream_closed(model)
        if turn.stream.finished:
            _finished(turn, metrics)
        else:
            logger.info("response %s: client went away, generation aborted", turn.stream.response.id)
            report_once(metrics, turn.trace, "cancelled")


async def read_request(http_request: Request, parse: Callable[[bytes, RequestLimits], T]) -> T:
    """The request's body, read within the size limit and parsed by `parse(body, limits)`;
    a big body is parsed in a worker thread (runtime/offload.py). Its bytes count against the
    replica's budget, and against its tenant's share of it, while it is read and parsed
    (runtime/admission.py)."""
    context = app_context(http_request)
    settings = context.settings
    budget = context.request_bytes
    tenant = tenant_of(http_request.scope)
    held = [0]
    try:
        try:
            async with asyncio.timeout(settings.replica_limits.body_read_timeout_s):
                body = await read_body(http_request, settings.max_request_bytes, budget, held)
        except TimeoutError:
            raise APIError(
                f"The request body did not arrive whole within {settings.replica_limits.body_read_timeout_s:g} s "
                "(replica_limits.body_read_timeout_s).",
                status_code=408,
                code="request_timeout",
            ) from None
        return await parse_body_off_loop(body, functools.partial(_parse, parse=parse, limits=settings.request_limits))
    finally:
        budget.give(held[0], tenant)


def _parse(body: bytes, *, parse: Callable[[bytes, RequestLimits], T], limits: RequestLimits) -> T:
    return parse(body, limits)


async def read_body(request: Request, limit: int, budget: ByteBudget | None = None, held: list[int] | None = None) -> bytes:
    """The body, at most `limit` bytes (else a 413); each chunk taken from `budget` for the
    request's tenant as it comes (a 503 when the replica's is spent, a 429 when the tenant's
    share is), the bytes taken added to `held[0]` for the caller to give back."""
    declared = request.headers.get("content-length")
    too_large = APIError(f"The request body is larger than this server accepts ({limit} bytes).", status_code=413, code="request_too_large")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        if budget is not None and held is not None:
            budget.take(len(chunk), tenant_of(request.scope))
            held[0] += len(chunk)
        chunks.append(chunk)
    return b"".join(chunks)

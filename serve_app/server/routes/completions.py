"""`/v1/completions`: a raw prompt's continuation (api/completions.py), for models whose
config allows raw prompts, on the same turn machinery as every response."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from serve_app.api.completions import CompletionChunks, CompletionRequest, parse_completion_request, text_completion
from serve_app.api.errors import invalid_request
from serve_app.runtime.metrics import RequestTrace
from serve_app.runtime.run import REFUSAL_WINDOW_S, run_turn
from serve_app.runtime.turn import ServedModel
from serve_app.server.auth import tenant_of
from serve_app.server.context import app_context, tenant_state
from serve_app.server.routes.chat import legacy_stream
from serve_app.server.routes.responses import admit, begin_turn, read_request, release, run_to_end
from serve_app.server.turn_headers import response_headers

router = APIRouter()


@router.post("/v1/completions")
async def create_completion(http_request: Request) -> Response:
    context = app_context(http_request)
    settings = context.settings
    trace = http_request.state.trace = RequestTrace(tenant=tenant_of(http_request.scope), endpoint="completions")
    tenant = tenant_state(http_request)
    admission = await admit(tenant)  # before the body, as a response's
    try:
        completion = await read_request(http_request, parse_completion_request)
        turn = await begin_turn(
            completion.settings(),
            context,
            tenant,
            tenant.responses,
            trace,
            admission,
            raw_prompt=lambda model: _prompt(completion, model),
            stop=completion.stop_sequences,
        )
    except BaseException:
        await release(admission)
        raise
    events = run_turn(turn, tenant.responses, settings.max_stream_duration_s, refusal_window_s=REFUSAL_WINDOW_S)
    headers = response_headers(turn)
    if completion.stream:
        return await legacy_stream(events, turn, context, CompletionChunks(include_usage=completion.include_usage), headers)
    response = await run_to_end(turn, events, context.metrics)
    return Response(text_completion(response).model_dump_json(exclude_unset=True), media_type="application/json", headers=headers)


def _prompt(completion: CompletionRequest, model: ServedModel) -> list[int]:
    """The prompt's tokens for `model`: a 400 unless its config allows raw prompts."""
    if not model.raw_prompts:
        raise invalid_request(
            f"Model '{model.name}' does not take raw prompts (its config's `raw_prompts` is off): use /v1/chat/completions or /v1/responses.",
            param="model",
        )
    text = completion.text
    if text is None:
        return completion.token_ids or []
    return model.family.encode_raw(text)

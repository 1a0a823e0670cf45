"""`/v1/completions`: a raw prompt's continuation (api/completions.py), for models whose
config allows raw prompts, on the same turn machinery as every response."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import Response

from serve_app.api.completions import CompletionChunks, CompletionRequest, Echo, LegacyToken, parse_completion_request, text_completion
from serve_app.api.errors import invalid_request
from serve_app.core.logprobs import LogprobFormatter, token_string
from serve_app.runtime.metrics import RequestTrace
from serve_app.runtime.run import REFUSAL_WINDOW_S, run_turn
from serve_app.runtime.turn import ServedModel, Turn
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
            prompt_logprobs=completion.logprobs if completion.echo else None,
        )
    except BaseException:
        await release(admission)
        raise
    events = run_turn(turn, tenant.responses, settings.max_stream_duration_s, refusal_window_s=REFUSAL_WINDOW_S)
    headers = response_headers(turn)
    with_logprobs = completion.logprobs is not None

    def echo() -> Echo:
        return _echo(completion, turn, with_logprobs)

    if completion.stream:
        chunker = CompletionChunks(completion.include_usage, with_logprobs, echo if completion.echo else None)
        return await legacy_stream(events, turn, context, chunker, headers)
    response = await run_to_end(turn, events, context.metrics)
    body = text_completion(response, with_logprobs, echo() if completion.echo else None)
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json", headers=headers)


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


def _echo(completion: CompletionRequest, turn: Turn, with_logprobs: bool) -> Echo:
    """The prompt as `echo` returns it: its text (token ids: the text they write), and with
    logprobs, its tokens' as the engine reported them (once its first tokens are in)."""
    family = turn.model.family
    text = completion.text
    if text is None:
        text = b"".join(family.token_bytes(token) for token in turn.prompt if family.writes_text(token)).decode("utf-8", "replace")
    if not with_logprobs:
        return Echo(text)
    reported = turn.stream.prompt_logprobs or [None] * len(turn.prompt)
    formatter = LogprobFormatter(family)
    tokens: list[LegacyToken] = []
    for token, logprobs in zip(turn.prompt, reported):
        if logprobs is None:  # the first token: nothing predicts it
            tokens.append((token_string(family.token_bytes(token)), None, None))
        else:
            entry = formatter.logprob(token, logprobs)
            tokens.append((entry.token, entry.logprob, {top.token: top.logprob for top in entry.top_logprobs}))
    return Echo(text, tokens)

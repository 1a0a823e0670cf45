"""`POST /v1/responses/input_tokens` (the SDK's `client.responses.input_tokens.count(...)`).

The body is validated as a create request and rendered by the same code, so the count is
exactly the number of prompt tokens the engine would get for that request (the history of
`previous_response_id`, opened encrypted reasoning, the model's own template or harmony
rendering included). Nothing is generated or stored. A prompt longer than the model's
context is still counted: telling that is what the endpoint is for.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response
from openai.types.responses.input_token_count_response import InputTokenCountResponse

from .protocol.request import ResponsesRequest, parse_request


def input_tokens_router(
    render: Callable[[ResponsesRequest], tuple[Any, Any, list[int]]],
    read_body: Callable[[Request], Awaitable[bytes]],
) -> APIRouter:
    """`render(request)` -> (model, history, prompt tokens), as for `POST /v1/responses`."""
    router = APIRouter()

    @router.post("/v1/responses/input_tokens")
    async def count_input_tokens(http_request: Request) -> Response:
        request = parse_request(await read_body(http_request))
        _, _, prompt = render(request)
        count = InputTokenCountResponse(object="response.input_tokens", input_tokens=len(prompt))
        return Response(count.model_dump_json(), media_type="application/json")

    return router

"""`POST /v1/responses/input_tokens` (the SDK's `client.responses.input_tokens.count(...)`).

The body is validated and served as a create request (`served_request`: the same 400s and
404s, the hosted tools this server does not run left out) and rendered by the same function
(`render_turn`), so the count is exactly the number of prompt tokens of the response's first
engine request (the history of `previous_response_id` or `conversation`, opened encrypted
reasoning, the server-side tools the model is offered — `file_search`, `web_search`,
`code_interpreter`, an MCP server's tools listed earlier in the conversation —, the model's
own template or harmony rendering included). Nothing is generated or stored, and no tool
server is contacted: an MCP server not listed yet in the conversation, whose listing a
response makes before its first generation, is counted without its tools, and neither are
calls the input approves (they run before the first generation). Those are requests to
servers of the client's choosing, with their own time: a count is not the place for them.
A prompt longer than the model's context is still counted: telling that is what the
endpoint is for. The rendering is work: each call counts a request of the tenant's
`requests_per_minute`, and the tokens it counted against its `tokens_per_minute` as a
response's prompt would be (a 429, before the body is read, when none are left).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from openai.types.responses.input_token_count_response import InputTokenCountResponse

from serve_app.api.errors import model_not_found
from serve_app.api.request import parse_request
from serve_app.runtime.run import render_turn
from serve_app.server.context import app_context, tenant_state
from serve_app.server.rate_headers import COUNTED_TOKENS
from serve_app.server.routes.responses import read_request, served_request

router = APIRouter()


@router.post("/v1/responses/input_tokens", dependencies=COUNTED_TOKENS)
async def count_input_tokens(http_request: Request) -> Response:
    request = await read_request(http_request, parse_request)
    context = app_context(http_request)
    model = context.served.get(request.model)
    if model is None:
        raise model_not_found(request.model)
    tenant = tenant_state(http_request)
    request, _ = await served_request(request, context, tenant)  # as a response would be refused
    rendered = await render_turn(
        request, model, tenant.responses, tenant.conversations, tenant.cipher, context.server_tools, tenant.name, files=tenant.file_inputs
    )
    if rendered.tools is not None:  # made for the count only: no call was made, none will be
        await rendered.tools.aclose()
    if tenant.quota is not None:  # counted as a response's prompt is: rendering them was the work
        await tenant.quota.charge(tokens_=rendered.input_tokens)
    count = InputTokenCountResponse(object="response.input_tokens", input_tokens=rendered.input_tokens)
    return Response(count.model_dump_json(), media_type="application/json")

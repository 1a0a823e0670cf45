"""The headers of every answer to a turn (`POST /v1/responses`, streamed, background or not)."""

from __future__ import annotations

from serve_app.runtime.turn import Turn

UNAVAILABLE_TOOLS_HEADER = "x-unavailable-tools"


def response_headers(turn: Turn) -> dict[str, str]:
    """The headers of an answer to a turn: the tenant's rate limits (`x-ratelimit-*`) and the
    types of the request's tools this server does not run (left out of the response)."""
    headers = dict(turn.admission.headers) if turn.admission is not None else {}
    if turn.unavailable_tools:
        headers[UNAVAILABLE_TOOLS_HEADER] = ", ".join(dict.fromkeys(turn.unavailable_tools))
    return headers

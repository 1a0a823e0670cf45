"""The headers of every answer to a turn (`POST /v1/responses`, streamed, background or not)."""

from __future__ import annotations

from serve_app.runtime.turn import Turn

UNAVAILABLE_TOOLS_HEADER = "x-unavailable-tools"
MAX_NAMED_TOOLS = 16  # types of at most 64 characters: the header stays ~1 KB, within any proxy's buffers


def response_headers(turn: Turn) -> dict[str, str]:
    """The headers of an answer to a turn: the tenant's rate limits (`x-ratelimit-*`) and the
    types of the request's tools this server does not run (left out of the response)."""
    headers = dict(turn.admission.headers) if turn.admission is not None else {}
    if turn.unavailable_tools:
        names = list(dict.fromkeys(turn.unavailable_tools))
        shown = names[:MAX_NAMED_TOOLS] + ([f"and {len(names) - MAX_NAMED_TOOLS} more"] if len(names) > MAX_NAMED_TOOLS else [])
        headers[UNAVAILABLE_TOOLS_HEADER] = ", ".join(shown)
    return headers

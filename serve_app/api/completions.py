"""`POST /v1/completions`: a raw prompt in, its continuation out (evaluation harnesses).

Served only for models whose config sets `raw_prompts` (a raw prompt bypasses the chat
template or harmony, so its caller writes the conversation's structure itself; the prompt
is still tokenized as text: a spelled special token is its characters). The sampling
settings travel as a `ResponsesRequest` (`CompletionRequest.settings`), so the engine
request is built as for every response; the answer is a `text_completion`.
"""

from __future__ import annotations

import json
from typing import Any

from openai.types import Completion
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import Field

from serve_app.api.chat import LegacySampling, chat_usage, error_frame, stream_error
from serve_app.api.errors import invalid_request
from serve_app.api.limits import DEFAULT_LIMITS, RequestLimits
from serve_app.api.request import ResponsesRequest, parse_body

OPENAI_DEFAULT_MAX_TOKENS = 16  # the legacy endpoint's default, as OpenAI's


class CompletionRequest(LegacySampling):
    prompt: str | list[str] | list[int]
    max_tokens: int | None = Field(default=OPENAI_DEFAULT_MAX_TOKENS, ge=1)
    best_of: int | None = Field(default=None, ge=1)
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5)

    def refuse_unsupported(self) -> None:
        for param, unsupported in [
            ("n", self.n != 1),
            ("best_of", self.best_of not in (None, 1)),
            ("echo", self.echo),
            ("suffix", self.suffix is not None),
            ("logprobs", self.logprobs is not None),
            ("logit_bias", bool(self.logit_bias)),
        ]:
            if unsupported:
                raise invalid_request(f"'{param}' is not supported by this server's completions.", param=param)
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) != 1:
            raise invalid_request("One prompt per request: send the others apart.", param="prompt")
        if not self.prompt or self.prompt == [""]:
            raise invalid_request("'prompt' must not be empty.", param="prompt")

    @property
    def text(self) -> str | None:
        """The prompt as text (None: given as token ids)."""
        if isinstance(self.prompt, str):
            return self.prompt
        first = self.prompt[0]
        return first if isinstance(first, str) else None

    @property
    def token_ids(self) -> list[int] | None:
        return [int(token) for token in self.prompt] if self.text is None else None

    def settings(self) -> ResponsesRequest:
        """The sampling settings as the engine request takes them."""
        return ResponsesRequest(
            model=self.model,
            input="(a raw prompt)",
            max_output_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
            user=self.user,
            store=False,
            stream=self.stream,
        )


def parse_completion_request(body: bytes | dict[str, Any], limits: RequestLimits = DEFAULT_LIMITS) -> CompletionRequest:
    request = parse_body(body, CompletionRequest, limits)
    request.refuse_unsupported()
    return request


def _completion(response: Response, text: str, finish: str | None, with_usage: bool) -> dict[str, Any]:
    """A `text_completion` (a streamed one's `finish_reason` is null until its end, which the
    SDK's type, written for whole completions, does not allow: plain JSON)."""
    usage = chat_usage(response) if with_usage else None
    return {
        "id": "cmpl-" + response.id.removeprefix("resp_"),
        "object": "text_completion",
        "created": int(response.created_at),
        "model": response.model,
        "choices": [] if finish == "usage" else [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        **({"usage": usage.model_dump(mode="json", exclude_none=True)} if usage is not None else {}),
    }


def text_completion(response: Response) -> Completion:
    text = "".join(part.text for item in response.output if item.type == "message" for part in item.content if part.type == "output_text")
    return Completion.model_validate(_completion(response, text, "length" if response.status == "incomplete" else "stop", with_usage=True))


class CompletionChunks:
    """A raw completion's events as streamed `text_completion`s: each text delta, then the
    finish reason (and, asked for, the usage with no choices)."""

    def __init__(self, include_usage: bool) -> None:
        self.include_usage = include_usage
        self.failed: dict[str, Any] | None = None

    def chunks(self, events: list[ResponseStreamEvent]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in events:
            if event.type == "response.output_text.delta":
                out.append(_completion(self._response, event.delta, None, with_usage=False))
            elif event.type == "response.created":
                self._response = event.response
            elif event.type in ("response.completed", "response.incomplete"):
                finish = "length" if event.type == "response.incomplete" else "stop"
                out.append(_completion(event.response, "", finish, with_usage=False))
                if self.include_usage:
                    out.append(_completion(event.response, "", "usage", with_usage=True))
            elif event.type == "response.failed":
                self.failed = stream_error(event.response)
        return out

    def frames(self, events: list[ResponseStreamEvent]) -> bytes:
        """The SSE frames of `events`: their chunks, and the error of a response that failed."""
        frames = b"".join(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n" for chunk in self.chunks(events))
        return frames + error_frame(self.failed) if self.failed is not None else frames

    _response: Response  # as created: the id and model the chunks carry

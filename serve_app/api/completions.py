"""`POST /v1/completions`: a raw prompt in, its continuation out (evaluation harnesses).

Served only for models whose config sets `raw_prompts` (a raw prompt bypasses the chat
template or harmony, so its caller writes the conversation's structure itself; the prompt
is still tokenized as text: a spelled special token is its characters). The sampling
settings travel as a `ResponsesRequest` (`CompletionRequest.settings`), so the engine
request is built as for every response; the answer is a `text_completion`. `stop` ends the
text (serve_app/core/stop.py); `logprobs` (0-5 alternatives) are written in the legacy shape
(`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`); `echo` returns the prompt before
the completion, with `logprobs` the prompt's own, as the engine computes them (the first
token's is null).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import Field

from serve_app.api.chat import LegacySampling, chat_usage, error_frame, merged_deltas, stream_error
from serve_app.api.errors import invalid_request
from serve_app.api.limits import DEFAULT_LIMITS, RequestLimits
from serve_app.api.request import ResponsesRequest, parse_body

OPENAI_DEFAULT_MAX_TOKENS = 16  # the legacy endpoint's default, as OpenAI's


# A token id: what engines take (vLLM refuses ids past the model's vocabulary with a 400).
TokenId = Annotated[int, Field(ge=0, lt=2**31)]


class CompletionRequest(LegacySampling):
    prompt: str | list[str] | list[TokenId]
    max_tokens: int | None = Field(default=OPENAI_DEFAULT_MAX_TOKENS, ge=1)
    best_of: int | None = Field(default=None, ge=1)
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5)

    def refuse_unsupported(self) -> None:
        for param, unsupported in [
            ("n", self.n != 1),
            ("best_of", self.best_of not in (None, 1)),
            ("suffix", self.suffix is not None),
            ("logit_bias", bool(self.logit_bias)),
        ]:
            if unsupported:
                raise invalid_request(f"'{param}' is not supported by this server's completions.", param=param)
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) != 1:
            raise invalid_request("One prompt per request: send the others apart.", param="prompt")
        if not self.prompt or self.prompt == [""]:
            raise invalid_request("'prompt' must not be empty.", param="prompt")
        self.refuse_stream_options()

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
            include=["message.output_text.logprobs"] if self.logprobs is not None else [],
            top_logprobs=self.logprobs,
            store=False,
            stream=self.stream,
        )


def parse_completion_request(body: bytes | dict[str, Any], limits: RequestLimits = DEFAULT_LIMITS) -> CompletionRequest:
    request = parse_body(body, CompletionRequest, limits)
    request.refuse_unsupported()
    return request


# One token of the legacy `logprobs` object: its string, its logprob (None: the prompt's first
# token, which nothing predicts) and the top alternatives (None with it).
LegacyToken = tuple[str, float | None, dict[str, float] | None]


@dataclass(frozen=True, slots=True)
class Echo:
    """The prompt returned before the completion (`echo`), and its tokens' logprobs when asked for."""

    text: str
    tokens: list[LegacyToken] | None = None


def legacy_tokens(logprobs: Sequence[Any]) -> list[LegacyToken]:
    """Responses logprobs (a message part's, or a delta event's) as legacy tokens."""
    return [(entry.token, entry.logprob, {top.token: top.logprob for top in entry.top_logprobs}) for entry in logprobs]


def _token_bytes(token: str) -> bytes:
    """A token string's bytes (a part of a character is written `bytes:\\xe4\\xb8`)."""
    if token.startswith("bytes:"):
        try:
            return bytes(int(token[at + 2 : at + 4], 16) for at in range(6, len(token), 4))
        except ValueError:
            pass
    return token.encode("utf-8", "surrogatepass")


class LegacyLogprobs:
    """The legacy `logprobs` objects of a text's tokens, in order: `tokens`, `token_logprobs`,
    `top_logprobs`, and `text_offset` (each token's first character in the whole text, an
    echoed prompt included; a token that ends inside a character starts at that character)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        self._offset = 0

    def of(self, tokens: list[LegacyToken]) -> dict[str, Any]:
        offsets = []
        for token, _, _ in tokens:
            offsets.append(self._offset)
            self._offset += len(self._decoder.decode(_token_bytes(token)))
        return {
            "tokens": [token for token, _, _ in tokens],
            "token_logprobs": [logprob for _, logprob, _ in tokens],
            "top_logprobs": [top for _, _, top in tokens],
            "text_offset": offsets,
        }


def _completion(
    response: Response, text: str, finish: str | None, with_usage: bool, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A `text_completion` (a streamed one's `finish_reason` is null until its end, which the
    SDK's type, written for whole completions, does not allow: plain JSON)."""
    usage = chat_usage(response) if with_usage else None
    return {
        "id": "cmpl-" + response.id.removeprefix("resp_"),
        "object": "text_completion",
        "created": int(response.created_at),
        "model": response.model,
        "choices": [] if finish == "usage" else [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
        **({"usage": usage.model_dump(mode="json", exclude_none=True)} if usage is not None else {}),
    }


def text_completion(response: Response, with_logprobs: bool = False, echo: Echo | None = None) -> dict[str, Any]:
    """The finished response as a `text_completion`: its text (after the prompt, with `echo`)
    and, asked for, the logprobs of its tokens (the prompt's first, with `echo`). Plain JSON:
    the SDK's `Completion` has no room for the echoed first token's null logprob, which
    OpenAI's API sends."""
    parts = [part for item in response.output if item.type == "message" for part in item.content if part.type == "output_text"]
    text = "".join(part.text for part in parts)
    logprobs = None
    if with_logprobs:
        tokens = legacy_tokens([entry for part in parts for entry in part.logprobs or []])
        logprobs = LegacyLogprobs().of([*(echo.tokens or [] if echo is not None else []), *tokens])
    finish = "length" if response.status == "incomplete" else "stop"
    whole = (echo.text if echo is not None else "") + text
    return _completion(response, whole, finish, with_usage=True, logprobs=logprobs)


class CompletionChunks:
    """A raw completion's events as streamed `text_completion`s: the echoed prompt first
    (`echo`: called once the engine's first tokens are in, when the prompt's logprobs are
    known), each text delta, then the finish reason (and, asked for, the usage with no
    choices); with `with_logprobs`, each chunk with its tokens' logprobs."""

    def __init__(self, include_usage: bool, with_logprobs: bool = False, echo: Callable[[], Echo] | None = None) -> None:
        self.include_usage = include_usage
        self.with_logprobs = with_logprobs
        self.failed: dict[str, Any] | None = None
        self._echo = echo
        self._logprobs = LegacyLogprobs()

    def chunks(self, events: list[ResponseStreamEvent]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in merged_deltas(events):
            if event.type == "response.created":
                self._response = event.response
                continue
            if self._echo is not None and event.type in ("response.output_text.delta", "response.completed", "response.incomplete"):
                echo, self._echo = self._echo(), None
                logprobs = self._logprobs.of(echo.tokens or []) if self.with_logprobs else None
                out.append(_completion(self._response, echo.text, None, with_usage=False, logprobs=logprobs))
            if event.type == "response.output_text.delta":
                logprobs = self._logprobs.of(legacy_tokens(event.logprobs)) if self.with_logprobs else None
                out.append(_completion(self._response, event.delta, None, with_usage=False, logprobs=logprobs))
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

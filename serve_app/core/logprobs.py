"""Output-text logprobs (`include: ["message.output_text.logprobs"]`) as the SDK models them.

The engine reports, per sampled token, its logprob and the top alternatives as token ids
(`TokenLogprobs`); a model family knows each token's bytes (harmony: the o200k encoding;
chat-template models: the tokenizer's vocabulary). This module turns the two into the SDK's
`Logprob` objects: with `bytes` for the output_text content part, without for the delta and
done events (the SDK has one class per place, with the same meaning).

Values that JSON cannot carry never leave here: an alternative with logprob `-inf` (a token
the sampler could not pick: structured outputs mask candidates so) is left out of
`top_logprobs`, so a token may list fewer than `top_logprobs` alternatives; a sampled
token's non-finite logprob is reported as -9999.0 (a finite floor).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from openai.types.responses import response_text_delta_event as delta_types
from openai.types.responses import response_text_done_event as done_types
from openai.types.responses.response_output_text import Logprob, LogprobTopLogprob

from serve_app.core.construct import trusted_constructor
from serve_app.core.tokens import TokenLogprobs

LOGPROB_FLOOR = -9999.0

Entry = TypeVar("Entry")  # an event's own Logprob type

# Built from values made here (no validation: these are most of the cost of logprobs);
# the fields are checked against the SDK's at import.
_LOGPROB, _TOP = trusted_constructor(Logprob), trusted_constructor(LogprobTopLogprob)
_DELTA, _DELTA_TOP = trusted_constructor(delta_types.Logprob), trusted_constructor(delta_types.LogprobTopLogprob)
_DONE, _DONE_TOP = trusted_constructor(done_types.Logprob), trusted_constructor(done_types.LogprobTopLogprob)
for _cls, _fields in (
    (Logprob, ["token", "bytes", "logprob", "top_logprobs"]),
    (LogprobTopLogprob, ["token", "bytes", "logprob"]),
    (delta_types.Logprob, ["token", "logprob", "top_logprobs"]),
    (delta_types.LogprobTopLogprob, ["token", "logprob"]),
    (done_types.Logprob, ["token", "logprob", "top_logprobs"]),
    (done_types.LogprobTopLogprob, ["token", "logprob"]),
):
    if list(_cls.model_fields) != _fields:  # the SDK changed: fail at import, not on the wire
        raise TypeError(f"{_cls.__module__}.{_cls.__name__} has fields {list(_cls.model_fields)}, not {_fields}")


def token_string(raw: bytes) -> str:
    """A token's text; a token that is part of a UTF-8 character is written as its bytes, the
    way the OpenAI API writes them (`bytes:\\xe4\\xb8`)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)


class TokenVocabulary(Protocol):
    """What a model family tells of its tokens (`HarmonyModel`, `ChatTemplateModel`)."""

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes (special tokens too: they may be candidates)."""

    def writes_text(self, token_id: int) -> bool:
        """Whether the token writes its bytes into the completion text (special ones do not)."""


class LogprobFormatter:
    """Builds the SDK's logprob objects of one model's tokens (token texts cached)."""

    def __init__(self, vocabulary: TokenVocabulary) -> None:
        self._token_bytes = vocabulary.token_bytes
        self._writes_text = vocabulary.writes_text
        self._tokens: dict[int, tuple[str, list[int], bytes]] = {}

    def token_text(self, token_id: int) -> bytes:
        """The bytes the token writes into the completion text (none for special tokens)."""
        return self._token(token_id)[2]

    def _token(self, token_id: int) -> tuple[str, list[int], bytes]:
        """(token string, its bytes as the API lists them, the bytes it writes into the text)."""
        token = self._tokens.get(token_id)
        if token is None:
            raw = self._token_bytes(token_id)
            written = raw if self._writes_text(token_id) else b""
            token = self._tokens[token_id] = (token_string(raw), list(raw), written)
        return token

    def logprob(self, token_id: int, logprobs: TokenLogprobs) -> Logprob:
        """The output_text part's entry of one sampled token."""
        sampled, alternatives = logprobs
        text, raw, _ = self._token(token_id)
        top = []
        for alternative, value in alternatives:
            if math.isfinite(value):
                alt_text, alt_raw, _ = self._token(alternative)
                top.append(_TOP({"token": alt_text, "bytes": alt_raw, "logprob": float(value)}))
        value = float(sampled) if math.isfinite(sampled) else LOGPROB_FLOOR
        return _LOGPROB({"token": text, "bytes": raw, "logprob": value, "top_logprobs": top})


def for_delta(logprobs: list[Logprob]) -> list[delta_types.Logprob]:
    """The same entries as `response.output_text.delta` carries them (no bytes)."""
    return _without_bytes(logprobs, _DELTA, _DELTA_TOP)


def for_done(logprobs: list[Logprob]) -> list[done_types.Logprob]:
    """The same entries as `response.output_text.done` carries them (no bytes)."""
    return _without_bytes(logprobs, _DONE, _DONE_TOP)


def _without_bytes(
    logprobs: list[Logprob], entry_type: Callable[[dict[str, Any]], Entry], top_type: Callable[[dict[str, Any]], object]
) -> list[Entry]:
    """The entries rebuilt with an event's own logprob types (the SDK has one pair per event)."""
    return [
        entry_type(
            {
                "token": entry.token,
                "logprob": entry.logprob,
                "top_logprobs": [top_type({"token": t.token, "logprob": t.logprob}) for t in entry.top_logprobs],
            }
        )
        for entry in logprobs
    ]

"""What travels between the ingress and an engine: a generation request and token batches."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Literal, Protocol

FinishReason = Literal["stop", "length", "abort"]

# The engine's logprobs of one sampled token: its own logprob and the top alternatives as
# (token id, logprob), best first (the sampled token among them when it ranks that high).
TokenLogprobs = tuple[float, list[tuple[int, float]]]


class EngineRejected(Exception):
    """The engine refused a request before generating anything: vLLM's request validation
    (`client_error`: the request can never be served as it is, e.g. more logprobs than the
    engine's `max_logprobs`) or its admission control (too busy now: try again)."""

    def __init__(self, reason: str, client_error: bool) -> None:
        super().__init__(reason, client_error)  # both in args: Ray pickles it to the ingress
        self.reason, self.client_error = reason, client_error


@dataclass(slots=True)
class OutputConstraint:
    """What the completion must obey (`text.format`, `tool_choice`; see `constraints.py`).

    `engine` is for real engines: keyword arguments of vLLM's `StructuredOutputsParams`. The
    rest says the same in plain terms, for scripted backends."""

    engine: dict[str, Any]
    answer_schema: dict[str, Any] | None = None  # the answer is a JSON instance of this schema
    tool_choice: Literal["auto", "required", "none"] = "auto"
    functions: dict[str, Any] = field(default_factory=dict)  # may be called: name -> argument schema


@dataclass(frozen=True, slots=True)
class EngineImage:
    """An image of a vision model's prompt, in the order of its placeholders: the bytes as the
    client sent them (decoded and checked by the ingress), the size the model sees it at
    (the engine scales it to that), and the prompt tokens it stands for (its pad token's
    place widened: the family's cost)."""

    data: bytes
    width: int
    height: int
    tokens: int


@dataclass(slots=True)
class GenerationRequest:
    """Prompt tokens rendered by the ingress plus sampling settings for the engine."""

    request_id: str
    prompt_token_ids: list[int]
    stop_token_ids: list[int] = field(default_factory=list)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logprobs: int | None = None  # report logprobs with this many alternatives per token (0: none)
    prompt_logprobs: int | None = None  # the same for the prompt's tokens (`/v1/completions` with `echo`)
    constraint: OutputConstraint | None = None  # structured outputs / enforced tool_choice
    # Who consumes the stream (inside Ray: the ingress replica's actor name), so the engine
    # can abort requests whose consumer died; None: not watched.
    caller: str | None = None
    # The conversation this request continues: requests with the same key go to the same
    # engine replica, whose prefix cache holds it (deployments/routing.py); None: any replica.
    affinity_key: str | None = None
    # The engine serves lower values first (vLLM's priority scheduling; see service_tier.py).
    priority: int = 0
    # The engine replica that generated the response's previous round (the tool loop): its
    # prefix cache holds all but the new tokens, so the router keeps this request there.
    replica: str | None = None
    # The tenant's: the engine's prefix cache reuses only blocks made with the same salt, so one
    # tenant's requests never hit (or time) another's cached prefixes; None: shared (no tenants).
    cache_salt: str | None = None
    # A vision model's images, one per placeholder of the prompt, in order (vLLM's `multi_modal_data`).
    images: list[EngineImage] = field(default_factory=list)

    @property
    def image_tokens(self) -> int:
        """What the images add to the prompt's length once the engine widens their pad tokens."""
        return sum(image.tokens - 1 for image in self.images)


@dataclass(slots=True)
class TokenBatch:
    """One or more completion tokens; small and plain so Ray serializes it cheaply.

    `finish_reason` is set on the last batch only. Prompt counts are filled on the first
    batch. Speculative-decoding counters are summed over what the batch covers.
    """

    token_ids: list[int]
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    logprobs: list[TokenLogprobs] | None = None  # aligned with token_ids, when requested
    replica: str | None = None  # first batch (and an acknowledgement): the engine replica generating it (`GenerationRequest.replica`)
    # First batch, when asked for (`GenerationRequest.prompt_logprobs`): per prompt token, as
    # `logprobs` (None for the first token, which nothing predicts).
    prompt_logprobs: list[TokenLogprobs | None] | None = None

    @classmethod
    def acknowledgement(cls) -> TokenBatch:
        """A batch that says only "the engine has the request" (see `TokenSource`)."""
        return cls([])

    @property
    def is_acknowledgement(self) -> bool:
        """Whether this batch carries nothing but the engine's acknowledgement: no token, no
        finish reason, no prompt counts (a consumer skips it)."""
        return not self.token_ids and self.finish_reason is None and self.num_prompt_tokens is None and self.prompt_logprobs is None

    def __reduce__(self) -> tuple[type[TokenBatch], tuple[Any, ...]]:
        # One per Ray object: the constructor and a tuple pickle in 49 bytes instead of 204
        # (a slots dataclass's default pickles field names and a state dict), ~25 % less CPU.
        return (TokenBatch, _batch_fields(self))

    def merge(self, later: TokenBatch) -> None:
        """Append a later batch of the same request (engine-side coalescing)."""
        self.token_ids.extend(later.token_ids)
        if self.logprobs is not None and later.logprobs is not None:
            self.logprobs.extend(later.logprobs)
        self.finish_reason = later.finish_reason
        if self.num_prompt_tokens is None:
            self.num_prompt_tokens = later.num_prompt_tokens
        if self.num_cached_tokens is None:
            self.num_cached_tokens = later.num_cached_tokens
        if self.replica is None:
            self.replica = later.replica
        if self.prompt_logprobs is None:
            self.prompt_logprobs = later.prompt_logprobs
        self.num_draft_tokens += later.num_draft_tokens
        self.num_accepted_tokens += later.num_accepted_tokens


# Every field, in the constructor's order (a field added to TokenBatch is pickled too).
_batch_fields = attrgetter(*TokenBatch.__slots__)


class TokenSource(Protocol):
    """What makes tokens: an engine (`serve_app.engines.Backend` adds its control), a Serve
    handle to one, a warm-up that generates nothing."""

    def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenBatch, None]:
        """Stream the completion; the last batch carries `finish_reason`. Closing the
        iterator early (client gone) must abort the request. Before the first token a source
        may send acknowledgements (`TokenBatch.acknowledgement()`): the engine took the
        request, so the response can start while its prompt is prefilled."""
        ...

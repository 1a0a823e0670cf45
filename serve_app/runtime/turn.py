"""A turn: one response being made (its request, prompt, engine request and event stream),
the model it is made with, and the one builder of its engine requests (first generation and
every round of the tool loop)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from openai.types.responses import ResponseUsage

from serve_app.api.request import DEFAULT_TEMPERATURE, DEFAULT_TOP_P, ResponsesRequest
from serve_app.core.items import CompletionParser, ItemSink
from serve_app.core.stream import ResponseStream
from serve_app.core.tokens import EngineImage, GenerationRequest, OutputConstraint, TokenSource
from serve_app.families.harmony import HarmonyModel, HistoryItem
from serve_app.families.prompt_cache import PromptCache
from serve_app.runtime.compaction import Compacted
from serve_app.runtime.images import ImageReader
from serve_app.runtime.metrics import RequestTrace
from serve_app.state import StoreUnavailable
from serve_app.state.conversations import ConversationStore
from serve_app.state.quotas import Admission
from serve_app.tools.server_tools import ResponseTools


class ModelFamily(Protocol):
    """How a kind of model is prompted and parsed (`HarmonyModel`, `ChatTemplateModel`)."""

    stop_token_ids: list[int]
    prompt_cache: PromptCache | None  # token ids of prompt pieces rendered before

    def render_prompt(self, request: ResponsesRequest, history: list[HistoryItem]) -> list[int]: ...
    def continue_prompt(
        self, request: ResponsesRequest, history: list[HistoryItem], prompt: list[int], completion: list[int], new_items: list[HistoryItem]
    ) -> list[int]: ...  # the tool loop's next round (serve_app/runtime/tool_loop.py)
    def parser(self, sink: ItemSink, prompt: list[int]) -> CompletionParser: ...
    def token_bytes(self, token_id: int) -> bytes: ...
    def writes_text(self, token_id: int) -> bool: ...
    def constraint(self, request: ResponsesRequest, prompt: list[int]) -> OutputConstraint | None: ...
    def encode_raw(self, text: str) -> list[int]: ...  # a raw prompt (`/v1/completions`): text only, no control token


@dataclass(frozen=True, slots=True)
class Unavailable:
    """Why a model cannot take requests now: `loading` (its engine is starting or being
    replaced; it will serve) or `unavailable` (its engine failed; it may not), and the
    detail a client may see (e.g. its engine deployment's status in Serve)."""

    status: Literal["loading", "unavailable"]
    reason: str


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    source: TokenSource
    max_model_len: int = 131_072
    family: ModelFamily = field(default_factory=HarmonyModel)
    owned_by: str = "responses-serve"
    # Why the model cannot take requests now (e.g. its engine deployment has no running
    # replica), or None: such requests get a 503 instead of waiting for an engine, and the
    # readiness route (`/ready`) says the model is not ready.
    unavailable: Callable[[str], Awaitable[Unavailable | None]] | None = None
    # Whether its requests are ordered by `service_tier` where they wait (`ModelConfig.tiered`);
    # if not, every response reports the `default` tier.
    tiered: bool = False
    # Whether `POST /v1/completions` may send it raw prompts (`ModelConfig.raw_prompts`).
    raw_prompts: bool = False
    # A vision model's image reader (`ModelConfig.vision`); None: a text-only model (images are a 400).
    images: ImageReader | None = None


@dataclass(slots=True)
class Turn:
    """One response being made: the request, this turn's own input, and its stream."""

    request: ResponsesRequest
    model: ServedModel
    input_items: list[HistoryItem]
    prompt: list[int]
    generation: GenerationRequest
    stream: ResponseStream
    store_error: StoreUnavailable | None = None  # set when the finished response could not be stored
    conversations: ConversationStore | None = None  # with the `conversation` parameter
    trace: RequestTrace = field(default_factory=RequestTrace)  # timings and counts for metrics
    # Its place within the tenant's quotas (None: the tenant has none): `run_turn` counts its
    # output tokens on it and releases it at the end; the tool loop charges tools on it.
    admission: Admission | None = None
    history: list[HistoryItem] = field(default_factory=list)  # the conversation the prompt was rendered from
    tools: ResponseTools | None = None  # server-side tools (the tool loop), if the request has any
    # The request's hosted tools this server does not run, by type: left out of the request
    # the model is prompted with and of the response (`ServerToolRuntime.admit`).
    unavailable_tools: list[str] = field(default_factory=list)
    # The usage of the summary written for `context_management` before this turn (None: none was).
    compaction_usage: ResponseUsage | None = None
    # `context_management`: compacts a history (the tool loop's next round when its prompt is
    # over `compact_threshold` tokens); None: the request does not ask for compaction.
    compact: Callable[[list[HistoryItem]], Awaitable[Compacted]] | None = None
    compact_threshold: int | None = None

    def tools_offered(self) -> ResponsesRequest:
        """The request as the model is prompted with it: with its server-side tools."""
        return self.tools.offer(self.request) if self.tools is not None else self.request


class ContextFull(Exception):
    """A prompt leaves no room for output in the model's context."""

    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        super().__init__(f"{prompt_tokens} prompt tokens, a context of {max_model_len}")
        self.prompt_tokens, self.max_model_len = prompt_tokens, max_model_len


def engine_request(
    offered: ResponsesRequest,
    prompt: list[int],
    model: ServedModel,
    *,
    request_id: str,
    affinity: str | None,
    priority: int,
    cache_salt: str | None,
    output_tokens: int = 0,
    replica: str | None = None,
    images: list[EngineImage] | None = None,
) -> GenerationRequest:
    """The engine request for `prompt`: sampling as the request asks, output bounded by the
    context left and by what `max_output_tokens` leaves after `output_tokens` (written by
    earlier rounds), its structured-output constraint for `offered` (the request with the
    tools the model is offered). `replica`: the engine replica to pin (the previous round's).
    `images`: a vision model's, one per placeholder of `prompt`, in order; the tokens they
    stand for count in the context. Raises `ContextFull` when the prompt fills the context."""
    images = images or []
    size = len(prompt) + sum(image.tokens - 1 for image in images)
    room = model.max_model_len - size
    if room < 1:
        raise ContextFull(size, model.max_model_len)
    budget = offered.max_output_tokens
    return GenerationRequest(
        request_id=request_id,
        prompt_token_ids=prompt,
        stop_token_ids=model.family.stop_token_ids,
        max_tokens=room if budget is None else max(1, min(room, budget - output_tokens)),
        temperature=DEFAULT_TEMPERATURE if offered.temperature is None else offered.temperature,
        top_p=DEFAULT_TOP_P if offered.top_p is None else offered.top_p,
        presence_penalty=offered.presence_penalty or 0.0,
        frequency_penalty=offered.frequency_penalty or 0.0,
        seed=offered.seed,
        logprobs=offered.logprobs,
        constraint=model.family.constraint(offered, prompt),
        affinity_key=affinity,
        priority=priority,
        replica=replica,
        cache_salt=cache_salt,
        images=images,
    )

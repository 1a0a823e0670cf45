"""The run of one response, apart from HTTP: history in, events out, the result stored.

    turn = await start_turn(request, model, responses, conversations, cipher)  # history, prompt
    async for events in run_turn(turn, responses): ...    # a list of events per token batch

The HTTP routes (serve_app/server/routes/) stream or collect these events; background runs drive
the same generator. Never imports FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Sequence
from typing import Any, NamedTuple

from openai.types.responses import ResponseError, ResponseFailedEvent, ResponseStreamEvent, ResponseUsage

from serve_app.api.errors import APIError, invalid_request, server_error, server_full
from serve_app.api.items import CompactionItem, MessageItem
from serve_app.api.request import ResponsesRequest
from serve_app.api.service_tier import engine_priority, served_tier
from serve_app.core.encrypted_reasoning import INCLUDE as ENCRYPTED_REASONING
from serve_app.core.encrypted_reasoning import ReasoningCipher, open_reasoning_items
from serve_app.core.logprobs import LogprobFormatter
from serve_app.core.stream import ResponseStream, new_id
from serve_app.core.text_parser import TextParser
from serve_app.core.tokens import EngineImage, EngineRejected, GenerationRequest, TokenBatch, TokenSource
from serve_app.families.harmony import HistoryItem
from serve_app.families.truncation import fit_to_context, output_reserve, whole_from
from serve_app.runtime.compaction import KEEP_USER_CHARS, Compacted, compacted_item, open_compactions, summary_request
from serve_app.runtime.files import FileInputs
from serve_app.runtime.images import prompt_images, read_images, refuse_text_only
from serve_app.runtime.metrics import RequestTrace
from serve_app.runtime.offload import BIG_HISTORY_CHARS, BIG_HISTORY_ITEMS, big_prompt, off_loop
from serve_app.runtime.tool_loop import ToolRounds
from serve_app.runtime.turn import ContextFull, ServedModel, Turn, engine_request
from serve_app.state import ResponseStore, StoreUnavailable
from serve_app.state.conversations import ConversationStore, as_history, builtin_ids, conversation_not_found, decode_all
from serve_app.state.responses import with_ids
from serve_app.tools.server_tools import ResponseTools, ServerToolRuntime, StreamTooLong, until

logger = logging.getLogger(__name__)


class RenderCost(NamedTuple):
    """What rendering a turn's prompt took: its time on the event loop, and the tokens of all
    its renders (truncation tries several), by where their ids came from."""

    seconds: float
    reused_tokens: int  # from the model's prompt cache
    tokenized_tokens: int


class RenderedTurn(NamedTuple):
    input_items: list[HistoryItem]  # this turn's own input, with ids
    prompt: list[int]
    truncated_items: int  # history items left out of the prompt (`truncation: "auto"`)
    cost: RenderCost
    affinity_key: str | None  # the conversation's, for the engine's router (`affinity_key`)
    history: list[HistoryItem]
    tools: ResponseTools | None  # the response's server-side tools
    images: tuple[EngineImage, ...] = ()  # a vision model's: one per placeholder of the prompt, in order

    @property
    def input_tokens(self) -> int:
        """The prompt's size as the engine counts it: each image's pad token widened."""
        return len(self.prompt) + sum(image.tokens - 1 for image in self.images)


async def render_turn(
    request: ResponsesRequest,
    model: ServedModel,
    responses: ResponseStore,
    conversations: ConversationStore | None,
    cipher: ReasoningCipher,
    server_tools: ServerToolRuntime | None = None,
    tenant: str = "",
    response_id: str | None = None,
    compaction: CompactionItem | None = None,
    appends: bool = False,
    files: FileInputs | None = None,
) -> RenderedTurn:
    """This turn's own input items and the prompt tokens: the history is rebuilt (a store
    read only with `previous_response_id` or `conversation`), encrypted reasoning and
    compaction items opened, the oldest items left out with `truncation: "auto"` when it
    does not fit. With `server_tools`, the request's server-side tools are made for the
    response and the model is prompted with those known without asking anyone (an MCP
    server's tools listed earlier in the conversation). `response_id`: the response's, whose
    ids its input items get. `compaction`: the response's own (`context_management`), read
    after its input. `appends`: the turn will append its input and output to its
    `conversation`, so one at its bound (`ConversationLimits`) is a 400 before it is read.
    `files`: the tenant's reader of `input_file` parts (runtime/files.py; None: only
    `file_data` is read), which reads every part of the history into text before rendering
    (and, for a vision model, a PDF's first pages into images: runtime/images.py)."""
    response_id = response_id or new_id("resp")
    refuse_text_only(request, model.name, model.images)  # before any store read
    files = files or FileInputs(None, None)
    items = await responses.resolve(request.input_items(), stored=request.store)  # item references: a store read each

    def opened() -> list[HistoryItem]:  # the same ids in input_items and a conversation
        return with_ids(open_reasoning_items(items, cipher), response_id)

    input_items = await off_loop(opened) if big_prompt(items, 0) else opened()
    pages = model.images.page_bounds() if model.images is not None else None  # a vision model's PDFs' pages
    await files.resolve(input_items, pages=pages)
    extra: list[HistoryItem] = [compaction] if compaction is not None else []
    budget = model.max_model_len - output_reserve(request.max_output_tokens, model.max_model_len)
    cache = model.family.prompt_cache
    reused_before = cache.hit_tokens if cache is not None else 0
    rendered = 0  # tokens of every render

    def render_with(asked: ResponsesRequest, items: list[HistoryItem]) -> list[int]:
        nonlocal rendered
        prompt = model.family.render_prompt(asked, items)
        rendered += len(prompt)
        return prompt

    async def too_long(window: list[HistoryItem]) -> bool:
        """Whether `window` (the newest items read so far) with this turn's input is already
        over the budget: rendered without the tools (fewer tokens than the prompt will have)."""
        items = open_compactions([*window, *input_items, *extra], cipher, len(input_items) + len(extra))
        bare = request.model_copy(update={"tools": []})
        size = functools.partial(render_with, bare, items)
        return len(await off_loop(size) if big_prompt(items, 0) else size()) > budget

    history = input_items
    lead, skipped, summarised = None, 0, False
    if request.previous_response_id is not None:
        history = await responses.history(request.previous_response_id) + input_items
    conversation_id = request.conversation_id
    if conversation_id is not None:
        if conversations is None or await conversations.get(conversation_id) is None:
            raise conversation_not_found(conversation_id, param="conversation")
        if appends:
            await conversations.check_room(conversation_id, input_items)
        if request.truncation == "auto":  # only the newest items that can fit are read
            window = await recent_history(conversations, conversation_id, too_long)
            history, lead, skipped, summarised = window.items + input_items, window.lead, window.skipped, window.summarised
        else:  # whole: a prompt longer than the context is refused, so every item counts
            history = await whole_history(conversations, conversation_id) + input_items
    earlier = history[: len(history) - len(input_items)]
    await files.resolve_history(earlier, pages=pages)
    history = open_compactions([*history, *extra], cipher, len(input_items) + len(extra))
    first_input = len(history) - len(extra) - len(input_items)
    images = await read_images(request, history, first_input, len(input_items), model.name, model.images, files)
    tools = server_tools.for_response(request, history, input_items, tenant) if server_tools is not None else None
    offered = tools.offer(request) if tools is not None else request

    started = time.perf_counter()

    def render(items: list[HistoryItem]) -> list[int]:
        return render_with(offered, items)

    def render_fitting() -> tuple[list[int], int]:
        if request.truncation != "auto":
            return render(history), 0
        if not skipped:
            return fit_to_context(render, history, budget)
        prompt, dropped = fit_to_context(render, history, budget, lead=lead, resumed=True)
        # Nothing cut from a window that fits behind its compaction item: neither would be
        # from the whole conversation, whose older items the compaction stands for.
        return prompt, 0 if summarised and not dropped else skipped + dropped

    # A long conversation renders in a worker thread: the replica's other streams go on.
    prompt, truncated_items = await off_loop(render_fitting) if big_prompt(history, len(request.tools)) else render_fitting()
    reused = cache.hit_tokens - reused_before if cache is not None else 0
    cost = RenderCost(time.perf_counter() - started, reused, rendered - reused)
    kept = prompt_images(model.family, prompt, images)
    return RenderedTurn(input_items, prompt, truncated_items, cost, affinity_key(request, history), history, tools, tuple(kept))


# The newest items of a conversation a `truncation: "auto"` turn reads first; each further
# slice (older) is twice the last, until what was read passes the model's context.
FIRST_SLICE = 64


class Window(NamedTuple):
    items: list[HistoryItem]  # the conversation's opening instructions, then its newest items
    lead: int  # how many of `items` are the opening instructions
    skipped: int  # items between the two, not read (or read and left out: they cannot start a prompt)
    summarised: bool = False  # the read ended at a compaction item that stands for the items not read

    @property
    def resumed(self) -> bool:
        return self.skipped > 0


def _is_instruction(item: dict[str, Any]) -> bool:
    return item.get("type") == "message" and item.get("role") in ("system", "developer")


def _summarised(items: list[HistoryItem]) -> bool:
    """Whether the newest compaction item among `items` has before it more user messages'
    text than it keeps (`KEEP_USER_CHARS`): the model reads nothing older."""
    last = next((index for index in range(len(items) - 1, -1, -1) if isinstance(items[index], CompactionItem)), None)
    if last is None:
        return False
    chars = 0
    for item in reversed(items[:last]):
        if isinstance(item, MessageItem) and item.role == "user":
            chars += len(item.text)
            if chars > KEEP_USER_CHARS:
                return True
    return False


async def _as_history(conversations: ConversationStore, conversation_id: str, records: list[bytes]) -> list[HistoryItem]:
    """Stored records as history items (with their tool texts), decoded in a worker thread
    when they are many or big."""
    big = len(records) > BIG_HISTORY_ITEMS or sum(map(len, records)) > BIG_HISTORY_CHARS
    decoded = await off_loop(decode_all, records) if big else decode_all(records)
    texts = await conversations.tool_texts(conversation_id, builtin_ids(decoded))
    return await off_loop(as_history, decoded, texts) if big else as_history(decoded, texts)


async def whole_history(conversations: ConversationStore, conversation_id: str) -> list[HistoryItem]:
    """Every item of the conversation (bounded by `ConversationLimits`), decoded off the loop
    when they are many."""
    return await _as_history(conversations, conversation_id, await conversations.records(conversation_id))


async def recent_history(
    conversations: ConversationStore, conversation_id: str, too_long: Callable[[list[HistoryItem]], Awaitable[bool]]
) -> Window:
    """The conversation's opening instructions (kept by truncation whatever its length) and
    its newest items, read newest first in slices (`FIRST_SLICE`, doubling) until
    `too_long` says they pass the context, or all were read. Each item renders at least a
    token, so what is read is of the order of the context, whatever the conversation holds."""
    length = await conversations.length(conversation_id)
    head: list[HistoryItem] = []
    lead_end = 0  # the first item that is not an opening instruction
    while lead_end < length:
        records = await conversations.records(conversation_id, lead_end, min(length, lead_end + FIRST_SLICE))
        opening = list(itertools.takewhile(lambda record: _is_instruction(decode_all([record])[0]), records))
        head += await _as_history(conversations, conversation_id, opening)
        lead_end += len(opening)
        if not records or len(opening) < len(records) or await too_long(head):
            break
    read: list[HistoryItem] = []
    tail: list[HistoryItem] = []
    stop, size = length, FIRST_SLICE
    while stop > lead_end:
        start = max(lead_end, stop - size)
        read = await _as_history(conversations, conversation_id, await conversations.records(conversation_id, start, stop)) + read
        stop, size = start, size * 2
        # A function call's output whose call was not read starts no prompt, nor what follows
        # it up to the next item that may.
        tail = read[whole_from(read) :] if start > lead_end else read
        if _summarised(tail):
            return Window(head + tail, len(head), length - len(tail) - lead_end, summarised=True)
        if await too_long(head + tail):
            break
    return Window(head + tail, len(head), length - len(tail) - lead_end)


def affinity_key(request: ResponsesRequest, history: list[HistoryItem]) -> str | None:
    """What every turn of a conversation has in common, so its engine requests can go to the
    engine replica that holds its prefix in cache: the client's `prompt_cache_key` (OpenAI
    routes by it too), else the `conversation`, else the text of the history's first user
    message (the same for a `previous_response_id` chain and for a client that sends the
    whole history every turn). None without any of them."""
    if request.prompt_cache_key:
        return "key:" + request.prompt_cache_key
    if request.conversation_id is not None:
        return "conversation:" + request.conversation_id
    first = next((item for item in history if isinstance(item, MessageItem) and item.role == "user"), None)
    if first is None:
        return None
    return "user:" + hashlib.blake2b(first.text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


async def start_turn(
    request: ResponsesRequest,
    model: ServedModel,
    responses: ResponseStore,
    conversations: ConversationStore | None,
    cipher: ReasoningCipher,
    trace: RequestTrace | None = None,
    service_tiers: Collection[str] | None = None,
    server_tools: ServerToolRuntime | None = None,
    tenant: str = "",
    cache_salt: str | None = None,
    raw_prompt: list[int] | None = None,
    appends: bool = True,
    stop: Sequence[str] = (),
    prompt_logprobs: int | None = None,
    files: FileInputs | None = None,
) -> Turn:
    """The history and prompt of `render_turn`, the engine request and the event stream.
    `raw_prompt`: the prompt itself (`/v1/completions`), read back as plain text.
    `trace`: the request's, for metrics (it learns how many items truncation left out).
    `service_tiers`: the tiers the caller may use (None: every one; others are served as `default`).
    `server_tools`: what runs the request's server-side tools (the tool loop), for `tenant`.
    `cache_salt`: the tenant's, for the engine's prefix cache (`GenerationRequest.cache_salt`).
    `appends`: whether the turn appends to its `conversation` (a summary written for one does not).
    `stop`: stop sequences (Chat Completions and Completions; `ResponseStream`).
    `prompt_logprobs`: the engine reports the prompt's logprobs with this many alternatives
    (`/v1/completions` with `echo`; `ResponseStream.prompt_logprobs`).
    `files`: the tenant's reader of `input_file` parts (`render_turn`)."""
    response_id = new_id("resp")
    if raw_prompt is not None:
        rendered = RenderedTurn([], raw_prompt, 0, RenderCost(0.0, 0, 0), None, [], None)
    else:
        rendered = await render_turn(
            request, model, responses, conversations, cipher, server_tools, tenant, response_id, appends=appends, files=files
        )
    threshold = request.compact_threshold(model.max_model_len) if raw_prompt is None else None
    compactor = None
    if threshold is not None:  # `context_management`

        async def compactor(items: list[HistoryItem]) -> Compacted:
            """A compaction of `items`, written by the model, sealed for the tenant."""
            asked = summary_request(request.model, items, instructions=request.instructions, prompt_cache_key=request.prompt_cache_key)
            summary = await summarize(asked, model, responses, conversations, cipher, tenant=tenant, cache_salt=cache_salt, files=files)
            return compacted_item(summary.text, min(KEEP_USER_CHARS, threshold), summary.usage, cipher)

    compaction = None
    if compactor is not None and threshold is not None and len(rendered.prompt) > threshold:  # compacted first
        compaction = await compactor(rendered.history)
        rendered = await render_turn(
            request,
            model,
            responses,
            conversations,
            cipher,
            server_tools,
            tenant,
            response_id,
            compaction.opened,
            appends=appends,
            files=files,
        )
        logger.info("response %s: compacted a prompt over its threshold %d into %d tokens", response_id, threshold, len(rendered.prompt))
    offered = rendered.tools.offer(request) if rendered.tools is not None else request
    prompt, cost = rendered.prompt, rendered.cost
    trace = trace or RequestTrace()
    trace.truncated_items = rendered.truncated_items
    trace.render_s, trace.prompt_reused_tokens, trace.prompt_tokenized_tokens = cost.seconds, cost.reused_tokens, cost.tokenized_tokens
    tier = served_tier(request.service_tier, model.tiered, service_tiers)
    trace.service_tier = tier
    try:
        generation = engine_request(
            offered,
            prompt,
            model,
            request_id=response_id,
            affinity=rendered.affinity_key,
            priority=engine_priority(tier),
            cache_salt=cache_salt,
            images=list(rendered.images),
        )
        generation.prompt_logprobs = prompt_logprobs
    except ContextFull as exc:
        raise invalid_request(
            f"This model's maximum context length is {exc.max_model_len} tokens, but the input has {exc.prompt_tokens} tokens. "
            "Shorten the input.",
            param="input",
            code="context_length_exceeded",
        ) from None
    stream = ResponseStream(
        request,
        response_id=generation.request_id,
        parser_factory=(
            (lambda sink: model.family.parser(sink, prompt))
            if raw_prompt is None
            else (lambda sink: TextParser(sink, model.family.token_bytes, model.family.writes_text))
        ),
        logprobs=LogprobFormatter(model.family) if request.logprobs is not None else None,
        encrypt_reasoning=cipher.encrypt if ENCRYPTED_REASONING in request.include else None,
        service_tier=tier,
        compaction=compaction.item if compaction is not None else None,
        stop=stop,
    )
    if rendered.tools is not None:
        stream.server_tools = rendered.tools.routing()
    return Turn(
        request,
        model,
        rendered.input_items,
        prompt,
        generation,
        stream,
        conversations=conversations,
        trace=trace,
        history=rendered.history,
        tools=rendered.tools,
        compaction_usage=compaction.usage if compaction is not None else None,
        compact=compactor,
        compact_threshold=threshold,
    )


class Summary(NamedTuple):
    window: list[HistoryItem]  # the conversation it stands for, as the model read it (without the request for it)
    text: str
    usage: ResponseUsage | None


async def summarize(
    request: ResponsesRequest,
    model: ServedModel,
    responses: ResponseStore,
    conversations: ConversationStore | None,
    cipher: ReasoningCipher,
    *,
    tenant: str,
    cache_salt: str | None,
    files: FileInputs | None = None,
) -> Summary:
    """The model's answer to a `summary_request` (runtime/compaction.py); a 503 when the
    engine could not write it."""
    turn = await start_turn(
        request, model, responses, conversations, cipher, tenant=tenant, cache_salt=cache_salt, appends=False, files=files
    )
    # The conversation was read; the summary is not one of its turns (`store` is off too).
    turn.request = turn.request.model_copy(update={"conversation": None})
    async with contextlib.aclosing(run_turn(turn, responses)) as events:
        async for _ in events:
            pass
    response = turn.stream.response
    if response.status == "failed":
        message = response.error.message if response.error is not None else "the engine failed"
        raise server_error(f"The conversation could not be compacted: {message}", status_code=503)
    return Summary(turn.history[:-1], response.output_text, response.usage)


class PromptOnly:
    """A token source that generates nothing: a warm-up (a WebSocket `response.create` with
    `generate: false`) renders its prompt, counts it, and completes with no output."""

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenBatch, None]:
        yield TokenBatch([], finish_reason="stop", num_prompt_tokens=len(request.prompt_token_ids))


async def run_turn(
    turn: Turn,
    responses: ResponseStore,
    max_duration_s: float | None = None,
    source: TokenSource | None = None,
    refusal_window_s: float | None = None,
) -> AsyncGenerator[list[ResponseStreamEvent], None]:
    """The events of `turn`. With `request.store`, a finished response is stored before its terminal
    event goes out; if the store fails, that event becomes `response.failed`, so a client
    never holds the id of a response that is not there. `max_duration_s`,
    `refusal_window_s`: see `engine_events`. `source`: where the tokens come from (the
    model's engine unless given)."""
    stream = turn.stream
    source = source or turn.model.source
    rounds = ToolRounds(turn, turn.tools) if turn.tools is not None and source is turn.model.source else None
    meter = _OutputMeter(turn)
    generated = engine_events(stream, source, turn.generation, turn.trace, max_duration_s, refusal_window_s, rounds)
    async with contextlib.aclosing(generated) as batches:
        try:
            async for events in batches:
                await meter.tick()
                if stream.continuable:
                    saved = False
                    try:
                        if turn.request.store:
                            await responses.save(stream.response, turn.input_items, stream.tool_texts)
                            saved = True
                        if turn.request.conversation_id is not None:  # the turn's input and output, in one append
                            assert turn.conversations is not None  # start_turn checked the conversation
                            await turn.conversations.append(  # let in by start_turn: counted, not refused
                                turn.request.conversation_id,
                                turn.input_items + list(stream.response.output),
                                stream.tool_texts,
                                enforce=False,
                            )
                    except StoreUnavailable as exc:
                        logger.warning("response %s: not stored: %s", stream.response.id, exc.message)
                        turn.store_error = exc
                        if saved and not turn.request.background:  # the conversation missed it: told failed, not kept
                            await _unsave(responses, stream.response.id)  # (a background one is stored failed when it ends)
                        events = [*events[:-1], _failed(stream, events[-1], exc.message)]
                yield events
        finally:
            await meter.close()


class _OutputMeter:
    """A turn's output tokens charged to its tenant's quota as they are produced (at most once
    a `CHARGE_EVERY_S`, and at the end), then its admission released. Never fails the stream:
    tokens the store could not take are not counted."""

    CHARGE_EVERY_S = 1.0

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.charged = 0
        self.last = time.monotonic()

    async def tick(self) -> None:
        if self.turn.admission is not None and time.monotonic() - self.last >= self.CHARGE_EVERY_S:
            await self._charge()

    async def _charge(self) -> None:
        assert self.turn.admission is not None
        self.last = time.monotonic()
        produced = self.turn.trace.output_tokens
        if produced > self.charged:
            try:
                await self.turn.admission.charge_tokens(produced - self.charged)
            except StoreUnavailable as exc:
                logger.warning("response %s: output tokens not counted: %s", self.turn.stream.response.id, exc.message)
            self.charged = produced

    async def close(self) -> None:
        if self.turn.admission is not None:
            try:
                await self._charge()
            finally:
                await self.turn.admission.release()


async def _unsave(responses: ResponseStore, response_id: str) -> None:
    try:
        await responses.delete(response_id)
    except StoreUnavailable as exc:  # it stays stored (completed) until its TTL: said in the log
        logger.warning("response %s: stored, but its conversation append failed and it could not be deleted: %s", response_id, exc.message)


def _failed(stream: ResponseStream, terminal: ResponseStreamEvent, message: str) -> ResponseFailedEvent:
    response = stream.response
    response.status = "failed"
    response.error = ResponseError(code="server_error", message=f"The response was generated but could not be stored: {message}")
    response.completed_at = None
    response.incomplete_details = None
    return ResponseFailedEvent(type="response.failed", response=response, sequence_number=terminal.sequence_number)


# How long a streamed response waits for its engine to refuse it (at capacity) before it
# starts: a refusal then is a 503 with Retry-After, not a stream that starts and fails.
# Serve's handle refuses at once when its queue is full, vLLM's admission control as soon as
# the request reaches it; a first batch within the window goes out with the start.
REFUSAL_WINDOW_S = 0.25


async def engine_events(
    stream: ResponseStream,
    source: TokenSource,
    generation: GenerationRequest,
    trace: RequestTrace | None = None,
    max_duration_s: float | None = None,
    refusal_window_s: float | None = None,
    rounds: ToolRounds | None = None,
) -> AsyncGenerator[list[ResponseStreamEvent], None]:
    """Events of one response, a list per token batch. Ends with exactly one terminal event.

    With `rounds` (server-side tools), the response is the tool loop's generations with the
    tools' calls between them (serve_app/runtime/tool_loop.py).

    A response still generating after `max_duration_s` is ended here with `response.failed`
    (and its engine request and tool calls aborted): the replica's drain is sized for that
    maximum, so a stream is ended by us, cleanly, before Serve would kill the replica under it.

    With `refusal_window_s`, the engine's first answer is awaited that long before the
    first event: an engine at capacity then raises `engine_at_capacity` (a 503) before
    anything was sent. Not when the tool loop has work before the first generation (an MCP
    server's listing): the response starts, and the engine is asked after it."""
    deadline = None if max_duration_s is None else asyncio.get_running_loop().time() + max_duration_s
    try:
        if rounds is not None and rounds.prepares():
            yield stream.start()
            async for events in _guarded(stream, _rounds(stream, source, None, deadline, trace, rounds), max_duration_s):
                yield events
            return
        # aclosing: a client that goes away closes this generator, which must close (and so
        # abort) the engine stream at once rather than whenever the GC gets to it.
        async with contextlib.aclosing(source.generate(generation)) as batches, _FirstBatch(batches) as first:
            if refusal_window_s is not None:
                await first.refused_within(refusal_window_s, generation.request_id)
            yield stream.start()
            async for events in _guarded(stream, _rounds(stream, source, first.then(batches), deadline, trace, rounds), max_duration_s):
                yield events
    finally:
        if rounds is not None:  # the response's connections to tool servers end with it
            await rounds.tools.aclose()


async def _rounds(
    stream: ResponseStream,
    source: TokenSource,
    first: AsyncGenerator[TokenBatch, None] | None,
    deadline: float | None,
    trace: RequestTrace | None,
    rounds: ToolRounds | None,
) -> AsyncGenerator[list[ResponseStreamEvent], None]:
    """The response's generations: `first` (its engine call already made; None: the tool loop
    prepares first, then makes it), then, with `rounds`, a tool round and the next generation
    for as long as the model calls server-side tools."""
    if first is None:
        assert rounds is not None
        async for events in rounds.prepare(deadline):
            yield events
        first = source.generate(rounds.turn.generation)
    batches = first
    while True:
        # Read the source to its end even after the last batch, so a finished engine call ends
        # normally instead of being cancelled.
        async with contextlib.aclosing(batches):
            async for batch in _until(batches, deadline):
                if batch.is_acknowledgement:  # the engine has it: what it meant was done (`_FirstBatch`)
                    continue
                if stream.finished or stream.awaiting_tools:
                    logger.warning("response %s: engine sent tokens after its last batch", stream.response.id)
                    continue
                if trace is not None:
                    trace.saw(batch)
                if rounds is not None:
                    rounds.saw(batch)
                if events := stream.feed(batch):
                    yield events
                if stream.stopped:  # at a stop sequence: closing the batches aborts the engine request
                    break
        if not stream.finished and not stream.awaiting_tools:  # the source ended without a finish reason: a normal stop
            yield stream.feed(TokenBatch([], finish_reason="stop"))
        if stream.finished or rounds is None:
            return
        async for events in rounds.run_calls(deadline):
            yield events
        if stream.hands_back or rounds.out_of_budget():  # the client answers a call, or no tokens are left
            yield stream.complete("completed" if stream.hands_back else "incomplete")
            return
        batches = source.generate(await rounds.next_generation())


async def _guarded(
    stream: ResponseStream, events: AsyncGenerator[list[ResponseStreamEvent], None], max_duration_s: float | None
) -> AsyncGenerator[list[ResponseStreamEvent], None]:
    """`events`, ended with `response.failed` when the engine or the tool loop fails."""
    try:
        async with contextlib.aclosing(events):
            async for batch in events:
                yield batch
    except StreamTooLong:
        logger.warning("response %s: still generating after %g s, the maximum stream duration: ended", stream.response.id, max_duration_s)
        yield stream.fail(
            f"The response was still being generated after {max_duration_s:g} s, this server's maximum stream "
            "duration, and was ended. Ask for fewer output tokens (max_output_tokens)."
        )
    except ContextFull as exc:  # a round of the tool loop (the first prompt was checked before the response began)
        message = (
            f"With the tools' output the conversation has {exc.prompt_tokens} tokens, more than this model's context "
            f"({exc.max_model_len}): ask the tools for less output, or start a new conversation."
        )
        logger.warning("response %s: %s", stream.response.id, message)
        yield stream.fail(message, code="invalid_prompt")
    except APIError as exc:  # the request cannot go on once the tools are known (a tool_choice they lack)
        yield stream.fail(exc.message, code="invalid_prompt")
    except EngineRejected as exc:  # vLLM's validation or admission control: its words are for the client
        logger.warning("response %s: the engine refused it: %s", stream.response.id, exc.reason)
        yield stream.fail(
            f"The engine refused this request: {exc.reason}" if exc.client_error else exc.reason,
            code="invalid_prompt" if exc.client_error else "server_error",
        )
    except Exception:  # engine died or raised: the client still gets a proper ending
        # Ray's errors carry actor ids, pids and node IPs: the details go to the log only.
        logger.exception("response %s: engine stream failed", stream.response.id)
        yield stream.fail(f"The engine failed while generating this response ({stream.response.id}). Please try again.")


def engine_at_capacity(reason: str) -> APIError:
    return server_full(f"The model's engines are at capacity ({reason}). Retry shortly.", code="engine_at_capacity")


class _FirstBatch:
    """The engine's first batch, asked for early (`refused_within`) so that a refusal can come
    before the response starts; `then` gives it, then the rest. An engine replica whose first
    token is slow acknowledges the request first (`TokenBatch.acknowledgement`): the response
    then starts while the prompt is prefilled, off the first token's path."""

    def __init__(self, batches: AsyncGenerator[TokenBatch, None]) -> None:
        self._batches = batches
        self._pending: asyncio.Future[TokenBatch] | None = None

    async def __aenter__(self) -> _FirstBatch:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._pending is not None and not self._pending.done():  # the engine call is still waited for
            self._pending.cancel()
            await asyncio.wait([self._pending])

    async def refused_within(self, window_s: float, request_id: str) -> None:
        """Wait up to `window_s` for the first batch; an engine at capacity raises `engine_at_capacity`."""
        self._pending = asyncio.ensure_future(anext(self._batches))
        await asyncio.wait([self._pending], timeout=window_s)
        if self._pending.done() and not self._pending.cancelled():
            error = self._pending.exception()
            if isinstance(error, EngineRejected) and not error.client_error:
                logger.warning("response %s: refused, the engines are at capacity: %s", request_id, error.reason)
                raise engine_at_capacity(error.reason) from None

    async def then(self, batches: AsyncGenerator[TokenBatch, None]) -> AsyncGenerator[TokenBatch, None]:
        if self._pending is not None:
            try:
                yield await self._pending
            except StopAsyncIteration:
                return
        async for batch in batches:
            yield batch


async def _until(batches: AsyncGenerator[TokenBatch, None], deadline: float | None) -> AsyncGenerator[TokenBatch, None]:
    """`batches`, ended by `StreamTooLong` at `deadline` (loop time); the wait for a batch is
    cancelled then, which aborts the engine request (the source's `finally`)."""
    while True:
        try:
            # The timeout covers only the wait for the next batch, never our consumer's work.
            async with until(deadline):
                batch = await anext(batches)
        except StopAsyncIteration:
            return
        yield batch

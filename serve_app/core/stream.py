"""ResponseStream: token batches in, Responses API events out.

One per request. It owns every piece of lifecycle bookkeeping: the response and item ids,
`output_index`, `content_index`, `sequence_number`, and the `*.added` / `*.delta` /
`*.done` events of each item. It keeps one `Response` snapshot that becomes the terminal
event's response and the non-streaming body, so streaming and non-streaming can never
disagree. A completion parser (the model family's: harmony for gpt-oss) turns tokens into item operations;
this class turns item operations into events.

Deltas of one item within one `feed()` are merged into one delta event: a batch of k
tokens costs one event, not k, and clients see the same text whatever the batching.

Server-side tools (`tool_items.py`): a call the server runs stays open after its arguments
until the tool loop (serve_app/runtime/tool_loop.py) hands in its outcome, so its
`*.completed` comes only after the tool returned. Items are shown one after another: the
events of items that follow an unfinished one are held back until it is done. A response
may span several engine generations (one per tool round): `next_round()` starts the next
one with a fresh parser; usage is counted over all of them.

With the browser among the response's tools (`ServerTools.citations`), the model's citation
markers (`【3†L10-L15】`) are taken out of its messages' text as they stream and become
`url_citation` annotations (`response.output_text.annotation.added`, after the delta that
holds the text they annotate); logprobs, when asked for, still cover every token written.

Stop sequences (`stop` of Chat Completions and Completions, `core/stop.py`): each message's
text is shown up to the first one; what may still become one is held back. At a stop the
message is closed, the rest of the batch ignored and the response completed (`stopped`:
the caller ends the engine request); logprobs cover the tokens of the text shown.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from openai.types.responses import (
    Response,
    ResponseCompactionCompactingEvent,
    ResponseCompactionItem,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseCustomToolCall,
    ResponseCustomToolCallInputDeltaEvent,
    ResponseCustomToolCallInputDoneEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseOutputTextAnnotationAddedEvent,
    ResponseReasoningItem,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    Tool,
)
from openai.types.responses.response import IncompleteDetails
from openai.types.responses.response_error import ResponseError
from openai.types.responses.response_output_text import Logprob
from openai.types.responses.response_reasoning_item import Content as ReasoningContent
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails, ResponseUsage
from pydantic import BaseModel, TypeAdapter, ValidationError

from serve_app.api.request import DEFAULT_TEMPERATURE, DEFAULT_TOP_P, ResponsesRequest
from serve_app.api.service_tier import ServedTier
from serve_app.api.tools import McpTool
from serve_app.core.attribution import LogprobAttribution
from serve_app.core.citations import Annotation, CitationStream
from serve_app.core.construct import trusted_constructor as _trusted_constructor
from serve_app.core.items import CompletionParser, Phase
from serve_app.core.logprobs import LogprobFormatter, for_delta, for_done
from serve_app.core.stop import StopMatcher
from serve_app.core.tokens import TokenBatch, TokenLogprobs
from serve_app.core.tool_items import (
    NOT_FINISHED,
    CallKind,
    ServerCall,
    ServerTools,
    StringArgument,
    ToolOutcome,
    listing_added,
    listing_finished,
    listing_opened,
)

logger = logging.getLogger(__name__)

ItemKind = Literal["reasoning", "message", "function_call", "custom_tool_call", "server_call"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]
_ID_PREFIX: dict[ItemKind, str] = {"reasoning": "rs", "message": "msg", "function_call": "fc", "custom_tool_call": "ctc"}


class _DeltaEvents:
    """Makes the delta events of one item kind: the hot path, one per item per batch."""

    def __init__(self, cls: type[BaseModel], **shared: Any) -> None:
        fields = {*shared, "item_id", "output_index", "delta", "sequence_number"}
        if fields != set(cls.model_fields):  # the SDK changed the event: fail at import, not on the wire
            raise TypeError(f"{cls.__name__} has fields {sorted(cls.model_fields)}, not {sorted(fields)}")
        # `cls` is one of the delta event classes of `ResponseStreamEvent` (a union: no `type[...]` of it).
        self.construct = cast("Callable[[dict[str, Any]], ResponseStreamEvent]", _trusted_constructor(cls))
        self._shared = shared  # the same objects in every event: events are never changed once made
        self._names = list(cls.model_fields)

    def template(self, item_id: str, output_index: int) -> dict[str, Any]:
        """An item's delta event fields, in the model's field order (the order they are
        serialized in); `delta` and `sequence_number` are set per event on a copy."""
        fields = {**self._shared, "item_id": item_id, "output_index": output_index, "delta": "", "sequence_number": 0}
        return {name: fields[name] for name in self._names}


_DELTA_EVENTS: dict[ItemKind, _DeltaEvents] = {
    "message": _DeltaEvents(ResponseTextDeltaEvent, type="response.output_text.delta", content_index=0, logprobs=[]),
    "reasoning": _DeltaEvents(ResponseReasoningTextDeltaEvent, type="response.reasoning_text.delta", content_index=0),
    "function_call": _DeltaEvents(ResponseFunctionCallArgumentsDeltaEvent, type="response.function_call_arguments.delta"),
    "custom_tool_call": _DeltaEvents(ResponseCustomToolCallInputDeltaEvent, type="response.custom_tool_call_input.delta"),
}

_SDK_TOOL = TypeAdapter(Tool)
_SERVER_CALL_DELTAS: dict[type[BaseModel], _DeltaEvents] = {}


def _server_call_deltas(kind: CallKind) -> _DeltaEvents | None:
    if kind.delta_event is None:
        return None
    if kind.delta_event not in _SERVER_CALL_DELTAS:
        event_type = kind.delta_event.model_fields["type"].annotation.__args__[0]  # type: ignore[union-attr]
        _SERVER_CALL_DELTAS[kind.delta_event] = _DeltaEvents(kind.delta_event, type=event_type)
    return _SERVER_CALL_DELTAS[kind.delta_event]


def _echo_tools(request: ResponsesRequest) -> list[Tool]:
    """The request's tools as the SDK models them, without secrets (an MCP server's headers);
    a hosted type the SDK doesn't know is left out."""
    tools = []
    for tool in request.tools:
        try:
            tools.append(_SDK_TOOL.validate_python(tool.echo() if isinstance(tool, McpTool) else tool.model_dump(exclude_none=True)))
        except ValidationError:
            logger.debug("not echoing tool of type %r", tool.type)
    return tools


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# An item's id names the response it came with: `{prefix}_{the response id's hex}{number}`,
# output items numbered from OUTPUT_ITEMS, the turn's own input items (given no id by the
# client) from 0. An `item_reference` is so found with one read of that response, whatever
# replica stored it; nothing indexes items one by one.
_ITEM_NUMBER_DIGITS = 6
OUTPUT_ITEMS = 0x800000
_ITEM_ID = re.compile(rf"[a-z]+_([0-9a-f]{{32}})[0-9a-f]{{{_ITEM_NUMBER_DIGITS}}}")


def item_id(prefix: str, response_id: str, number: int) -> str:
    return f"{prefix}_{response_id.removeprefix('resp_')}{number:0{_ITEM_NUMBER_DIGITS}x}"


def response_of_item(item_id: str) -> str | None:
    """The id of the response an item id was given with (None: not one of ours)."""
    match = _ITEM_ID.fullmatch(item_id)
    return f"resp_{match.group(1)}" if match else None


@dataclass(frozen=True, slots=True)
class _Listing:
    """An `mcp_list_tools` item waiting for its server."""

    item_id: str
    server_label: str


@dataclass(slots=True)
class _OpenItem:
    kind: ItemKind
    id: str
    output_index: int
    delta_template: dict[str, Any]  # the fields of the item's delta events
    make_delta: Callable[[dict[str, Any]], ResponseStreamEvent] | None  # None: deltas not sent
    call: ServerCall | None = None  # a server-side call
    custom_input: StringArgument | None = None  # a custom tool call: its input, decoded as it streams
    name: str | None = None
    namespace: str | None = None
    call_id: str | None = None
    phase: Phase | None = None
    parts: list[str] = field(default_factory=list)  # every delta, in order
    unsent: str = ""  # text added since the last delta event
    logprobs: list[Logprob] = field(default_factory=list)  # messages, when asked for: every token's
    unsent_logprobs: list[Logprob] = field(default_factory=list)  # those of `unsent`
    citations: CitationStream | None = None  # messages of a response that browsed: markers -> annotations
    stop: StopMatcher | None = None  # messages of a request with stop sequences
    annotations: list[Annotation] = field(default_factory=list)


class ResponseStream:
    """The per-request state machine. Call `start()`, then `feed()` per batch, then `fail()`
    if the engine broke. Each returns the events to send, in order."""

    def __init__(
        self,
        request: ResponsesRequest,
        *,
        parser_factory: Callable[[ResponseStream], CompletionParser],
        model: str | None = None,
        response_id: str | None = None,
        logprobs: LogprobFormatter | None = None,
        encrypt_reasoning: Callable[[str], str] | None = None,
        service_tier: ServedTier = "default",
        compaction: ResponseCompactionItem | None = None,
        stop: Sequence[str] = (),
    ) -> None:
        """`logprobs`: report the output text's logprobs (batches must carry them);
        `encrypt_reasoning`: give reasoning items `encrypted_content` (its text, encrypted);
        `service_tier`: the tier the request is served in (`service_tier.served_tier`);
        `compaction`: what the conversation was compacted into before the generation
        (`context_management`): the first output item; `stop`: stop sequences (Chat
        Completions and Completions): each message's text ends before the first one the
        model writes in it, and the response with it (`stopped`)."""
        self._compaction = compaction
        self._stop = tuple(stop)
        self.stopped = False  # a stop sequence ended the response: the engine request can go
        self.prompt_logprobs: list[TokenLogprobs | None] | None = None  # the engine's, when asked for (`echo`)
        self._events: list[ResponseStreamEvent] = []
        self._sequence_number = 0
        self._item: _OpenItem | None = None
        self._parser = parser_factory(self)
        self._output_tokens = 0
        self._prompt_tokens = 0
        self._cached_tokens = 0
        self._encrypt_reasoning = encrypt_reasoning
        self._custom_tools = frozenset(tool.name for tool in request.custom_tools())  # called as functions.NAME
        # Logprobs: every token is parsed on its own, and its logprob goes to the delta holding
        # the first output text it contributes to (`core.attribution`). Tokens that contribute none
        # report none: headers, end tokens, tags, whitespace trimmed at an item's edges (and
        # reasoning and call arguments: only output text has logprobs in the API).
        self._logprobs = LogprobAttribution(logprobs) if logprobs is not None else None
        # Server-side tools: the calls the server runs (set by the tool loop once it knows them).
        self.server_tools = ServerTools()
        self._unfinished: dict[int, ServerCall | _Listing] = {}  # output index -> a call or listing not done yet
        # What the model read of each built-in tool's call (its item does not carry it), by item id:
        # the tool loop's next prompt shows it (`state.responses.output_as_input`).
        self.tool_texts: dict[str, str] = {}
        self._held: dict[int, list[ResponseStreamEvent]] = {}  # events of items after an unfinished one
        self._items_opened = 0  # output items given an id (`item_id`)
        self._earlier_reasoning_tokens = 0  # of the tool rounds before this one
        self.awaiting_tools = False  # this round's generation ended with server-side calls to run
        self.hands_back = False  # this round made a call the client answers (function call, approval request)
        self.finished = False
        self.response = Response(
            id=response_id or new_id("resp"),
            object="response",
            created_at=int(time.time()),
            model=model or request.model,
            status="in_progress",
            output=[],
            instructions=request.instructions,
            tools=_echo_tools(request),
            tool_choice=request.tool_choice if isinstance(request.tool_choice, str) else request.tool_choice.model_dump(),
            parallel_tool_calls=request.parallel_tool_calls,
            max_tool_calls=request.max_tool_calls,
            temperature=DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
            top_p=DEFAULT_TOP_P if request.top_p is None else request.top_p,
            top_logprobs=request.top_logprobs or 0,
            presence_penalty=request.presence_penalty or 0.0,  # the values the engine ran with
            frequency_penalty=request.frequency_penalty or 0.0,
            max_output_tokens=request.max_output_tokens,
            previous_response_id=request.previous_response_id,
            background=request.background,
            conversation={"id": request.conversation_id} if request.conversation_id else None,
            reasoning=request.reasoning.model_dump() if request.reasoning else {"effort": None, "summary": None},
            metadata=request.metadata or {},
            store=request.store,
            user=request.user,
            prompt_cache_key=request.prompt_cache_key,
            service_tier=service_tier,
            truncation=request.truncation or "disabled",
            text={
                "format": request.text.format.model_dump(by_alias=True) if request.text and request.text.format else {"type": "text"},
                "verbosity": (request.text.verbosity if request.text else None) or "medium",
            },
            error=None,
            incomplete_details=None,
            usage=None,
        )

    # -- driving ---------------------------------------------------------------------------

    def start(self) -> list[ResponseStreamEvent]:
        snapshot = self.response.model_copy(update={"output": []})
        self._emit(ResponseCreatedEvent(type="response.created", response=snapshot, sequence_number=0))
        self._emit(ResponseInProgressEvent(type="response.in_progress", response=snapshot, sequence_number=0))
        if self._compaction is not None:
            self.add_compaction(self._compaction)
        return self._drain()

    def add_compaction(self, item: ResponseCompactionItem) -> None:
        """A compaction item, done before the model writes again (`context_management`: before
        the first generation, or between tool rounds): added, compacting, done."""
        if self._item is not None or self._unfinished:
            raise RuntimeError("add_compaction() with an item still open")
        self._items_opened += 1
        output_index = len(self.response.output)
        self.response.output.append(item)
        self._emit(ResponseOutputItemAddedEvent(type="response.output_item.added", item=item, output_index=output_index, sequence_number=0))
        self._emit(
            ResponseCompactionCompactingEvent(
                type="response.compaction.compacting", item_id=item.id, output_index=output_index, sequence_number=0
            )
        )
        self._emit(ResponseOutputItemDoneEvent(type="response.output_item.done", item=item, output_index=output_index, sequence_number=0))

    def feed(self, batch: TokenBatch) -> list[ResponseStreamEvent]:
        """Parse every token of the batch, one at a time; finish if it is the last batch."""
        if self.finished:
            raise RuntimeError("feed() after the terminal event")
        if batch.num_prompt_tokens is not None:  # each tool round's generation has a prompt of its own
            self._prompt_tokens += batch.num_prompt_tokens
        if batch.num_cached_tokens is not None:
            self._cached_tokens += batch.num_cached_tokens
        if batch.prompt_logprobs is not None:
            self.prompt_logprobs = batch.prompt_logprobs
        self._output_tokens += len(batch.token_ids)
        finish_reason = batch.finish_reason
        try:
            with_logprobs = self._logprobs is not None and batch.logprobs is not None
            if with_logprobs:
                self._feed_with_logprobs(batch)
            else:
                self._parser.feed(batch.token_ids)
            if finish_reason in ("length", "stop") and not self.stopped:
                # Text the parser still held is part of the output.
                self._parser.end(truncated=finish_reason == "length")
                if with_logprobs:
                    self._attribute_settled()
        except Exception:  # the model wrote something the parser cannot parse
            # The details (the parser's view of the model's output) go to the log, not the client.
            logger.exception("response %s: the completion could not be parsed", self.response.id)
            return self.fail(f"The model produced output that could not be parsed (response {self.response.id}).")
        if self.stopped:  # at a stop sequence, whatever the engine would have gone on with
            self._finish("completed")
        elif finish_reason is not None:
            if finish_reason == "abort":
                return self.fail("The generation was aborted by the engine.")
            if finish_reason == "stop" and self._unfinished:  # the tool loop runs them, then goes on
                self.awaiting_tools = True
            elif finish_reason in ("length", "stop"):
                self._finish("completed" if finish_reason == "stop" else "incomplete")
        return self._drain()

    def _feed_with_logprobs(self, batch: TokenBatch) -> None:
        engine_logprobs, attribution = batch.logprobs, self._logprobs
        assert engine_logprobs is not None
        assert attribution is not None  # `feed` checked both
        if len(engine_logprobs) != len(batch.token_ids):  # an engine bug: keep the text, not the logprobs
            logger.warning("response %s: %d logprobs for %d tokens", self.response.id, len(engine_logprobs), len(batch.token_ids))
            self._parser.feed(batch.token_ids)
            return
        for token, logprobs in zip(batch.token_ids, engine_logprobs):
            attribution.wrote(token, logprobs)
            self._parser.feed([token])
            if self.stopped:
                return
            self._attribute_settled()

    def _attribute_settled(self) -> None:
        """Between tokens: the parser holds only an unfinished character and its `held_text`."""
        assert self._logprobs is not None
        # Before the parser's held text, a message's possible start of a stop sequence.
        held = self._item.stop.held_text if self._item is not None and self._item.stop is not None else ""
        self._logprobs.attribute(settled=True, held_text=held + getattr(self._parser, "held_text", ""))

    def fail(self, message: str, code: Literal["server_error", "invalid_prompt"] = "server_error") -> list[ResponseStreamEvent]:
        """End with `response.failed`: open items are closed first, so none is left dangling.
        `invalid_prompt`: the request's own fault (the engine refused it)."""
        if not self.finished:
            self.response.error = ResponseError(code=code, message=message)
            self._finish("failed")
        return self._drain()

    def complete(self, status: Literal["completed", "incomplete"] = "completed") -> list[ResponseStreamEvent]:
        """End after a tool round, when the tool loop does not go on (a call the client
        answers, or no output tokens left: `incomplete`)."""
        if not self.finished:
            self._finish(status)
        return self._drain()

    def next_round(self, parser_factory: Callable[[ResponseStream], CompletionParser]) -> None:
        """The tool round is over: the next generation's tokens come with a fresh parser."""
        if self.finished or self._unfinished:
            raise RuntimeError("next_round() with the response finished or a call still running")
        self._earlier_reasoning_tokens += self._parser.reasoning_tokens
        self._parser = parser_factory(self)
        if self._logprobs is not None:
            self._logprobs.reset()
        self.awaiting_tools = self.hands_back = False

    def cancel(self) -> list[ResponseStreamEvent]:
        """End as `cancelled` (a background response cancelled by the client): the open item
        is closed as incomplete; no terminal event, as the API has none for a cancellation."""
        if not self.finished:
            self._finish("cancelled")
        return self._drain()

    # -- item operations (called by the completion parser) --------------------------------

    def open_reasoning(self) -> None:
        if self.stopped:
            return
        item = self._open("reasoning")
        self._emit_added(ResponseReasoningItem(id=item.id, type="reasoning", summary=[], content=[], status="in_progress"))

    def open_message(self, phase: Phase | None) -> None:
        if self.stopped:
            return
        self._open_message(phase)

    def _open_message(self, phase: Phase | None) -> _OpenItem:
        item = self._open("message", phase=phase)
        if self._stop:
            item.stop = StopMatcher(self._stop)
        if self.server_tools.citations is not None:
            item.citations = CitationStream(self.server_tools.citations)
        self._emit_added(ResponseOutputMessage(id=item.id, type="message", role="assistant", status="in_progress", content=[], phase=phase))
        self._emit(
            ResponseContentPartAddedEvent(
                type="response.content_part.added",
                item_id=item.id,
                output_index=item.output_index,
                content_index=0,
                part=ResponseOutputText(type="output_text", text="", annotations=[], logprobs=[]),
                sequence_number=0,
            )
        )
        return item

    def open_function_call(self, name: str, namespace: str | None, json_arguments: bool = True) -> None:
        """A call the model makes: run by the server if `server_tools` says so, else by the client.
        `json_arguments`: the model writes the arguments as JSON (harmony's python code: as they are)."""
        if self.stopped:
            return
        kind = self.server_tools.kind_of(namespace, name)
        if kind is not None:
            self._open_server_call(kind, namespace, name, json_arguments=json_arguments)
            return
        if namespace is None and name in self._custom_tools:
            item = self._open("custom_tool_call", name=name, call_id=new_id("call"))
            item.custom_input = StringArgument(json_arguments, key="input")  # chat templates: {"input": "..."} (families/hosted.py)
            self._emit_added(self._custom_tool_call(item, ""))
            return
        item = self._open("function_call", name=name, namespace=namespace, call_id=new_id("call"))
        self._emit_added(self._function_call(item, "", "in_progress"))

    # -- server-side tools (called by the tool loop) ----------------------------------------

    def _open_server_call(
        self, kind: CallKind, namespace: str | None, name: str, approval_request_id: str | None = None, json_arguments: bool = True
    ) -> ServerCall:
        deltas = _server_call_deltas(kind)
        item = self._open("server_call", prefix=kind.id_prefix, deltas=deltas)
        call = item.call = ServerCall(
            item.id, item.output_index, kind, namespace, name, approval_request_id=approval_request_id, json_arguments=json_arguments
        )
        self._emit_added(kind.added(call))
        for event in kind.opened(call):
            self._emit(event)
        return call

    def add_server_call(
        self, kind: CallKind, namespace: str | None, name: str, arguments: str, approval_request_id: str | None = None
    ) -> ServerCall:
        """A call the model made earlier that runs now (one the client approved): its item is
        opened with all its arguments; finish it with `finish_call`."""
        call = self._open_server_call(kind, namespace, name, approval_request_id)
        if arguments:
            self.add_text(arguments)
        self.close_item()
        return call

    def events(self) -> list[ResponseStreamEvent]:
        """The events of item operations made since the last call that returned events."""
        return self._drain()

    @property
    def unfinished_calls(self) -> list[ServerCall]:
        """The server-side calls waiting to be run, in output order."""
        return [call for _, call in sorted(self._unfinished.items()) if isinstance(call, ServerCall)]

    def run_call(self, call: ServerCall) -> list[ResponseStreamEvent]:
        """The tool is being called now: the kind's events for that (e.g. `searching`)."""
        for event in call.kind.running(call):
            self._emit(event)
        return self._drain()

    def finish_call(self, call: ServerCall, outcome: ToolOutcome) -> list[ResponseStreamEvent]:
        """The tool returned (or failed): the call's last events and its done item."""
        self._finish_call(call, outcome)
        return self._drain()

    def _finish_call(self, call: ServerCall, outcome: ToolOutcome) -> None:
        if self._unfinished.get(call.output_index) is not call:
            raise RuntimeError(f"call {call.item_id} is not waiting for its outcome")
        events, done = call.kind.finished(call, outcome)
        if outcome.model_text is not None:
            self.tool_texts[call.item_id] = outcome.model_text
        for event in events:
            self._emit(event)
        self._done(call.output_index, done)

    def open_tool_listing(self, server_label: str) -> str:
        """An `mcp_list_tools` item for a server being asked for its tools; its id."""
        item_id, output_index = self._new_item_id("mcpl"), len(self.response.output)
        self.response.output.append(listing_added(item_id, server_label))  # its place, until it is done
        self._emit(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added", item=listing_added(item_id, server_label), output_index=output_index, sequence_number=0
            )
        )
        for event in listing_opened(item_id, output_index):
            self._emit(event)
        self._unfinished[output_index] = _Listing(item_id, server_label)
        return item_id

    def finish_tool_listing(self, item_id: str, tools: list[Any], error: str | None = None) -> list[ResponseStreamEvent]:
        """The server listed its tools (`error`: it could not)."""
        self._finish_listing(item_id, tools, error)
        return self._drain()

    def _finish_listing(self, item_id: str, tools: list[Any], error: str | None) -> None:
        output_index, listing = next((i, u) for i, u in self._unfinished.items() if isinstance(u, _Listing) and u.item_id == item_id)
        events, done = listing_finished(item_id, output_index, listing.server_label, tools, error)
        for event in events:
            self._emit(event)
        self._done(output_index, done)

    def _done(self, output_index: int, item: ResponseOutputItem) -> None:
        """An unfinished item is done: its `output_item.done`, then what waited behind it."""
        self.response.output[output_index] = item
        self._emit(ResponseOutputItemDoneEvent(type="response.output_item.done", item=item, output_index=output_index, sequence_number=0))
        del self._unfinished[output_index]
        for index in sorted(self._held):
            if self._held_back(index):
                break
            for event in self._held.pop(index):
                self._stamp(event)

    def _held_back(self, output_index: int) -> bool:
        """Whether an item's events must wait: an earlier item is not done yet."""
        return any(index < output_index for index in self._unfinished)

    def add_text(self, text: str) -> None:
        if self.stopped:
            return
        item = self._item
        if item is None:  # text outside any message cannot happen with harmony; keep it anyway
            item = self._open_message("final_answer")
        if item.stop is None:
            self._write(item, text)
            return
        if shown := item.stop.feed(text):  # the logprobs go with the text shown
            self._write(item, shown)
        if item.stop.stopped:
            self.stopped = True
            self.close_item("completed")

    def _write(self, item: _OpenItem, text: str) -> None:
        if self._logprobs is not None:
            self._logprobs.released(item, text)  # as written: markers too
        if item.call is not None:  # a server-side call: its arguments, shown as its kind streams them
            item.parts.append(text)
            item.unsent += item.call.kind.streamed(item.call, text)
            return
        if item.custom_input is not None:
            item.parts.append(text)
            item.unsent += item.custom_input.feed(text)
            return
        if item.citations is not None:
            text, annotations = item.citations.feed(text)
            self._add_annotations(item, text, annotations)
            return
        item.parts.append(text)
        item.unsent += text

    def _add_annotations(self, item: _OpenItem, text: str, annotations: list[Annotation]) -> None:
        """A message's text without its citation markers, and the annotations the markers made:
        each is sent after the text it annotates."""
        item.parts.append(text)
        item.unsent += text
        for annotation in annotations:
            self._flush_delta()
            self._emit(
                ResponseOutputTextAnnotationAddedEvent(
                    type="response.output_text.annotation.added",
                    item_id=item.id,
                    output_index=item.output_index,
                    content_index=0,
                    annotation_index=len(item.annotations),
                    annotation=annotation.model_dump(),
                    sequence_number=0,
                )
            )
            item.annotations.append(annotation)

    def close_item(self, status: ItemStatus = "completed") -> None:
        item = self._item
        if item is None:
            return
        if item.stop is not None and (held := item.stop.finish()):  # no stop sequence after all
            self._write(item, held)
        if item.citations is not None:  # a partial marker held back is text after all
            self._add_annotations(item, *item.citations.finish())
        if self._logprobs is not None:
            self._logprobs.attribute(settled=False)  # all of its text is out: its logprobs are complete
        text = "".join(item.parts)
        if item.custom_input is not None:
            item.unsent += item.custom_input.finish(text)  # what could not be decoded as it came
            if item.custom_input.error is not None:  # JSON of another shape: the input is what the model wrote
                item.unsent += text
                item.custom_input.text = text
        self._flush_delta()
        where: dict[str, Any] = {"item_id": item.id, "output_index": item.output_index, "sequence_number": 0}
        done: ResponseOutputItem
        if item.kind == "reasoning":
            self._emit(ResponseReasoningTextDoneEvent(type="response.reasoning_text.done", content_index=0, text=text, **where))
            done = ResponseReasoningItem(
                id=item.id,
                type="reasoning",
                summary=[],
                content=[ReasoningContent(type="reasoning_text", text=text)],
                encrypted_content=self._encrypt_reasoning(text) if self._encrypt_reasoning else None,
                status=status,
            )
        elif item.call is not None:
            self._close_server_call(item.call, text, status)
            self._item = None
            return
        elif item.custom_input is not None:
            self._emit(
                ResponseCustomToolCallInputDoneEvent(type="response.custom_tool_call_input.done", input=item.custom_input.text, **where)
            )
            done = self._custom_tool_call(item, item.custom_input.text)
            self.hands_back = self.hands_back or status == "completed"
        elif item.kind == "message":
            part = ResponseOutputText(type="output_text", text=text, annotations=list(item.annotations), logprobs=item.logprobs)
            logprobs = for_done(item.logprobs) if item.logprobs else []
            self._emit(ResponseTextDoneEvent(type="response.output_text.done", content_index=0, text=text, logprobs=logprobs, **where))
            self._emit(ResponseContentPartDoneEvent(type="response.content_part.done", content_index=0, part=part, **where))
            done = ResponseOutputMessage(id=item.id, type="message", role="assistant", status=status, content=[part], phase=item.phase)
        else:
            self._emit(
                ResponseFunctionCallArgumentsDoneEvent(
                    type="response.function_call_arguments.done", arguments=text, name=item.name, **where
                )
            )
            done = self._function_call(item, text, status)
            self.hands_back = self.hands_back or status == "completed"
        self.response.output.append(done)
        self._emit(
            ResponseOutputItemDoneEvent(type="response.output_item.done", item=done, output_index=item.output_index, sequence_number=0)
        )
        self._item = None

    def _close_server_call(self, call: ServerCall, arguments: str, status: ItemStatus) -> None:
        """Its arguments are complete: a call the server runs waits for its outcome (unless the
        model's output was cut inside it); an approval request is done, for the client."""
        call.arguments = arguments
        for event in call.kind.arguments_done(call):
            self._emit(event)
        self.response.output.append(call.kind.added(call))  # its place, until it is done
        self._unfinished[call.output_index] = call
        if not call.kind.runs:
            self.hands_back = self.hands_back or status == "completed"
            self._done(call.output_index, call.kind.finished(call, NOT_FINISHED)[1])
        elif status != "completed":
            self._finish_call(call, NOT_FINISHED)

    # -- internals ---------------------------------------------------------------------------

    def _new_item_id(self, prefix: str) -> str:
        self._items_opened += 1
        return item_id(prefix, self.response.id, OUTPUT_ITEMS + self._items_opened)

    def _open(self, kind: ItemKind, prefix: str | None = None, deltas: _DeltaEvents | None = None, **details: Any) -> _OpenItem:
        if self._item is not None:  # a new header before the end token: close what is open
            self.close_item("incomplete")
        item_id, output_index = self._new_item_id(prefix or _ID_PREFIX[kind]), len(self.response.output)
        if kind != "server_call":
            deltas = _DELTA_EVENTS[kind]
        template = deltas.template(item_id, output_index) if deltas is not None else {}
        item = _OpenItem(kind, item_id, output_index, template, deltas.construct if deltas is not None else None, **details)
        self._item = item
        return item

    @staticmethod
    def _function_call(item: _OpenItem, arguments: str, status: ItemStatus) -> ResponseFunctionToolCall:
        return ResponseFunctionToolCall(
            id=item.id,
            type="function_call",
            call_id=item.call_id,
            name=item.name,
            namespace=item.namespace,
            arguments=arguments,
            status=status,
        )

    @staticmethod
    def _custom_tool_call(item: _OpenItem, text: str) -> ResponseCustomToolCall:
        assert item.name is not None  # opened with a name and a call id
        assert item.call_id is not None
        return ResponseCustomToolCall(id=item.id, type="custom_tool_call", call_id=item.call_id, name=item.name, input=text)

    def _emit_added(self, item: Any) -> None:
        assert self._item is not None  # the item just opened
        self._emit(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added", item=item, output_index=self._item.output_index, sequence_number=0
            )
        )

    def _emit(self, event: ResponseStreamEvent) -> None:
        if self._unfinished and (index := getattr(event, "output_index", None)) is not None and self._held_back(index):
            self._held.setdefault(index, []).append(event)  # numbered when it goes out
            return
        self._stamp(event)

    def _stamp(self, event: ResponseStreamEvent) -> None:
        event.sequence_number = self._sequence_number
        self._sequence_number += 1
        self._events.append(event)

    def _flush_delta(self) -> None:
        item = self._item
        if item is None or not item.unsent:
            return
        if item.make_delta is None:  # a kind whose arguments are not streamed
            item.unsent = ""
            return
        fields = item.delta_template.copy()
        fields["delta"], fields["sequence_number"] = item.unsent, self._sequence_number
        if item.unsent_logprobs:
            fields["logprobs"] = for_delta(item.unsent_logprobs)
            item.unsent_logprobs = []
        item.unsent = ""
        if self._unfinished and self._held_back(item.output_index):
            self._held.setdefault(item.output_index, []).append(item.make_delta(fields))
            return
        self._events.append(item.make_delta(fields))
        self._sequence_number += 1

    def _drain(self) -> list[ResponseStreamEvent]:
        self._flush_delta()
        events, self._events = self._events, []
        return events

    @property
    def output_tokens(self) -> int:
        """Completion tokens so far, over every generation of the response."""
        return self._output_tokens

    @property
    def continuable(self) -> bool:
        """Finished with a response a next turn can continue (completed or incomplete): what
        is stored and kept for `previous_response_id`."""
        return self.finished and self.response.status in ("completed", "incomplete")

    def _finish(self, status: Literal["completed", "incomplete", "failed", "cancelled"]) -> None:
        self.close_item("completed" if status == "completed" else "incomplete")
        for _, unfinished in sorted(self._unfinished.items()):  # the response ends before they did
            if isinstance(unfinished, ServerCall):
                self._finish_call(unfinished, NOT_FINISHED)
            else:
                self._finish_listing(unfinished.item_id, [], "The response ended before the server listed its tools.")
        response = self.response
        response.status = status
        response.usage = ResponseUsage(
            input_tokens=self._prompt_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=self._cached_tokens, cache_write_tokens=0),
            output_tokens=self._output_tokens,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=self._earlier_reasoning_tokens + self._parser.reasoning_tokens),
            total_tokens=self._prompt_tokens + self._output_tokens,
        )
        if status == "completed":
            response.completed_at = int(time.time())
            self._emit(ResponseCompletedEvent(type="response.completed", response=response, sequence_number=0))
        elif status == "incomplete":
            response.incomplete_details = IncompleteDetails(reason="max_output_tokens")
            self._emit(ResponseIncompleteEvent(type="response.incomplete", response=response, sequence_number=0))
        elif status == "failed":
            self._emit(ResponseFailedEvent(type="response.failed", response=response, sequence_number=0))
        self.finished = True

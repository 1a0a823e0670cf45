"""`POST /v1/chat/completions`: the Chat Completions request, served as a Responses request.

A chat request becomes a `ResponsesRequest` (`ChatRequest.as_responses`): its messages the
input items they stand for (an assistant message's `reasoning_content` a reasoning item, its
`tool_calls` function calls, a `tool` message a function call's output), `tools` function
tools, `response_format` the text format, never stored. So it runs the Responses path
entirely — validation limits, rendering, routing, the parsers, tenants, quotas, admission —
and its answer is the Responses answer written the Chat Completions way: `ChatChunks` turns
the response's events into `chat.completion.chunk`s, `chat_completion` the finished response
into a `chat.completion`. Reasoning goes out as `reasoning_content` (vLLM's field, which
LangChain, LiteLLM and the Vercel AI SDK read), never mixed into `content`.
"""

from __future__ import annotations

import json
import re
import time
from typing import Annotated, Any, Literal

from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion_usage import CompletionTokensDetails, CompletionUsage, PromptTokensDetails
from openai.types.responses import (
    Response,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)
from pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator

from serve_app.api.errors import APIError, invalid_request
from serve_app.api.items import FUNCTION_NAME_PATTERN, Lenient, TextPart
from serve_app.api.json_schema import OBJECT_SCHEMA_FIELD, SCHEMA_FIELD
from serve_app.api.limits import DEFAULT_LIMITS, IMAGE_URL_FIELD, RequestLimits
from serve_app.api.request import ResponsesRequest, parse_body, parse_request
from serve_app.api.service_tier import ServiceTier

# --- the request ----------------------------------------------------------------------------


class ChatFunction(Lenient):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, json_schema_extra=OBJECT_SCHEMA_FIELD)
    strict: bool | None = None


class ChatTool(Lenient):
    type: Literal["function"]
    function: ChatFunction


class ChatFunctionCall(Lenient):
    name: str = Field(min_length=1)
    arguments: str


class ChatToolCall(Lenient):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: ChatFunctionCall


class ChatFile(Lenient):
    """A `file` part's file: by `file_id` (the Files API) or `file_data` (base64)."""

    file_id: str | None = None
    file_data: str | None = None
    filename: str | None = None


class ChatImageURL(Lenient):
    url: str = Field(json_schema_extra=IMAGE_URL_FIELD)
    detail: Literal["low", "high", "auto"] = "auto"


class ChatContentPart(Lenient):
    type: Literal["text", "input_text", "refusal", "file", "image_url"]
    text: str | None = None
    refusal: str | None = None
    file: ChatFile | None = None
    image_url: ChatImageURL | None = None

    @model_validator(mode="after")
    def _image_has_url(self) -> ChatContentPart:
        if self.type == "image_url" and self.image_url is None:
            raise ValueError("a content part of type 'image_url' needs its 'image_url' object ({'url': ...})")
        return self

    def as_input_part(self) -> dict[str, Any]:
        """This part as a Responses content part (`input_text`; `input_file` for a file,
        `input_image` for an image)."""
        if self.type == "file":
            given = self.file.model_dump(exclude_none=True) if self.file is not None else {}
            return {"type": "input_file", **given}
        if self.type == "image_url" and self.image_url is not None:
            return {"type": "input_image", "image_url": self.image_url.url, "detail": self.image_url.detail}
        return TextPart(type="input_text", text=self.text or self.refusal or "").model_dump()


class ChatMessage(Lenient):
    # The schema says what `ChatRequest._items` checks: a tool message names its call.
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "anyOf": [
                {"properties": {"role": {"not": {"const": "tool"}}}},
                {"required": ["tool_call_id"], "properties": {"tool_call_id": {"type": "string", "minLength": 1}}},
            ]
        },
    )
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ChatContentPart] | None = None
    name: str | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    # An assistant's earlier reasoning sent back (vLLM's `reasoning_content`; `reasoning` in newer clients).
    reasoning_content: str | None = None
    reasoning: str | None = None

    @property
    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text or part.refusal or "" for part in self.content)


class JSONSchemaSpec(Lenient):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema", json_schema_extra=SCHEMA_FIELD)
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(Lenient):
    model_config = ConfigDict(  # the schema says what `_schema_given` checks
        extra="ignore",
        json_schema_extra={
            "anyOf": [
                {"properties": {"type": {"not": {"const": "json_schema"}}}},
                {"required": ["json_schema"], "properties": {"json_schema": {"type": "object"}}},
            ]
        },
    )
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type 'json_schema' needs a 'json_schema' object")
        return self


class NamedToolChoice(Lenient):
    type: Literal["function"]
    function: ChatFunctionCall | dict[str, Any]

    @property
    def name(self) -> str:
        function = self.function
        return function.name if isinstance(function, ChatFunctionCall) else str(function.get("name", ""))


class StreamOptions(Lenient):
    include_usage: bool = False


MAX_STOP_SEQUENCES = 4  # OpenAI's
MAX_STOP_CHARS = 1024  # a stream holds back at most this less one character (serve_app/core/stop.py)
StopSequence = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class LegacySampling(Lenient):
    """What Chat Completions and Completions requests share: the model, sampling, stop
    sequences, and what this server refuses of both (`n` > 1, `logit_bias`)."""

    model: str = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = None
    n: int = Field(default=1, ge=1)
    stop: StopSequence | Annotated[list[StopSequence], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _few_stops(cls, stop: Any) -> Any:
        if isinstance(stop, list) and len(stop) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences, not {len(stop)}")
        return stop

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        """`stop` as a tuple (empty: none)."""
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def refuse_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise invalid_request("'stream_options' is only allowed when 'stream' is true.", param="stream_options")

    @property
    def include_usage(self) -> bool:
        """A stream's last chunk is the usage (`stream_options.include_usage`)."""
        return self.stream_options is not None and self.stream_options.include_usage


class ChatRequest(LegacySampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] = Field(default_factory=list)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: ServiceTier | None = None
    prompt_cache_key: str | None = None
    modalities: list[Literal["text"]] | None = None  # no audio output here
    audio: None = None
    _item_messages: list[int] = PrivateAttr(default_factory=list)  # the message each input item comes from

    def refuse_unsupported(self) -> None:
        """What this server does not do, as OpenAI-shaped 400s naming the parameter."""
        if self.n != 1:
            raise invalid_request("Only n=1 is supported: ask again for another choice.", param="n")
        if self.logit_bias:
            raise invalid_request("'logit_bias' is not supported by this server.", param="logit_bias")
        if self.store:
            raise invalid_request("Stored chat completions are not supported: use the Responses API to store.", param="store")
        if self.top_logprobs and not self.logprobs:
            raise invalid_request("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
        self.refuse_stream_options()

    def as_responses(self, limits: RequestLimits = DEFAULT_LIMITS) -> ResponsesRequest:
        """The Responses request this chat request stands for (validated as any other)."""
        fmt = self.response_format
        text: dict[str, Any] | None = None
        if fmt is not None and fmt.type == "json_object":
            text = {"format": {"type": "json_object"}}
        elif fmt is not None and fmt.json_schema is not None:
            spec = fmt.json_schema
            text = {"format": {"type": "json_schema", "name": spec.name, "schema": spec.schema_, "strict": spec.strict}}
            if spec.description:
                text["format"]["description"] = spec.description
        choice: Any = self.tool_choice or "auto"
        if isinstance(choice, NamedToolChoice):
            choice = {"type": "function", "name": choice.name}
        body: dict[str, Any] = {
            "model": self.model,
            "input": self._items(),
            "tools": [{"type": "function", **tool.function.model_dump(exclude_none=True)} for tool in self.tools],
            "tool_choice": choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "max_output_tokens": self.max_completion_tokens or self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "seed": self.seed,
            "include": ["message.output_text.logprobs"] if self.logprobs else [],
            "top_logprobs": self.top_logprobs,
            "reasoning": {"effort": self.reasoning_effort} if self.reasoning_effort else None,
            "user": self.user,
            "metadata": self.metadata,
            "service_tier": self.service_tier,
            "prompt_cache_key": self.prompt_cache_key,
            "store": False,
            "stream": self.stream,
            "text": text,
        }
        return parse_request({key: value for key, value in body.items() if value is not None}, limits)

    def chat_param(self, param: str | None) -> str | None:
        """An error's `param` in the Responses request this stands for as the chat request's
        own: `input[k]...` the message it came from (`messages[i]...`), `text.format.schema`
        `response_format.json_schema.schema`, `tools[i].parameters` `tools[i].function.parameters`, ..."""
        if param is None:
            return None
        if (match := re.match(r"input\[(\d+)\]", param)) is not None:
            if int(match.group(1)) >= len(self._item_messages):
                return param
            return f"messages[{self._item_messages[int(match.group(1))]}]" + param[match.end() :]
        if (match := re.match(r"tools\[\d+\]", param)) is not None and param[match.end() :]:
            return match.group(0) + ".function" + param[match.end() :]
        for responses, chat in self._renamed_params():
            if param == responses or param.startswith((responses + ".", responses + "[")):
                return chat + param[len(responses) :]
        return param

    def name_error(self, error: APIError) -> APIError:
        """`error` of the Responses request this stands for, its parameter named as here (in its message too)."""
        named = self.chat_param(error.param)
        if error.param and named != error.param:
            error.message = error.message.replace(f"'{error.param}'", f"'{named}'")
        for responses, chat in self._renamed_params():
            error.message = error.message.replace(f"'{responses}'", f"'{chat}'")
        error.param = named
        return error

    def _renamed_params(self) -> list[tuple[str, str]]:
        """(Responses name, chat name), the longest first."""
        return [
            ("text.format.schema", "response_format.json_schema.schema"),
            ("text.format.name", "response_format.json_schema.name"),
            ("text.format", "response_format"),
            ("tool_choice.name", "tool_choice.function.name"),
            ("reasoning.effort", "reasoning_effort"),
            ("max_output_tokens", "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"),
            ("include", "logprobs"),
            ("input", "messages"),
        ]

    def _items(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        self._item_messages.clear()
        for index, message in enumerate(self.messages):
            self._item_messages.extend([index - 1] * (len(items) - len(self._item_messages)))  # the previous message's
            if message.role == "tool":
                if not message.tool_call_id:
                    raise invalid_request("A tool message needs its 'tool_call_id'.", param=f"messages[{index}].tool_call_id")
                items.append({"type": "function_call_output", "call_id": message.tool_call_id, "output": message.text})
            elif message.role == "assistant":
                if reasoning := message.reasoning_content or message.reasoning:
                    items.append({"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": reasoning}]})
                if message.text:
                    items.append({"role": "assistant", "content": message.text})
                items.extend(
                    {"type": "function_call", "call_id": call.id, "name": call.function.name, "arguments": call.function.arguments}
                    for call in message.tool_calls or []
                )
            elif isinstance(message.content, list) and any(part.type in ("file", "image_url") for part in message.content):
                items.append({"role": message.role, "content": [part.as_input_part() for part in message.content]})
            else:
                items.append({"role": message.role, "content": [TextPart(type="input_text", text=message.text).model_dump()]})
        self._item_messages.extend([len(self.messages) - 1] * (len(items) - len(self._item_messages)))
        return items


def parse_chat_request(body: bytes | dict[str, Any], limits: RequestLimits = DEFAULT_LIMITS) -> tuple[ChatRequest, ResponsesRequest]:
    """The chat request and the Responses request it is served as; a 400 for anything wrong."""
    chat = parse_body(body, ChatRequest, limits)
    chat.refuse_unsupported()
    try:
        return chat, chat.as_responses(limits)
    except APIError as exc:  # named as the chat request names it
        raise chat.name_error(exc) from None


# --- the answer -----------------------------------------------------------------------------

FinishReason = Literal["stop", "length", "tool_calls"]


def completion_id(response: Response) -> str:
    return "chatcmpl-" + response.id.removeprefix("resp_")


def finish_reason(response: Response) -> FinishReason:
    """`tool_calls` when the answer ends with calls for the client, `length` when it was cut
    by the token limit, else `stop` (never `content_filter`: nothing filters here)."""
    if response.status == "incomplete":
        return "length"
    return "tool_calls" if any(item.type == "function_call" for item in response.output) else "stop"


def chat_usage(response: Response) -> CompletionUsage | None:
    usage = response.usage
    if usage is None:
        return None
    return CompletionUsage(
        prompt_tokens=usage.input_tokens,
        completion_tokens=usage.output_tokens,
        total_tokens=usage.total_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.input_tokens_details.cached_tokens),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=usage.output_tokens_details.reasoning_tokens),
    )


def _token_logprob(logprob: Any) -> dict[str, Any]:
    """A Responses logprob (of a message part, or of a delta event: without `bytes`) as Chat
    Completions writes one."""
    token = logprob.token
    found = getattr(logprob, "bytes", None)
    return {
        "token": token,
        "logprob": logprob.logprob,
        "bytes": list(found) if found is not None else list(token.encode("utf-8", "surrogatepass")),
    }


def _logprobs(items: list[Any]) -> list[dict[str, Any]]:
    return [{**_token_logprob(item), "top_logprobs": [_token_logprob(top) for top in item.top_logprobs or []]} for item in items]


def chat_completion(response: Response, model: str, with_logprobs: bool) -> ChatCompletion:
    """The finished response as a `chat.completion`."""
    content: list[str] = []
    reasoning: list[str] = []
    logprobs: list[Any] = []
    calls: list[dict[str, Any]] = []
    for item in response.output:
        if item.type == "message":
            for part in item.content:
                if part.type == "output_text":
                    content.append(part.text)
                    logprobs += part.logprobs or []
        elif item.type == "reasoning":
            reasoning.append("".join(part.text for part in item.content or []))
        elif item.type == "function_call":
            name = f"{item.namespace}.{item.name}" if item.namespace else item.name
            calls.append({"id": item.call_id, "type": "function", "function": {"name": name, "arguments": item.arguments}})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) if content or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": finish_reason(response),
        "logprobs": {"content": _logprobs(logprobs), "refusal": None} if with_logprobs else None,
    }
    return ChatCompletion.model_validate(
        {
            "id": completion_id(response),
            "object": "chat.completion",
            "created": response.created_at,
            "model": model,
            "choices": [choice],
            "usage": chat_usage(response),
            "service_tier": response.service_tier,
        }
    )


class ChatChunks:
    """A response's events as `chat.completion.chunk`s, one item kind at a time: the role
    first, then reasoning as `reasoning_content`, text as `content`, each function call as a
    `tool_calls` entry with a stable `index` and `id` (name first, then its arguments), and
    last the `finish_reason` (and, asked for, a chunk with the usage and no choices)."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.model = model
        self.include_usage = include_usage
        self._id = ""
        self._created = int(time.time())
        self._calls: dict[str, int] = {}  # function call item id -> its tool_calls index
        self._started = False
        self.failed: dict[str, Any] | None = None  # the error of a response that failed

    def chunks(self, events: list[ResponseStreamEvent]) -> list[ChatCompletionChunk]:
        out: list[ChatCompletionChunk] = []
        for event in merged_deltas(events):
            if event.type == "response.created":
                self._id, self._created = completion_id(event.response), int(event.response.created_at)
                out.append(self._chunk({"role": "assistant", "content": ""}))
            elif event.type == "response.reasoning_text.delta":
                out.append(self._chunk({"reasoning_content": event.delta}))
            elif event.type == "response.output_text.delta":
                logprobs = {"content": _logprobs(event.logprobs), "refusal": None} if event.logprobs else None
                out.append(self._chunk({"content": event.delta}, logprobs=logprobs))
            elif event.type == "response.output_item.added" and event.item.type == "function_call":
                item = event.item
                index = self._calls[item.id or ""] = len(self._calls)
                name = f"{item.namespace}.{item.name}" if item.namespace else item.name
                call = {"index": index, "id": item.call_id, "type": "function", "function": {"name": name, "arguments": ""}}
                out.append(self._chunk({"tool_calls": [call]}))
            elif event.type == "response.function_call_arguments.delta" and event.item_id in self._calls:
                out.append(self._chunk({"tool_calls": [{"index": self._calls[event.item_id], "function": {"arguments": event.delta}}]}))
            elif event.type in ("response.completed", "response.incomplete"):
                out.append(self._chunk({}, finish=finish_reason(event.response)))
                if self.include_usage:
                    out.append(self._chunk(None, usage=chat_usage(event.response)))
            elif event.type == "response.failed":
                self.failed = stream_error(event.response)
        return out

    def frames(self, events: list[ResponseStreamEvent]) -> bytes:
        """The SSE frames of `events`: their chunks, and the error of a response that failed."""
        frames = encode_chunks(self.chunks(events))
        return frames + error_frame(self.failed) if self.failed is not None else frames

    def _chunk(
        self,
        delta: dict[str, Any] | None,
        *,
        finish: FinishReason | None = None,
        logprobs: Any = None,
        usage: CompletionUsage | None = None,
    ) -> ChatCompletionChunk:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]
        return ChatCompletionChunk.model_validate(
            {
                "id": self._id,
                "object": "chat.completion.chunk",
                "created": self._created,
                "model": self.model,
                "choices": choices,
                "usage": usage,
            }
        )


_Delta = ResponseTextDeltaEvent | ResponseReasoningTextDeltaEvent | ResponseFunctionCallArgumentsDeltaEvent


def merged_deltas(events: list[ResponseStreamEvent]) -> list[ResponseStreamEvent]:
    """`events` with each run of deltas of one part (adjacent, same type, item and index) as
    one delta: their text and logprobs joined. A batch holds an engine step's tokens, one delta
    each; a chunk per step, as vLLM writes them, is a fraction of the frames to encode, send
    and parse, and adds up to the same text."""
    out: list[ResponseStreamEvent] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, _Delta) and isinstance(last, _Delta) and _same_part(last, event):
            update: dict[str, Any] = {"delta": last.delta + event.delta}
            if isinstance(event, ResponseTextDeltaEvent) and isinstance(last, ResponseTextDeltaEvent) and event.logprobs:
                update["logprobs"] = [*(last.logprobs or []), *event.logprobs]
            out[-1] = last.model_copy(update=update)
        else:
            out.append(event)
    return out


def _same_part(last: _Delta, event: _Delta) -> bool:
    return (last.type, last.item_id, getattr(last, "content_index", None)) == (
        event.type,
        event.item_id,
        getattr(event, "content_index", None),
    )


def stream_error(response: Response) -> dict[str, Any]:
    """What a Chat Completions or Completions stream sends when its response failed."""
    error = response.error
    return {"message": error.message if error else "The response failed.", "type": "server_error", "code": "server_error"}


def encode_chunks(chunks: list[ChatCompletionChunk]) -> bytes:
    """SSE frames of chunks, the way OpenAI writes them (`data:` lines, no event names)."""
    return b"".join(b"data: " + chunk.model_dump_json(exclude_unset=True).encode() + b"\n\n" for chunk in chunks)


DONE = b"data: [DONE]\n\n"


def error_frame(error: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"

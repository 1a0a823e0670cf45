"""gpt-oss harmony: requests rendered into prompt tokens, completion tokens parsed into items.

Both directions use `openai-harmony`; this module only maps between its messages and the
Responses API's items:

    analysis channel                      <-> reasoning item
    commentary, to=functions.NAME (json)  <-> function_call item (`NS.NAME` for namespaces)
    final channel / commentary preamble   <-> message item (output_text)
    tool message from functions.NAME      <-  function_call_output item
"""

from __future__ import annotations

import datetime
import functools
import json
from dataclasses import dataclass
from typing import Iterable

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyError,
    Message,
    ReasoningEffort,
    Role,
    StreamableParser,
    SystemContent,
    ToolDescription,
    ToolNamespaceConfig,
)

from ..vocab import harmony_encoding
from .constraints import harmony_format, plan, structural_tag
from .errors import invalid_request
from .items import ItemSink
from .request import (
    JSONSchemaFormat,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
)
from .tokens import OutputConstraint

FUNCTIONS_NAMESPACE = "functions"
_EFFORTS = {
    "none": ReasoningEffort.LOW,
    "minimal": ReasoningEffort.LOW,
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
    "xhigh": ReasoningEffort.HIGH,
}

HistoryItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


# --- rendering -----------------------------------------------------------------------------


def recipient_of(name: str, namespace: str | None) -> str:
    return f"{namespace or FUNCTIONS_NAMESPACE}.{name}"


def _tool_description(tool: FunctionTool) -> ToolDescription:
    return ToolDescription.new(tool.name, tool.description or "", parameters=tool.parameters)


def _response_format(request: ResponsesRequest) -> list[str]:
    """harmony's `# Response Formats` section for a json_schema answer (openai-harmony has no
    builder for it: it follows the instructions in the developer message)."""
    fmt = request.text.format if request.text else None
    if not isinstance(fmt, JSONSchemaFormat):
        return []
    description = f"// {fmt.description}\n" if fmt.description else ""
    return [f"# Response Formats\n\n## {fmt.name}\n\n{description}{json.dumps(fmt.schema_)}"]


def _developer_message(request: ResponsesRequest, leading_instructions: list[str]) -> Message | None:
    instructions = "\n\n".join(
        ([request.instructions] if request.instructions else []) + leading_instructions + _response_format(request)
    )
    content = DeveloperContent.new()
    if instructions:
        content = content.with_instructions(instructions)
    if request.offers_tools():
        if functions := request.function_tools():
            content = content.with_function_tools([_tool_description(t) for t in functions])
        for namespace in request.namespace_tools():
            if namespace.functions:
                content = content.with_tools(
                    ToolNamespaceConfig(
                        name=namespace.name,
                        description=namespace.description,
                        tools=[_tool_description(t) for t in namespace.functions],
                    )
                )
    elif not instructions:
        return None
    return Message.from_role_and_content(Role.DEVELOPER, content)


def _history_messages(items: Iterable[HistoryItem]) -> tuple[list[str], list[Message]]:
    """Leading system/developer texts (merged into the developer message) and the rest."""
    leading: list[str] = []
    messages: list[Message] = []
    calls: dict[str, str] = {}  # call_id -> recipient, to address tool outputs
    for index, item in enumerate(items):
        if isinstance(item, MessageItem):
            if item.role in ("system", "developer"):
                if not messages:
                    leading.append(item.text)
                else:
                    content = DeveloperContent.new().with_instructions(item.text)
                    messages.append(Message.from_role_and_content(Role.DEVELOPER, content))
            elif item.role == "user":
                messages.append(Message.from_role_and_content(Role.USER, item.text))
            else:
                messages.append(Message.from_role_and_content(Role.ASSISTANT, item.text).with_channel("final"))
        elif isinstance(item, ReasoningItem):
            if text := item.text:
                messages.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis"))
        elif isinstance(item, FunctionCallItem):
            recipient = recipient_of(item.name, item.namespace)
            calls[item.call_id] = recipient
            messages.append(
                Message.from_role_and_content(Role.ASSISTANT, item.arguments)
                .with_channel("commentary")
                .with_recipient(recipient)
                .with_content_type("<|constrain|>json")
            )
        else:
            recipient = calls.get(item.call_id)
            if recipient is None:
                raise invalid_request(
                    f"No tool call found for function call output with call_id '{item.call_id}'.",
                    param=f"input[{index}].call_id",
                )
            messages.append(
                Message.from_author_and_content(Author.new(Role.TOOL, recipient), item.text)
                .with_channel("commentary")
                .with_recipient("assistant")
            )
    return leading, messages


def render_prompt(
    request: ResponsesRequest, history: list[HistoryItem], today: datetime.date | None = None
) -> list[int]:
    """Prompt token ids for the assistant's next turn. `history` ends with this request's input."""
    effort = _EFFORTS[(request.reasoning.effort if request.reasoning else None) or "medium"]
    today = today or datetime.datetime.now(datetime.timezone.utc).date()
    system = SystemContent.new().with_reasoning_effort(effort).with_conversation_start_date(today.isoformat())
    leading, rest = _history_messages(history)
    messages = [Message.from_role_and_content(Role.SYSTEM, system)]
    if developer := _developer_message(request, leading):
        messages.append(developer)
    messages += rest
    try:
        return harmony_encoding().render_conversation_for_completion(
            Conversation.from_messages(messages), Role.ASSISTANT
        )
    except HarmonyError as exc:
        raise invalid_request(f"The request cannot be rendered for this model: {exc}") from None


def render_completion(messages: list[Message]) -> list[int]:
    """Assistant messages as the model samples them after the prompt's `<|start|>assistant`
    (the replay backend's script; warm-up and tests)."""
    encoding = harmony_encoding()
    tokens: list[int] = []
    for message in messages:
        tokens += encoding.render(message)
    # The prompt already ends with `<|start|>assistant`.
    tokens = tokens[2:]
    if messages[-1].channel == "final":
        (tokens[-1],) = encoding.encode("<|return|>", allowed_special="all")
    return tokens


def stop_token_ids() -> list[int]:
    """Harmony's assistant-action stop tokens: `<|return|>` and `<|call|>`."""
    return harmony_encoding().stop_tokens_for_assistant_actions()


# --- parsing -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Specials:
    message: int  # <|message|>: the header is complete, content follows
    ends: frozenset[int]  # <|end|>, <|return|>, <|call|>: the message is complete

    @classmethod
    @functools.cache
    def load(cls) -> _Specials:
        encoding = harmony_encoding()

        def token(text: str) -> int:
            (token_id,) = encoding.encode(text, allowed_special="all")
            return token_id

        return cls(token("<|message|>"), frozenset(token(t) for t in ("<|end|>", "<|return|>", "<|call|>")))


def _split_recipient(recipient: str) -> tuple[str, str | None]:
    namespace, _, name = recipient.partition(".")
    if not name:
        return recipient, None
    return name, (None if namespace == FUNCTIONS_NAMESPACE else namespace)


def _normalize_recipient(recipient: str | None) -> str | None:
    """A function recipient (`functions.NAME`, `NS.NAME`), or None. harmony's parser reads the
    content type of `<|channel|>final <|constrain|>json` (how a constrained answer starts) as a
    recipient: `<|constrain|>json`, or `json` (vLLM's `_normalize_recipient` strips the same)."""
    if not recipient:
        return None
    recipient = recipient.split("<|constrain|>", 1)[0].strip()
    return recipient if "." in recipient else None


class HarmonyParser:
    """Feeds completion tokens one at a time to harmony's `StreamableParser`.

    The header of a message is complete at `<|message|>`: that is where its item opens
    (the channel and recipient are known). Content deltas go to the open item; an end token
    closes it. Batch boundaries never matter because every token is handled on its own.
    """

    def __init__(self, sink: ItemSink) -> None:
        self._specials = _Specials.load()
        self._sink = sink
        # The Rust parser directly: the Python wrapper adds a call per token on the hot path.
        self._parser = StreamableParser(harmony_encoding(), Role.ASSISTANT)._inner
        self._in_content = False
        self._in_reasoning = False
        self.reasoning_tokens = 0
        self.held_text = ""  # harmony holds back only the bytes of an unfinished character

    def feed(self, token_ids: Iterable[int]) -> None:
        # The hot loop: one harmony call per token and one getter per content token, state
        # in locals; the deltas of the batch are handed to the item in one piece.
        parser, sink = self._parser, self._sink
        process, message, ends = parser.process, self._specials.message, self._specials.ends
        in_content, in_reasoning = self._in_content, self._in_reasoning
        deltas: list[str] = []
        for token in token_ids:
            process(token)
            if in_content:
                if token in ends:
                    if deltas:
                        sink.add_text("".join(deltas))
                        deltas.clear()
                    in_content = in_reasoning = False
                    sink.close_item()
                    continue
                if in_reasoning:
                    self.reasoning_tokens += 1
                delta = parser.last_content_delta
                if delta:
                    deltas.append(delta)
            elif token == message:
                in_reasoning = self._open_item()
                in_content = True
        self._in_content, self._in_reasoning = in_content, in_reasoning
        if deltas:
            sink.add_text("".join(deltas))

    def _open_item(self) -> bool:
        """Open the item the just-completed header announces; True if it is reasoning."""
        parser = self._parser
        recipient = _normalize_recipient(parser.current_recipient)
        channel = parser.current_channel
        if recipient:
            self._sink.open_function_call(*_split_recipient(recipient))
        elif channel == "analysis":
            self._sink.open_reasoning()
            return True
        else:
            self._sink.open_message("commentary" if channel == "commentary" else "final_answer")
        return False

    def end(self) -> None:
        """The engine stopped: let harmony flush what it buffered for the open message."""
        if self._in_content:
            self._parser.process_eos()
            if delta := self._parser.last_content_delta:
                self._sink.add_text(delta)


class HarmonyModel:
    """The gpt-oss family: harmony prompt rendering, stop tokens and the harmony parser."""

    def __init__(self) -> None:
        self.stop_token_ids = stop_token_ids()

    def render_prompt(self, request: ResponsesRequest, history: list[HistoryItem]) -> list[int]:
        return render_prompt(request, history)

    def parser(self, sink: ItemSink, prompt: list[int]) -> HarmonyParser:
        return HarmonyParser(sink)  # harmony completions start in a fresh message whatever the prompt

    def token_bytes(self, token_id: int) -> bytes:
        """A token's bytes in the o200k_harmony encoding (logprobs)."""
        try:
            return bytes(harmony_encoding()._inner.decode_bytes([token_id]))
        except HarmonyError:  # an id past the vocabulary (the model's is padded): no text
            return b""

    def writes_text(self, token_id: int) -> bool:
        try:
            return not harmony_encoding().is_special_token(token_id)
        except HarmonyError:
            return False

    def constraint(self, request: ResponsesRequest, prompt: list[int]) -> OutputConstraint | None:
        """text.format / tool_choice as a structural tag over harmony messages (free analysis)."""
        if (what := plan(request)) is None:
            return None
        return what.constraint(structural_tag(harmony_format(what)))

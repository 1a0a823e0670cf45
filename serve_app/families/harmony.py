"""gpt-oss harmony: requests rendered into prompt tokens, completion tokens parsed into items.

Both directions use `openai-harmony`; this module only maps between its messages and the
Responses API's items:

    analysis channel                      <-> reasoning item
    commentary, to=functions.NAME (json)  <-> function_call item (`NS.NAME` for namespaces)
    commentary, to=functions.NAME (text)  <-> custom_tool_call item (a custom tool: its input)
    final channel / commentary preamble   <-> message item (output_text)
    tool message from functions.NAME      <-  function_call_output item
    call to=LABEL.TOOL, tool message      <-  items of server-side tools (families/hosted.py)
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import regex
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyError,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    RenderOptions,
    Role,
    StreamableParser,
    SystemContent,
    ToolDescription,
    ToolNamespaceConfig,
)

from serve_app.api.errors import invalid_request
from serve_app.api.items import FunctionCallItem, HistoryItem, MessageItem, ReasoningItem
from serve_app.api.request import JSONSchemaFormat, ResponsesRequest
from serve_app.api.tools import CustomTool, FunctionTool
from serve_app.core.items import ItemSink
from serve_app.core.tokens import OutputConstraint
from serve_app.core.utf8 import Utf8Decoder, unfinished_utf8_tail
from serve_app.families.constraints import harmony_grammar, plan
from serve_app.families.hosted import ToolCall, ToolOutput, rendered_items
from serve_app.families.long_runs import break_runs, breaker_for, has_long_run
from serve_app.families.prompt_cache import DEFAULT_MAX_TOKENS, PromptCache
from serve_app.families.vocab import harmony_encoding

FUNCTIONS_NAMESPACE = "functions"
# A header is a few words (`<|channel|>commentary to=functions.NAME <|constrain|>json`: ~10
# tokens); one of this many tokens without `<|message|>` is text the model wrote where a
# header belongs. It is shown then instead of held back to the end of the completion: a
# random model's stream sat without an event for a minute.
MAX_HEADER_TOKENS = 64
_EFFORTS = {
    "none": ReasoningEffort.LOW,
    "minimal": ReasoningEffort.LOW,
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
    "xhigh": ReasoningEffort.HIGH,
}

logger = logging.getLogger(__name__)

__all__ = ["HarmonyModel", "HarmonyParser", "HistoryItem", "render_completion", "render_prompt"]


# --- rendering -----------------------------------------------------------------------------


def recipient_of(name: str, namespace: str | None) -> str:
    return f"{namespace or FUNCTIONS_NAMESPACE}.{name}"


def _tool_description(tool: FunctionTool) -> ToolDescription:
    return ToolDescription.new(tool.name, tool.description or "", parameters=tool.parameters)


_GRAMMAR_NAMES = {"lark": "Lark grammar", "regex": "regular expression"}


def _custom_tool_description(tool: CustomTool) -> ToolDescription:
    """A custom tool as a function of one string (harmony renders `(_: string) => any`),
    whose input the model writes as the whole message."""
    lines = [tool.description or "", "Write the input as the whole message, as plain text (not JSON)."]
    if grammar := tool.grammar:
        lines.append(f"The input must match this {_GRAMMAR_NAMES[grammar.syntax]}:\n{grammar.definition}")
    return ToolDescription.new(tool.name, "\n".join(line for line in lines if line), parameters={"type": "string"})


def _response_format(request: ResponsesRequest) -> list[str]:
    """harmony's `# Response Formats` section for a json_schema answer (openai-harmony has no
    builder for it: it follows the instructions in the developer message)."""
    fmt = request.text.format if request.text else None
    if not isinstance(fmt, JSONSchemaFormat):
        return []
    description = f"// {fmt.description}\n" if fmt.description else ""
    return [f"# Response Formats\n\n## {fmt.name}\n\n{description}{json.dumps(fmt.schema_)}"]


def _developer_message(request: ResponsesRequest, leading_instructions: list[str]) -> Message | None:
    instructions = "\n\n".join(([request.instructions] if request.instructions else []) + leading_instructions + _response_format(request))
    content = DeveloperContent.new()
    if instructions:
        content = content.with_instructions(instructions)
    functions = [_tool_description(t) for t in request.function_tools()] + [_custom_tool_description(t) for t in request.custom_tools()]
    if request.offers_tools() and (functions or any(n.functions for n in request.namespace_tools())):
        if functions:
            content = content.with_function_tools(functions)
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
    for index, item in rendered_items(items):
        if isinstance(item, ToolCall):
            message = (
                Message.from_role_and_content(Role.ASSISTANT, item.arguments).with_channel(item.channel).with_recipient(item.recipient)
            )
            messages.append(message.with_content_type(item.content_type) if item.content_type else message)
        elif isinstance(item, ToolOutput):
            messages.append(tool_message(item))
        elif isinstance(item, MessageItem):
            if item.role in ("system", "developer"):
                if not messages:
                    leading.append(item.text)
                else:
                    content = DeveloperContent.new().with_instructions(item.text)
                    messages.append(Message.from_role_and_content(Role.DEVELOPER, content))
            elif item.role == "user":
                messages.append(Message.from_role_and_content(Role.USER, item.text))
            else:
                # `phase` <-> channel: commentary <-> commentary (a preamble), final_answer or none <-> final.
                channel = "commentary" if item.phase == "commentary" else "final"
                messages.append(Message.from_role_and_content(Role.ASSISTANT, item.text).with_channel(channel))
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
            called = calls.get(item.call_id)
            if called is None:
                raise invalid_request(
                    f"No tool call found for function call output with call_id '{item.call_id}'.",
                    param=f"input[{index}].call_id",
                )
            messages.append(
                Message.from_author_and_content(Author.new(Role.TOOL, called), item.text)
                .with_channel("commentary")
                .with_recipient("assistant")
            )
    return leading, messages


def tool_message(output: ToolOutput) -> Message:
    """A server-side tool's message to the assistant (its output is text: harmony renders
    content as ordinary tokens, never as special ones)."""
    return (
        Message.from_author_and_content(Author.new(Role.TOOL, output.author), output.text)
        .with_channel(output.channel)
        .with_recipient("assistant")
    )


def continue_prompt(prompt: list[int], completion: list[int], new_items: list[HistoryItem]) -> list[int]:
    """The tool loop's next prompt: the last prompt and the completion exactly as the model
    wrote them (ending with its `<|call|>`), the messages of the tools it called, and
    `<|start|>assistant` — so an engine's prefix cache holds all of it but the tools' messages."""
    encoding = harmony_encoding()
    stops = _Specials.load().stops
    if not completion or completion[-1] not in stops:  # an engine that leaves the stop token out
        completion = completion + encoding.encode("<|call|>", allowed_special="all")
    messages = [tool_message(turn) for _, turn in rendered_items(new_items) if isinstance(turn, ToolOutput)]
    return prompt + completion + [token for message in messages for token in render_message(message)] + _next_assistant_turn()


def render_prompt(
    request: ResponsesRequest,
    history: list[HistoryItem],
    today: datetime.date | None = None,
    cache: PromptCache | None = None,
) -> list[int]:
    """Prompt token ids for the assistant's next turn. `history` ends with this request's input.
    With a `cache`, messages it keeps are not tokenized again (the same token ids)."""
    effort = _EFFORTS[(request.reasoning.effort if request.reasoning else None) or "medium"]
    today = today or datetime.datetime.now(datetime.UTC).date()
    system = SystemContent.new().with_reasoning_effort(effort).with_conversation_start_date(today.isoformat())
    if request.tool_choice != "none":
        for builtin in request.builtin_tools():  # gpt-oss's own tools (browser, python) are the system's
            config = ToolNamespaceConfig(
                name=builtin.name, description=builtin.description, tools=[_tool_description(t) for t in builtin.functions]
            )
            system = system.with_tools(config)
    leading, rest = _history_messages(history)
    messages = [Message.from_role_and_content(Role.SYSTEM, system)]
    if developer := _developer_message(request, leading):
        messages.append(developer)
    messages = _without_finished_analysis(messages + rest)
    try:
        if cache is None and not any(map(_has_long_run, messages)):
            conversation = Conversation.from_messages(messages)
            return harmony_encoding().render_conversation_for_completion(conversation, Role.ASSISTANT, _OWN_ANALYSIS_DROP)
        return _render_conversation_for_completion(messages, cache)
    except HarmonyError as exc:
        raise invalid_request(f"The request cannot be rendered for this model: {exc}") from None


_OWN_ANALYSIS_DROP = RenderConversationConfig(auto_drop_analysis=False)  # `_without_finished_analysis` does it


def _without_finished_analysis(messages: list[Message]) -> list[Message]:
    """harmony's own rule (its `auto_drop_analysis`): when the last assistant message is
    final, analysis before the first final message is left out, the reasoning of turns that
    ended. Except gpt-oss's built-in tool calls and the tools' messages (on the analysis
    channel too): a later turn's answer may rest on what the browser or python showed, as on
    a function's output, which harmony keeps."""
    last_assistant = next((m for m in reversed(messages) if m.author.role == Role.ASSISTANT), None)
    first_final = next((i for i, m in enumerate(messages) if m.channel == "final"), None)
    if last_assistant is None or last_assistant.channel != "final" or first_final is None:
        return messages
    return [
        m
        for i, m in enumerate(messages)
        if not (i < first_final and m.channel == "analysis" and m.recipient is None and m.author.role != Role.TOOL)
    ]


def _render_conversation_for_completion(messages: list[Message], cache: PromptCache | None) -> list[int]:
    """`render_conversation_for_completion` message by message, each through `cache` (if
    any): what harmony does (openai-harmony's `render_conversation_into`) with the analysis
    already dropped — every message rendered with `conversation_has_function_tools`, then
    `<|start|>assistant`. tests/families/test_prompt_cache.py holds it equal to harmony's
    own for any conversation without a long run (`render_message`)."""
    options = RenderOptions(conversation_has_function_tools=any(_offers_functions(m) for m in messages))
    if cache is None:
        return [token for m in messages for token in render_message(m, options)] + _next_assistant_turn()
    pieces = [(f"{options.conversation_has_function_tools:d}{m.to_json()}", m) for m in messages]
    return cache.concat(pieces, lambda missing: [render_message(m, options) for m in missing]) + _next_assistant_turn()


# harmony's special tokens (`<|start|>`, `<|message|>` ...) have the ids from here up; text
# never becomes one of them (harmony encodes every text as ordinary tokens).
_FIRST_SPECIAL = 199998


def _strings(value: Any) -> Iterator[str]:
    """Every string in a message's JSON form, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _broken(value: Any, breaker: str) -> Any:
    """A message's JSON form with a breaker inside each long run of each string (long_runs)."""
    if isinstance(value, str):
        return break_runs(value, breaker)
    if isinstance(value, dict):
        return {break_runs(key, breaker): _broken(item, breaker) for key, item in value.items()}
    if isinstance(value, list):
        return [_broken(item, breaker) for item in value]
    return value


def _has_long_run(message: Message) -> bool:
    return any(map(has_long_run, _strings(message.to_dict())))


def render_message(message: Message, options: RenderOptions | None = None) -> list[int]:
    """harmony's render of `message`, in time linear in its size whatever its text.

    harmony tokenizes a text in time quadratic in the length of its longest piece
    (families/long_runs.py): a message whose strings have no long run is harmony's own
    render, token for token. One that has is rendered with a breaker inside each long run
    (a number character no string of the message holds), so harmony's tokenizer sees no
    long piece; then the breakers' tokens are taken out. A breaker is a piece of its own
    (its neighbours are never numbers), so its tokens are always the same few and nothing
    else decodes to it: what is left decodes to harmony's text exactly, and only the tokens
    beside a breaker differ from what harmony's BPE makes of the whole run. Text stays
    text: nothing is encoded with a special token allowed."""
    options = options or RenderOptions()
    encoding = harmony_encoding()
    data = message.to_dict()
    strings = list(_strings(data))
    if not any(map(has_long_run, strings)):
        return encoding.render(message, options)
    breaker = breaker_for(strings)
    if breaker is None:
        raise invalid_request("The request cannot be rendered for this model: a message holds every number character of Unicode.")
    rendered: list[int] = encoding._inner.render(
        message_json=json.dumps(_broken(data, breaker)),
        render_options={"conversation_has_function_tools": options.conversation_has_function_tools},
    )
    tokens = _without(rendered, encoding.encode(breaker, disallowed_special=()))
    if breaker in encoding.decode_utf8(tokens):  # a tokenizer that does not end a piece at it
        return _recoded(rendered, breaker)
    return tokens


def encode_text(text: str) -> list[int]:
    """`text`'s tokens, special tokens' spellings in it as text, in time linear in its size
    (a long run broken as `render_message` breaks it)."""
    encoding = harmony_encoding()
    if not has_long_run(text):
        return encoding.encode(text, disallowed_special=())
    breaker = breaker_for([text])
    if breaker is None:
        raise invalid_request("The text cannot be tokenized for this model: it holds every number character of Unicode.")
    return _without(encoding.encode(break_runs(text, breaker), disallowed_special=()), encoding.encode(breaker, disallowed_special=()))


def _without(tokens: list[int], breaker: list[int]) -> list[int]:
    """`tokens` without each occurrence of the `breaker` tokens."""
    out: list[int] = []
    first, size, start = breaker[0], len(breaker), 0
    while True:
        try:
            found = tokens.index(first, start)
        except ValueError:
            return out + tokens[start:]
        if tokens[found : found + size] == breaker:
            out += tokens[start:found]
            start = found + size
        else:
            out += tokens[start : found + 1]
            start = found + 1


def _recoded(rendered: list[int], breaker: str) -> list[int]:
    """`rendered` with each stretch of text between special tokens that holds a breaker
    decoded, cut at its breakers and encoded again part by part (no part is long)."""
    encoding = harmony_encoding()
    tokens: list[int] = []
    start = 0
    for end in [*(i for i, token in enumerate(rendered) if token >= _FIRST_SPECIAL), len(rendered)]:
        if end > start:
            stretch = rendered[start:end]
            text = encoding.decode_utf8(stretch)
            if breaker in text:
                stretch = [token for part in text.split(breaker) for token in encoding.encode(part, disallowed_special=())]
            tokens += stretch
        if end < len(rendered):
            tokens.append(rendered[end])
        start = end + 1
    return tokens


def _offers_functions(message: Message) -> bool:
    return any(
        isinstance(content, DeveloperContent) and content.tools and bool(getattr(content.tools.get(FUNCTIONS_NAMESPACE), "tools", None))
        for content in message.content
    )


@functools.cache
def _next_assistant_turn() -> list[int]:
    """`<|start|>assistant`, which ends every prompt."""
    encoding = harmony_encoding()
    return encoding.encode("<|start|>", allowed_special="all") + encoding.encode("assistant")


def render_completion(messages: list[Message]) -> list[int]:
    """Assistant messages as the model samples them after the prompt's `<|start|>assistant`
    (the replay backend's script; warm-up and tests), in time linear in their text: the
    replay models echo what they were sent, long runs and all."""
    encoding = harmony_encoding()
    tokens: list[int] = []
    for message in messages:
        tokens += render_message(message)
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
    stops: frozenset[int]  # <|return|>, <|call|>: the engine stopped on it

    @classmethod
    @functools.cache
    def load(cls) -> _Specials:
        encoding = harmony_encoding()

        def token(text: str) -> int:
            (token_id,) = encoding.encode(text, allowed_special="all")
            return token_id

        stops = frozenset(token(t) for t in ("<|return|>", "<|call|>"))
        return cls(token("<|message|>"), stops | {token("<|end|>")}, stops)


_CHANNELS = (None, "analysis", "commentary", "final")
# A recipient that names a tool: `NAME` or `NS.NAME` with identifier-like parts
# (`functions.` or `<|start|>user` name none).
_TOOL_NAME = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*")
_CONTENT_TYPE = re.compile(r"(<\|constrain\|>)?[\w./+-]+")
# A well-formed assistant header (as text), for telling a header the token limit cut from
# garbage; `regex` matches partially (a prefix of a possible match).
_RECIPIENT = r"[A-Za-z_][\w.-]*"
_HEADER = regex.compile(
    rf"(<\|start\|>assistant)?( to={_RECIPIENT})?"
    rf"(<\|channel\|>(analysis|commentary|final)( to={_RECIPIENT})?( ?(<\|constrain\|>)?[\w./+-]+)?)?"
)


def _split_recipient(recipient: str) -> tuple[str, str | None]:
    namespace, _, name = recipient.partition(".")
    if not name:
        return recipient, None
    return name, (None if namespace == FUNCTIONS_NAMESPACE else namespace)


def _without_constrain(recipient: str | None) -> str | None:
    """The recipient without a content type harmony's parser read into it: after the channel,
    `<|constrain|>json` (how a constrained answer starts) comes back as (part of) the
    recipient (vLLM's `_normalize_recipient` strips the same)."""
    if not recipient or "<|constrain|>" not in recipient:
        return recipient
    return recipient.split("<|constrain|>", 1)[0].strip() or None


class _TokenBytes(dict[int, bytes]):
    """Each token's bytes in the o200k_harmony encoding, looked up once (content text and
    logprobs); special tokens as their names (`<|start|>`), as harmony writes them in content.
    A dict, so that the hot path's lookups are C calls (`map(_TOKEN_BYTES.__getitem__, ...)`)."""

    def __missing__(self, token_id: int) -> bytes:
        try:
            raw = bytes(harmony_encoding()._inner.decode_bytes([token_id]))
        except HarmonyError:  # an id past the vocabulary (the model's is padded): no text
            raw = b""
        self[token_id] = raw
        return raw


_TOKEN_BYTES = _TokenBytes()
token_bytes = _TOKEN_BYTES.__getitem__


class HarmonyParser:
    """Feeds completion tokens one at a time to harmony's `StreamableParser`.

    The header of a message is complete at `<|message|>`: that is where its item opens
    (the channel and recipient are known). Content deltas go to the open item; an end token
    closes it. Batch boundaries never matter because every token is handled on its own.

    Nothing the model writes is lost or fatal, however malformed (random weights write
    special tokens in any order). Harmony itself keeps special tokens inside content as
    text; the parser recovers from the rest:
    - a token other than `<|start|>` after a message's end implies the missing `<|start|>`:
      it begins the next header;
    - a header harmony rejects, or whose role, channel, recipient or content type is not
      one an assistant message can have, makes a *raw* message: a `message` item without a
      `phase` whose text is the header as written (special tokens spelled out) followed by
      the content;
    - a header the completion ends in (no `<|message|>` came) becomes a raw message too;
    - so does a header that reaches `MAX_HEADER_TOKENS` (at the first token after which it
      ends on a whole character): what follows is that message's content.
    """

    def __init__(self, sink: ItemSink) -> None:
        self._specials = _Specials.load()
        self._sink = sink
        self._parser = self._new_parser()
        self._header: list[int] = []  # the tokens of the header being read, to show it raw
        self._header_valid = True  # False once harmony rejected the header
        self._in_content = False
        self._in_reasoning = False
        # Content is decoded here from its tokens' bytes, not taken from harmony's content
        # deltas: those lost a message's last token when bytes that are no character came
        # just before it, and an unfinished character at its end (random weights write both).
        self._content = Utf8Decoder()
        self.reasoning_tokens = 0
        self.held_text = ""  # no text is held back: only the bytes of an unfinished character

    @staticmethod
    def _new_parser() -> Any:
        # The Rust parser directly: the Python wrapper adds a call per token on the hot path.
        # It starts in an assistant header (the prompt ends with `<|start|>assistant`).
        return StreamableParser(harmony_encoding(), Role.ASSISTANT)._inner

    def feed(self, token_ids: Iterable[int]) -> None:
        # The hot loop: one harmony call per token, state in locals; an item's content
        # tokens of the batch are turned into bytes, decoded and handed on in one piece.
        parser, sink, decode = self._parser, self._sink, self._content.decode
        process, message, ends = parser.process, self._specials.message, self._specials.ends
        in_content, in_reasoning = self._in_content, self._in_reasoning
        header = self._header
        content: list[int] = []
        for token in token_ids:
            if in_content:
                process(token)  # harmony never rejects content: stray specials are text
                if token in ends:
                    # Bytes of a character the message ends inside: U+FFFD, as a decode shows them.
                    if text := decode(b"".join(map(token_bytes, content)), True):
                        sink.add_text(text)
                    content.clear()
                    in_content = in_reasoning = False
                    sink.close_item()
                    header.clear()
                    continue
                if in_reasoning:
                    self.reasoning_tokens += 1
                content.append(token)
                continue
            header.append(token)
            try:
                process(token)
            except HarmonyError:
                parser = self._parser = self._recover(token)
                process = parser.process
            if token == message:
                in_reasoning = self._open_item()
                in_content = True
            elif len(header) >= MAX_HEADER_TOKENS and self._cut_long_header():
                parser, in_content, in_reasoning = self._parser, True, False
                process = parser.process
        self._in_content, self._in_reasoning = in_content, in_reasoning
        if content and (text := decode(b"".join(map(token_bytes, content)))):
            sink.add_text(text)

    def _recover(self, token: int) -> Any:
        """Harmony rejected `token` outside content; return a fresh parser that has taken it."""
        if len(self._header) > 1:
            # A header harmony cannot parse (at its `<|message|>`): shown raw.
            self._header_valid = False
        # else `token` came where `<|start|>` must: it is the first token of the next header.
        parser = self._new_parser()
        parser.process(token)  # a fresh header takes any token (`<|message|>`: an empty header)
        return parser

    def _cut_long_header(self) -> bool:
        """Show a header too long to be one as a raw message whose content is what follows;
        False while it ends inside a character (the rest of it comes as content)."""
        if unfinished_utf8_tail(b"".join(map(token_bytes, self._header))):
            return False
        self._open_raw()
        self._header.clear()
        self._header_valid = True
        self._parser = self._new_parser()
        self._parser.process(self._specials.message)  # an empty header: content follows
        return True

    def _open_item(self) -> bool:
        """Open the item the just-completed header announces; True if it is reasoning."""
        parser, sink = self._parser, self._sink
        recipient, channel, content_type = _without_constrain(parser.current_recipient), parser.current_channel, parser.current_content_type
        valid, self._header_valid = self._header_valid, True
        if not (
            valid
            and parser.current_role == "assistant"
            and channel in _CHANNELS
            and (not recipient or recipient == "assistant" or self._names_tool(recipient))
            and (content_type is None or _CONTENT_TYPE.fullmatch(content_type))
        ):
            self._open_raw()
        elif recipient and recipient != "assistant":
            # Harmony's python tool takes the code as the message (`to=python code`); calls with
            # `<|constrain|>json` carry JSON arguments.
            sink.open_function_call(*_split_recipient(recipient), json_arguments="json" in (content_type or ""))
        elif channel == "analysis":
            sink.open_reasoning()
            return True
        else:
            sink.open_message("commentary" if channel == "commentary" else "final_answer")
        return False

    def _names_tool(self, recipient: str) -> bool:
        # Harmony also reads stray header words as a recipient (`final blah`): a call needs
        # an identifier-like name written as `to=NAME`.
        return bool(_TOOL_NAME.fullmatch(recipient)) and f"to={recipient}" in harmony_encoding().decode(self._header)

    def _open_raw(self) -> None:
        """A raw message: the header as written, special tokens spelled out (`<|channel|>`)."""
        header = self._header
        logger.warning("harmony: malformed message header %r shown as text", harmony_encoding().decode(header)[:200])
        self._sink.open_message(None)
        self._sink.add_text(harmony_encoding().decode(header))

    def end(self, truncated: bool = False) -> None:
        """The engine stopped. Flush what the decoder holds for the open message; show an
        unfinished header (without the stop token it ended on) as a raw message, unless
        the token limit cut a header that was well-formed so far (`truncated`): nothing
        but structure is lost then."""
        if self._in_content:
            # The model's last bytes that are no character: U+FFFD, as a decode shows them;
            # not when the token limit cut a character (its other bytes were never written).
            unfinished = self._content.decode(b"", True)
            if unfinished and not truncated:
                self._sink.add_text(unfinished)
            return
        header = self._header
        if header and header[-1] in self._specials.stops:
            header.pop()
        if header and not (truncated and _HEADER.fullmatch(harmony_encoding().decode(header), partial=True)):
            self._open_raw()
        header.clear()


class HarmonyModel:
    """The gpt-oss family: harmony prompt rendering, stop tokens and the harmony parser."""

    def __init__(self, prompt_cache_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        self.stop_token_ids = stop_token_ids()
        # None: harmony's own conversation rendering, the whole prompt tokenized every time.
        self.prompt_cache = PromptCache(prompt_cache_tokens) if prompt_cache_tokens else None

    def render_prompt(self, request: ResponsesRequest, history: list[HistoryItem]) -> list[int]:
        return render_prompt(request, history, cache=self.prompt_cache)

    def continue_prompt(
        self, request: ResponsesRequest, history: list[HistoryItem], prompt: list[int], completion: list[int], new_items: list[HistoryItem]
    ) -> list[int]:
        return continue_prompt(prompt, completion, new_items)

    def parser(self, sink: ItemSink, prompt: list[int]) -> HarmonyParser:
        return HarmonyParser(sink)  # harmony completions start in a fresh message whatever the prompt

    def token_bytes(self, token_id: int) -> bytes:
        return token_bytes(token_id)

    def writes_text(self, token_id: int) -> bool:
        try:
            return not harmony_encoding().is_special_token(token_id)
        except HarmonyError:
            return False

    def encode_raw(self, text: str) -> list[int]:
        return encode_text(text)

    def constraint(self, request: ResponsesRequest, prompt: list[int]) -> OutputConstraint | None:
        """text.format / tool_choice as an llguidance grammar over harmony messages (free analysis)."""
        if (what := plan(request)) is None:
            return None
        return what.constraint(harmony_grammar(what))

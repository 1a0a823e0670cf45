"""Models that speak their tokenizer's chat template (Qwen3, DeepSeek-R1 distills, SmolLM2 ...).

The prompt is rendered by `transformers`' `apply_chat_template` with the model's own template
(or one named in the config), in that template's own form: `tools`, prior assistant turns
with their `reasoning_content` and `tool_calls`, `tool` results, system messages. The
completion is parsed by `chat_parser` with the tags of the configured parsers:

    reasoning_parser qwen3 | deepseek_r1   <think> ... </think>            -> reasoning item
    tool_parser      hermes                <tool_call>{json}</tool_call>   -> function_call item
    anything else                                                         -> message item

The parser names are vLLM's (`--reasoning-parser`, `--tool-call-parser`), so a model is
configured here as it would be for `vllm serve`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from jinja2 import TemplateError

from serve_app.api.errors import invalid_request
from serve_app.api.items import (
    FilePart,
    FunctionCallItem,
    FunctionCallOutputItem,
    HistoryItem,
    ImagePart,
    MessageItem,
    ReasoningItem,
    parts_text,
    shows_images,
)
from serve_app.api.request import ResponsesRequest
from serve_app.api.tools import BuiltinTool, CustomTool, FunctionTool, NamespaceTool
from serve_app.core.items import ItemSink
from serve_app.core.tokens import OutputConstraint
from serve_app.families.chat_parser import ChatCompletionParser, TaggedTextParser, Tags, Vocabulary
from serve_app.families.constraints import chat_template_constraint, custom_input_schema, plan
from serve_app.families.control_tokens import ESCAPE, ControlTokens, Piece
from serve_app.families.hosted import ToolCall, ToolOutput, rendered_items
from serve_app.families.prompt_cache import DEFAULT_MAX_TOKENS, PromptCache
from serve_app.families.vision import IMAGE_PAD, VisionSpec

REASONING_PARSERS: dict[str, tuple[str, str]] = {
    "qwen3": ("<think>", "</think>"),
    "deepseek_r1": ("<think>", "</think>"),
}
TOOL_PARSERS: dict[str, tuple[str, str]] = {
    "hermes": ("<tool_call>", "</tool_call>"),
}
TEMPLATES_DIR = Path(__file__).parent / "templates"

logger = logging.getLogger(__name__)


def load_template(template: str) -> str:
    """A built-in template by name (`qwen3`) or a Jinja file by path."""
    builtin = TEMPLATES_DIR / f"{template}.jinja"
    path = builtin if builtin.is_file() else Path(template)
    if not path.is_file():
        names = sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja"))
        raise ValueError(f"chat template {template!r} is neither a built-in ({', '.join(names)}) nor a file")
    return path.read_text()


# Where hermes-style templates (qwen3) put a tool's output: structural tags, as the parsers' are.
TOOL_RESPONSE_TAGS = ("<tool_response>", "</tool_response>")


def _function_schema(tool: FunctionTool, name: str) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": tool.parameters or {"type": "object", "properties": {}}}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _custom_schema(tool: CustomTool) -> dict[str, Any]:
    """A custom tool as a function of one string argument, `input` (a regex grammar is its
    `pattern`; the model's `{"input": ...}` becomes the call's input)."""
    description = [tool.description or "", "Its input is free text, given as the string argument 'input'."]
    if grammar := tool.grammar:
        description.append(
            f"The input must match this {'Lark grammar' if grammar.syntax == 'lark' else 'regular expression'}:\n{grammar.definition}"
        )
    function = {
        "name": tool.name,
        "description": "\n".join(line for line in description if line),
        "parameters": custom_input_schema(tool.grammar),
    }
    return {"type": "function", "function": function}


def _tools(request: ResponsesRequest) -> list[dict[str, Any]]:
    """Function tools as chat templates take them; namespace functions are named `NS.NAME`,
    so are a built-in tool's (`browser.search`); a built-in tool without functions is a
    function itself (`python`, its `{"code": ...}`)."""
    tools = [_function_schema(tool, tool.name) for tool in request.function_tools()]
    tools += [_custom_schema(tool) for tool in request.custom_tools()]
    groups: list[NamespaceTool | BuiltinTool] = [*request.namespace_tools(), *request.builtin_tools()]
    for group in groups:
        tools += [_function_schema(tool, _qualified(tool.name, group.name)) for tool in group.functions]
    for builtin in request.builtin_tools():
        if not builtin.functions:
            tools.append(
                _function_schema(
                    FunctionTool(type="function", name=builtin.name, description=builtin.description, parameters=builtin.parameters),
                    builtin.name,
                )
            )
    return tools


def _qualified(name: str, namespace: str | None) -> str:
    return f"{namespace}.{name}" if namespace else name


def _user_content(item: MessageItem, images: bool) -> str | list[dict[str, Any]]:
    """A message's content as the template takes it: its text, or, for a vision model and a
    message with images, its parts in order (`{"type": "image"}` where an image was: the
    template writes the image's placeholder there, as Qwen-VL's templates do; a file shown
    with its page images is its text, then one for each)."""
    if not images or isinstance(item.content, str) or not shows_images(item.content):
        return item.text
    content: list[dict[str, Any]] = []
    for part in item.content:
        if isinstance(part, ImagePart):
            content.append({"type": "image"})
            continue
        content.append({"type": "text", "text": parts_text([part])})
        if isinstance(part, FilePart):
            content += [{"type": "image"}] * part.page_images
    return content


def conversation(request: ResponsesRequest, history: list[HistoryItem], *, tool_calls: bool, images: bool = False) -> list[dict[str, Any]]:
    """The request as chat messages: instructions and leading system/developer messages merged
    into one system message (many templates take only one, first); reasoning attached to the
    assistant turn it preceded; consecutive calls of one turn in one assistant message.
    `images`: a vision model's, whose user messages hold their images (`_user_content`)."""
    system = [request.instructions] if request.instructions else []
    messages: list[dict[str, Any]] = []
    reasoning: list[str] = []  # reasoning waiting for its assistant turn
    turn: dict[str, Any] | None = None  # the assistant turn calls are still added to
    calls: dict[str, str] = {}  # call_id -> qualified name, for tool results
    for index, item in rendered_items(history):  # server-side tools' items: calls and outputs
        if isinstance(item, ReasoningItem):
            if text := item.text:
                reasoning.append(text)
            continue
        if isinstance(item, (FunctionCallItem, FunctionCallOutputItem, ToolCall, ToolOutput)) and not tool_calls:
            kind = history[index].type
            raise invalid_request(
                f"Model '{request.model}' has no tool-call parser configured, so it cannot take '{kind}' items.",
                param=f"input[{index}]",
            )
        if isinstance(item, MessageItem) and item.role != "assistant":
            turn = None
            if item.role in ("system", "developer") and not messages:
                system.append(item.text)
            else:
                role = "user" if item.role == "user" else "system"
                messages.append({"role": role, "content": _user_content(item, images and role == "user")})
        elif isinstance(item, ToolOutput):
            turn = None
            messages.append({"role": "tool", "tool_call_id": item.call_id, "name": item.chat_name, "content": item.text})
        elif isinstance(item, FunctionCallOutputItem):
            turn = None
            name = calls.get(item.call_id)
            if name is None:
                raise invalid_request(
                    f"No tool call found for function call output with call_id '{item.call_id}'.",
                    param=f"input[{index}].call_id",
                )
            messages.append({"role": "tool", "tool_call_id": item.call_id, "name": name, "content": item.text})
        else:  # an assistant message or a function call: one assistant turn until something else comes
            if turn is None or (isinstance(item, MessageItem) and (turn["content"] or turn.get("tool_calls"))):
                turn = {"role": "assistant", "content": ""}
                messages.append(turn)
            if reasoning:
                turn["reasoning_content"] = "\n\n".join([turn.get("reasoning_content", ""), *reasoning]).lstrip()
                reasoning = []
            if isinstance(item, MessageItem):
                turn["content"] = item.text
            elif isinstance(item, ToolCall):
                turn.setdefault("tool_calls", []).append(
                    {"id": item.call_id, "type": "function", "function": {"name": item.chat_name, "arguments": item.json_arguments()}}
                )
            else:
                name = _qualified(item.name, item.namespace)
                calls[item.call_id] = name
                try:
                    arguments: Any = json.loads(item.arguments)
                except ValueError:
                    arguments = item.arguments  # templates print a string as it is
                turn.setdefault("tool_calls", []).append(
                    {"id": item.call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                )
    if system:
        messages.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return messages


def piece_starts(tokenizer: Any) -> re.Pattern[str] | None:
    """Where a prompt's text may be cut into pieces that tokenize alone as they do within it:
    before each special token that `tokenizer` matches wherever it occurs (an added token
    that eats no whitespace around it, is matched before normalization, and that no other
    added token overlaps), as it splits the text there before anything else. None when there
    is no such token, or when a probe text tokenized in pieces differs from it whole."""
    added = [token.content for token in tokenizer.added_tokens_decoder.values()]

    def overlaps(token: str, other: str) -> bool:  # `other` matched across the start of `token`
        return (token in other and token != other) or any(other.endswith(token[:end]) for end in range(1, len(token)))

    starts = sorted(
        token.content
        for token in tokenizer.added_tokens_decoder.values()
        if token.special
        and not (token.lstrip or token.rstrip or token.single_word or token.normalized)
        and not any(overlaps(token.content, other) for other in added)
    )
    if not starts:
        return None
    pattern = re.compile("(?=" + "|".join(re.escape(token) for token in starts) + ")")
    probe = "".join(f"{token}x\n é 12 {token}{token} y\n\n" for token in starts) + " z"
    pieces = [piece for piece in pattern.split(probe) if piece]
    whole = tokenizer.encode(probe, add_special_tokens=False)
    if [i for piece in pieces for i in tokenizer.encode(piece, add_special_tokens=False)] != whole:
        logger.warning("this tokenizer does not tokenize prompts in pieces as whole: its prompts are not cached")
        return None
    return pattern


class Tokenizer(Protocol):
    """What `ChatTemplateModel` calls of its Hugging Face fast tokenizer (`PreTrainedTokenizerFast`)."""

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> str: ...  # tokenize=False: the text

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...

    def __call__(self, texts: list[str], *, add_special_tokens: bool) -> Mapping[str, list[list[int]]]: ...  # a batch

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool) -> str: ...


class ChatTemplateModel:
    """Rendering, stop tokens and completion parser for one chat-template tokenizer."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        template: str | None = None,
        reasoning_parser: str | None = None,
        tool_parser: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        prompt_cache_tokens: int = DEFAULT_MAX_TOKENS,
        vision: VisionSpec | None = None,
    ) -> None:
        """`vision`: a vision model's (its tokenizer has Qwen-VL's `<|image_pad|>` token: the
        template writes one per image, `count_images` counts them)."""
        if getattr(tokenizer, "backend_tokenizer", None) is None:
            raise ValueError("chat-template models need a fast tokenizer (a tokenizer.json): it decodes the stream")
        self.tokenizer: Tokenizer = tokenizer
        self.template = load_template(template) if template else None
        if not (self.template or getattr(tokenizer, "chat_template", None)):
            raise ValueError("the tokenizer has no chat template: name one in the model's config")
        self.template_kwargs = dict(template_kwargs or {})
        self.vision = vision
        self.image_pad_id: int | None = None
        if vision is not None:
            pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
            if pad is None or pad == tokenizer.unk_token_id or IMAGE_PAD not in tokenizer.get_vocab():
                raise ValueError(f"a vision model's tokenizer needs Qwen-VL's {IMAGE_PAD} token (its image placeholder)")
            self.image_pad_id = pad
        self.tags = Tags(
            think=REASONING_PARSERS[reasoning_parser] if reasoning_parser else None,
            tool_call=TOOL_PARSERS[tool_parser] if tool_parser else None,
        )
        self.stop_token_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        # Special tokens (end of turn ...) are not text, unless a tag is one in this vocabulary.
        tag_ids = {tokenizer.convert_tokens_to_ids(tag) for tag in self.tags.all()}
        self.vocabulary = Vocabulary(tokenizer, skip_ids=set(tokenizer.all_special_ids) - tag_ids)
        self.token_bytes = self.vocabulary.bytes_of  # logprobs
        self.prompt_cache = PromptCache(prompt_cache_tokens) if prompt_cache_tokens else None
        self.piece_start = piece_starts(tokenizer) if self.prompt_cache else None  # None: whole-text encoding
        self.control = ControlTokens(tokenizer, [*self.tags.all(), *(TOOL_RESPONSE_TAGS if self.tags.tool_call else ())])

    def writes_text(self, token_id: int) -> bool:
        return token_id not in self.vocabulary.skip_ids

    def render_prompt(self, request: ResponsesRequest, history: list[HistoryItem]) -> list[int]:
        tool_calls = self.tags.tool_call is not None
        messages = conversation(request, history, tool_calls=tool_calls, images=self.vision is not None)
        if not messages:  # only reasoning, which templates attach to an assistant turn
            raise invalid_request("The input has no message for the model's chat template to render.", param="input")
        # Tools are offered only when calls can be parsed back out of the completion.
        tools = _tools(request) if tool_calls and request.offers_tools() else None
        return self.render_messages(messages, tools)

    def render_messages(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The prompt token ids of chat `messages` (and `tools`, as templates take them) where
        every string in them is text: only the template itself writes control tokens
        (control_tokens.py). Text from a request or a tool reaches a chat-template prompt
        only through here."""
        (messages, tools), protected = self.control.protect((messages, tools))
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                chat_template=self.template,
                add_generation_prompt=True,
                tokenize=False,
                **self.template_kwargs,
            )
        except TemplateError as exc:  # e.g. "roles must alternate": the request's shape, not a server fault
            raise invalid_request(
                f"The model's chat template rejected this conversation: {self.control.restore(exc.message or '')}", param="input"
            ) from exc
        # No string held a spelling: the text is what it always was, its special tokens the template's.
        return self._encode_protected(text) if protected else self.encode(text)

    def count_images(self, prompt: list[int]) -> int:
        """The images a prompt holds: its placeholders' pad tokens (only the template writes
        one: a client's spelling of it is text)."""
        return prompt.count(self.image_pad_id) if self.image_pad_id is not None else 0

    def encode_raw(self, text: str) -> list[int]:
        """A raw prompt's tokens: the text, special tokens' spellings in it as text."""
        return self.control.encode_plain(text)

    def continue_prompt(
        self, request: ResponsesRequest, history: list[HistoryItem], prompt: list[int], completion: list[int], new_items: list[HistoryItem]
    ) -> list[int]:
        """The tool loop's next prompt: the whole conversation rendered again by the template
        (its tool turn is the template's own; the prompt cache tokenizes only what is new)."""
        return self.render_prompt(request, history)

    def encode(self, text: str) -> list[int]:
        """`text`'s token ids (the template wrote any BOS itself), through the prompt cache:
        the text is cut before each special token that starts a piece (`piece_starts`), and
        pieces tokenized before are not tokenized again."""
        if self.piece_start is None or self.prompt_cache is None:
            return self.tokenizer.encode(text, add_special_tokens=False)
        pieces = [piece for piece in self.piece_start.split(text) if piece]
        return self.prompt_cache.concat([(piece, piece) for piece in pieces], self._encode_many)

    def _encode_protected(self, text: str) -> list[int]:
        """The ids of a rendering of protected strings: each control token of the template,
        then the text after it with special tokens split as text (kept apart in the cache
        from pieces tokenized by `encode`)."""
        pieces = [piece for piece in self.control.pieces(text) if piece.special or piece.text]
        if self.prompt_cache is None:
            return [token for ids in self._encode_pieces(pieces) for token in ids]
        return self.prompt_cache.concat([(ESCAPE + piece.special + ESCAPE + piece.text, piece) for piece in pieces], self._encode_pieces)

    def _encode_pieces(self, pieces: list[Piece]) -> list[list[int]]:
        texts = self.control.encode_text([piece.text for piece in pieces])
        return [([self.control.ids[piece.special]] if piece.special else []) + ids for piece, ids in zip(pieces, texts, strict=True)]

    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]  # one call: a batch

    def opens_reasoning(self, prompt: list[int]) -> bool:
        """Whether the prompt ends inside `<think>` (templates that make the model think)."""
        if self.tags.think is None:
            return False
        tail = self.tokenizer.decode(prompt[-16:], skip_special_tokens=False)
        return tail.rstrip().endswith(self.tags.think[0])

    def constraint(self, request: ResponsesRequest, prompt: list[int]) -> OutputConstraint | None:
        """text.format / tool_choice as vLLM structured outputs; reasoning stays free."""
        if (what := plan(request)) is None:
            return None
        # A prompt that closed the think block (thinking off) gets none (vLLM: `is_reasoning_end`).
        think = None if self.closes_reasoning(prompt) else self.tags.think
        engine = chat_template_constraint(
            what, think=think, in_reasoning=self.opens_reasoning(prompt), tool_calls=self.tags.tool_call is not None
        )
        return None if engine is None else what.constraint(engine)

    def closes_reasoning(self, prompt: list[int]) -> bool:
        """Whether the prompt ends with a closed think block (`enable_thinking: false`)."""
        if self.tags.think is None:
            return False
        tail = self.tokenizer.decode(prompt[-16:], skip_special_tokens=False)
        return tail.rstrip().endswith(self.tags.think[1])

    def parser(self, sink: ItemSink, prompt: list[int]) -> ChatCompletionParser:
        return self.completion_parser(sink, in_reasoning=self.opens_reasoning(prompt))

    def completion_parser(self, sink: ItemSink, *, in_reasoning: bool = False) -> ChatCompletionParser:
        return ChatCompletionParser(
            self.vocabulary.detokenizer(),
            TaggedTextParser(sink, self.tags, in_reasoning=in_reasoning),
        )

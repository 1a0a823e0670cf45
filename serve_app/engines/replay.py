"""`gpt-oss-replay`: a scripted gpt-oss that answers with real harmony token ids.

(`replay_qwen3.py` is its chat-template twin; both stream through `ReplayBackend` below.)

It reads the conversation back out of the prompt tokens the ingress rendered (so every
test through it also checks the rendering), picks a completion by the rules of DESIGN.md,
and streams it in seeded engine-like steps of a few tokens:

1. last message is a tool result O from NAME -> analysis, then final `Tool NAME returned: O`;
2. the request offers NAME and the last user text is `call NAME [JSON]` -> analysis
   `Calling NAME.`, then a commentary call `to=functions.NAME` with the JSON (default `{}`);
   NAME may be `NS.NAME`, a function of a namespace: an MCP server's tool `LABEL.TOOL` (the
   tool loop offers those as a namespace) is called `to=LABEL.TOOL`, and its output comes
   back as a tool message from `LABEL.TOOL` (rule 1: `Tool LABEL.TOOL returned: O`);
   the built-in tools (offered in the system message) are called as gpt-oss calls them, on
   the analysis channel: `call browser.search {"query": "..."}` (also `browser.open`,
   `browser.find`) -> `to=browser.search code` with the JSON, `call file_search {"query":
   "..."}` -> `to=file_search code` with the JSON, and `call python CODE` (CODE:
   all the text after `call python `) -> `to=python code` with CODE as the message;
   a custom tool (offered as `type NAME = (_: string) => any;`): `call NAME TEXT` -> a call
   `to=functions.NAME` whose message is TEXT (all the text after `call NAME `);
3. the last user text asks for a compaction summary (`SUMMARY_REQUEST`) or is `What should
   you remember?` -> analysis `Keeping N facts.`, then the conversation's lines that start
   with `Remember:` (in any message, an earlier summary's too), each once, in order (none:
   `Nothing to remember.`): a summary whose facts can be checked, bounded by the facts;
4. otherwise -> analysis `The user wrote N characters.`, then a final message echoing it;
5. a raw prompt (`/v1/completions`: no conversation) -> its own tokens again.

Prompt tokens are counted as cached (`num_cached_tokens`) as vLLM's automatic prefix caching
would find them on this replica (`PrefixCache`: the prompts and the tokens generated after
them), so routing that keeps a conversation on one engine replica — and a tool loop's next
round on the replica of the last — shows in `usage.input_tokens_details.cached_tokens`
without a GPU.

Logprobs, when asked for, tell the script's certainty: every token has logprob 0.0
(probability 1) and is its own only alternative; no other token was possible.

A request's `OutputConstraint` (text.format, tool_choice) is obeyed as a real engine's grammar
would make a model obey it (`obey`): only the functions it allows are called; `required`
calls one even when the user did not ask (the first allowed, with an instance of its argument
schema); a JSON answer schema turns the answer into an instance of it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import cachetools
import jsonschema
import regex
from openai_harmony import Message, Role

from serve_app.api.json_schema import PATTERN_TIMEOUT_S, instance
from serve_app.core.tokens import EngineImage, FinishReason, GenerationRequest, OutputConstraint, TokenBatch, TokenLogprobs
from serve_app.families.compaction import RECALL_REQUEST, REMEMBER, SUMMARY_REQUEST
from serve_app.families.harmony import FUNCTIONS_NAMESPACE, render_completion
from serve_app.families.vocab import harmony_encoding

_NAMESPACE_BLOCK = re.compile(r"^namespace (\w+) \{\n(.*?)^\} // namespace \1", re.M | re.S)
_FUNCTION = re.compile(r"^type ([a-zA-Z0-9_\-]+) = ", re.M)
_CUSTOM_TOOL = re.compile(r"^type ([a-zA-Z0-9_\-]+) = \(_: string\) => any;$", re.M)  # how harmony shows a custom tool
_CALL = re.compile(r"call (\S+)(?: (.*))?", re.S)
_SYSTEM_PYTHON = re.compile(r"^## python$", re.M)  # the python tool's section of the system message
_SYSTEM_FILE_SEARCH = re.compile(r"^## file_search$", re.M)  # file_search's section (a tool of one JSON argument)
PYTHON = "python"
FILE_SEARCH = "file_search"


@dataclass(frozen=True)
class ReplayConfig:
    min_step_tokens: int = 1
    max_step_tokens: int = 4  # like an Eagle draft of 3 fully accepted
    step_delay_s: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.min_step_tokens <= self.max_step_tokens:
            raise ValueError("need 1 <= min_step_tokens <= max_step_tokens")
        if self.step_delay_s < 0:
            raise ValueError("step_delay_s must be >= 0")


class PrefixCache:
    """What vLLM's automatic prefix caching finds of a prompt on one engine: the full blocks
    it starts with that an earlier prompt there computed (a block's key is the hash of all
    tokens up to its end, and the request's `cache_salt`: only the same salt finds them), never
    the last token (vLLM always computes one), the least recently used blocks going first
    beyond `max_blocks`."""

    def __init__(self, block_size: int = 16, max_blocks: int = 1 << 16) -> None:
        self.block_size = block_size
        self._blocks: cachetools.LRUCache[bytes, bool] = cachetools.LRUCache(max_blocks)

    def cached_tokens(self, prompt: list[int], salt: str | None = None) -> int:
        """Tokens of `prompt` (salted with `salt`) found in the cache; its blocks are cached from now on."""
        chain, hits, missed = hashlib.blake2b(b"salt:%s\0" % salt.encode() if salt else b"", digest_size=16), 0, False
        for end in range(self.block_size, len(prompt) + 1, self.block_size):
            chain.update(str(prompt[end - self.block_size : end]).encode())
            key = chain.digest()
            if not missed and self._blocks.get(key):
                hits = end
            else:
                missed = True
                self._blocks[key] = True
        return min(hits, (len(prompt) - 1) // self.block_size * self.block_size)


def _offered_functions(developer_texts: list[str]) -> set[str]:
    """Function names of the rendered tool namespaces: `NAME` in functions, `NS.NAME` elsewhere."""
    names: set[str] = set()
    for text in developer_texts:
        for namespace, body in _NAMESPACE_BLOCK.findall(text):
            for name in _FUNCTION.findall(body):
                names.add(name if namespace == FUNCTIONS_NAMESPACE else f"{namespace}.{name}")
    return names


def _custom_tools(developer_texts: list[str]) -> set[str]:
    return {
        name
        for text in developer_texts
        for namespace, body in _NAMESPACE_BLOCK.findall(text)
        if namespace == FUNCTIONS_NAMESPACE
        for name in _CUSTOM_TOOL.findall(body)
    }


def remembered(texts: list[str]) -> tuple[str, str]:
    """(reasoning, answer) of the summary rule: every `Remember:` line of `texts`, once."""
    facts = list(dict.fromkeys(line.strip() for text in texts for line in text.splitlines() if line.strip().startswith(REMEMBER)))
    return f"Keeping {len(facts)} facts.", "\n".join(facts) or "Nothing to remember."


def _assistant(text: str, channel: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str


@dataclass(frozen=True)
class Answer:
    text: str
    is_json: bool = False


def obey(constraint: OutputConstraint | None, offered: set[str], *, wanted_call: tuple[str, str] | None, answer: str) -> Call | Answer:
    """The script's choice (`wanted_call` or `answer`) made to fit the request's constraint."""
    if constraint is None:
        return Call(*wanted_call) if wanted_call and wanted_call[0] in offered else Answer(answer)
    callable_ = {name: schema for name, schema in constraint.functions.items() if name in offered}
    if constraint.tool_choice != "none":
        if wanted_call and wanted_call[0] in callable_:
            return Call(wanted_call[0], _arguments(wanted_call[1], callable_[wanted_call[0]]))
        if constraint.tool_choice == "required" and callable_:
            name, schema = next(iter(callable_.items()))
            return Call(name, _arguments(None, schema))
    if constraint.answer_schema is not None:
        return Answer(json.dumps(instance(constraint.answer_schema)), is_json=True)
    return Answer(answer)


def _pattern(validator: Any, pattern: str, value: Any, schema: Any) -> Any:
    """jsonschema's `pattern`, in bounded time: `re` has no timeout, and a client's pattern
    (`^(a+)+$`) against its own text (`aaa...a!`) backtracked for hours on the event loop.
    Too slow to tell counts as not matching."""
    if not validator.is_type(value, "string"):
        return
    try:
        found = regex.search(pattern, value, timeout=PATTERN_TIMEOUT_S)
    except (TimeoutError, regex.error):
        found = None
    if found is None:
        yield jsonschema.ValidationError(f"{value!r} does not match {pattern!r} (within {PATTERN_TIMEOUT_S} s)")


_VALIDATOR = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _pattern})


def _arguments(written: str | None, schema: Any) -> str:
    """The arguments as written when they fit the function's schema, else an instance of it."""
    if written is not None and (schema is True or _VALIDATOR(schema).is_valid(json.loads(written))):
        return written
    return json.dumps(instance(schema))


def script_completion(prompt_token_ids: list[int], constraint: OutputConstraint | None = None) -> list[int]:
    """The completion the rules above give for this prompt; a raw prompt (not a conversation
    rendered for the assistant's turn: `/v1/completions`) is continued with itself."""
    encoding = harmony_encoding()
    if prompt_token_ids[-2:] != encoding.encode("<|start|>assistant", allowed_special="all"):
        return [*prompt_token_ids, *encoding.encode("<|return|>", allowed_special="all")]
    # Drop the trailing `<|start|>assistant` the prompt is rendered for completion with.
    conversation = encoding.parse_messages_from_completion_tokens(prompt_token_ids[:-2], role=None)

    def text_of(message: Message) -> str:
        return "".join(getattr(part, "text", "") for part in message.content)

    last = conversation[-1] if conversation else None
    system = [text_of(m) for m in conversation if m.author.role == Role.SYSTEM]
    developer = [text_of(m) for m in conversation if m.author.role == Role.DEVELOPER]
    offered = _offered_functions(developer + system)
    custom = _custom_tools(developer)
    builtin = _offered_functions(system)  # the system message's tools: gpt-oss's own
    if any(_SYSTEM_PYTHON.search(text) for text in system):
        builtin.add(PYTHON)
    if any(_SYSTEM_FILE_SEARCH.search(text) for text in system):
        builtin.add(FILE_SEARCH)
    offered |= builtin
    wanted_call = None
    if last is not None and last.author.role == Role.TOOL:
        name = (last.author.name or "").removeprefix(f"{FUNCTIONS_NAMESPACE}.")
        reasoning, answer = f"The tool {name} returned a result.", f"Tool {name} returned: {text_of(last)}"
    else:
        user_texts = [text_of(m) for m in conversation if m.author.role == Role.USER]
        user_text = user_texts[-1] if user_texts else ""
        reasoning, answer = f"The user wrote {len(user_text)} characters.", user_text
        wanted_call = _wanted_call(user_text, custom)
        if user_text in (SUMMARY_REQUEST, RECALL_REQUEST):
            reasoning, answer = remembered([text_of(m) for m in conversation[:-1]])
    choice = obey(constraint, offered, wanted_call=wanted_call, answer=answer)
    if isinstance(choice, Call) and choice.name in custom:  # its input as the message, no content type
        call = _assistant(choice.arguments, "commentary").with_recipient(f"{FUNCTIONS_NAMESPACE}.{choice.name}")
        return render_completion([_assistant(f"Calling {choice.name}.", "analysis"), call])
    if isinstance(choice, Call) and choice.name in builtin:
        return render_completion([_assistant(f"Calling {choice.name}.", "analysis")]) + _builtin_call(choice)
    if isinstance(choice, Call):
        recipient = choice.name if "." in choice.name else f"{FUNCTIONS_NAMESPACE}.{choice.name}"
        return render_completion(
            [
                _assistant(f"Calling {choice.name}.", "analysis"),
                _assistant(choice.arguments, "commentary").with_recipient(recipient).with_content_type("<|constrain|>json"),
            ]
        )
    final = _assistant(choice.text, "final")
    return render_completion([_assistant(reasoning, "analysis"), final.with_content_type("<|constrain|>json") if choice.is_json else final])


def _wanted_call(user_text: str, custom: set[str] | frozenset[str] = frozenset()) -> tuple[str, str] | None:
    """`call NAME [JSON object]` -> (NAME, JSON); `call python CODE` -> ("python", CODE), and
    `call NAME TEXT` for a custom tool NAME -> (NAME, TEXT); else None."""
    call = _CALL.fullmatch(user_text)
    if call is not None and (call.group(1) == PYTHON or call.group(1) in custom):
        return call.group(1), call.group(2) or ""
    if call is None or not _is_json_object(call.group(2) or "{}"):
        return None
    return call.group(1), call.group(2) or "{}"


def _builtin_call(call: Call) -> list[int]:
    """A call of a built-in tool as gpt-oss writes it: `<|start|>assistant<|channel|>analysis
    to=NAME code<|message|>ARGUMENTS<|call|>` (the arguments are text: a `<|call|>` in a
    program is the characters, as the model writes them)."""
    encoding = harmony_encoding()
    header = encoding.encode(f"<|start|>assistant<|channel|>analysis to={call.name} code<|message|>", allowed_special="all")
    return header + encoding.encode(call.arguments, disallowed_special=()) + encoding.encode("<|call|>", allowed_special="all")


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


class ReplayBackend:
    """The engine interface of `serve_app.engines.Backend`, with a scripted model."""

    def __init__(
        self,
        config: ReplayConfig | None = None,
        script: Callable[[list[int], OutputConstraint | None], list[int]] = script_completion,
        vision_script: Callable[[list[int], OutputConstraint | None, Sequence[EngineImage]], list[int]] | None = None,
    ) -> None:
        """`vision_script`: a model that sees images (`qwen3-vl`) is scripted by this one, which
        is also given the request's images."""
        self.config = config or ReplayConfig()
        self._script = script  # (prompt token ids, constraint) -> completion token ids
        self._vision_script = vision_script
        self._running: set[str] = set()
        self._aborted: set[str] = set()
        self.num_steps = 0  # engine steps produced, over all requests (for tests and benchmarks)
        self.prefix_cache = PrefixCache()

    def num_running(self) -> int:
        return len(self._running)

    async def check_health(self) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._aborted.add(request_id)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenBatch, None]:
        config = self.config
        if self._vision_script is not None:
            tokens = self._vision_script(request.prompt_token_ids, request.constraint, request.images)
        else:
            tokens = self._script(request.prompt_token_ids, request.constraint)
        finish_reason: FinishReason = "stop"
        if request.max_tokens is not None and len(tokens) > request.max_tokens:
            tokens, finish_reason = tokens[: request.max_tokens], "length"
        steps = random.Random(config.seed if request.seed is None else request.seed)
        cached = self.prefix_cache.cached_tokens(request.prompt_token_ids, request.cache_salt)
        self._running.add(request.request_id)
        position = 0
        try:
            position, first = 0, True
            while first or position < len(tokens):
                if request.request_id in self._aborted:
                    return
                if config.step_delay_s:
                    await asyncio.sleep(config.step_delay_s)
                end = position + steps.randint(config.min_step_tokens, config.max_step_tokens)
                step, position = tokens[position:end], end
                self.num_steps += 1
                yield TokenBatch(
                    step,
                    finish_reason=finish_reason if position >= len(tokens) else None,
                    # As vLLM counts a multi-modal prompt: each image's pad token widened into its tokens.
                    num_prompt_tokens=len(request.prompt_token_ids) + request.image_tokens if first else None,
                    num_cached_tokens=cached if first else None,
                    logprobs=None if request.logprobs is None else [(0.0, [(t, 0.0)] if request.logprobs else []) for t in step],
                    prompt_logprobs=_prompt_logprobs(request) if first else None,
                )
                first = False
        finally:
            # What the engine computed stays in its prefix cache: the prompt and the tokens it
            # generated (all but the last, whose KV is never computed), so a tool loop's next
            # round finds all of it but the tool's output.
            self.prefix_cache.cached_tokens(request.prompt_token_ids + tokens[: max(0, position - 1)], request.cache_salt)
            self._running.discard(request.request_id)
            self._aborted.discard(request.request_id)


def _prompt_logprobs(request: GenerationRequest) -> list[TokenLogprobs | None] | None:
    """The script's certainty of the prompt, when asked for: 0.0 for every token but the first."""
    if request.prompt_logprobs is None:
        return None
    top = request.prompt_logprobs
    return [None] + [(0.0, [(t, 0.0)] if top else []) for t in request.prompt_token_ids[1:]]

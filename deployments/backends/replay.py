"""`gpt-oss-replay`: a scripted gpt-oss that answers with real harmony token ids.

(`replay_qwen3.py` is its chat-template twin; both stream through `ReplayBackend` below.)

It reads the conversation back out of the prompt tokens the ingress rendered (so every
test through it also checks the rendering), picks a completion by the rules of DESIGN.md,
and streams it in seeded engine-like steps of a few tokens:

1. last message is a tool result O from NAME -> analysis, then final `Tool NAME returned: O`;
2. the request offers NAME and the last user text is `call NAME [JSON]` -> analysis
   `Calling NAME.`, then a commentary call `to=functions.NAME` with the JSON (default `{}`);
3. otherwise -> analysis `The user wrote N characters.`, then a final message echoing it.

Logprobs, when asked for, tell the script's certainty: every token has logprob 0.0
(probability 1) and is its own only alternative; no other token was possible.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from openai_harmony import Message, Role

from serve_app.protocol.harmony import FUNCTIONS_NAMESPACE, render_completion
from serve_app.protocol.tokens import GenerationRequest, TokenBatch
from serve_app.vocab import harmony_encoding

_NAMESPACE_BLOCK = re.compile(r"^namespace (\w+) \{\n(.*?)^\} // namespace \1", re.M | re.S)
_FUNCTION = re.compile(r"^type ([a-zA-Z0-9_\-]+) = ", re.M)
_CALL = re.compile(r"call (\S+)(?: (.*))?", re.S)


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


def _offered_functions(developer_texts: list[str]) -> set[str]:
    """Function names of the rendered tool namespaces: `NAME` in functions, `NS.NAME` elsewhere."""
    names: set[str] = set()
    for text in developer_texts:
        for namespace, body in _NAMESPACE_BLOCK.findall(text):
            for name in _FUNCTION.findall(body):
                names.add(name if namespace == FUNCTIONS_NAMESPACE else f"{namespace}.{name}")
    return names


def _assistant(text: str, channel: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


def script_completion(prompt_token_ids: list[int]) -> list[int]:
    """The completion the rules above give for this prompt."""
    encoding = harmony_encoding()
    # Drop the trailing `<|start|>assistant` the prompt is rendered for completion with.
    conversation = encoding.parse_messages_from_completion_tokens(prompt_token_ids[:-2], role=None)

    def text_of(message: Message) -> str:
        return "".join(getattr(part, "text", "") for part in message.content)

    last = conversation[-1] if conversation else None
    if last is not None and last.author.role == Role.TOOL:
        name = (last.author.name or "").removeprefix(f"{FUNCTIONS_NAMESPACE}.")
        return render_completion(
            [
                _assistant(f"The tool {name} returned a result.", "analysis"),
                _assistant(f"Tool {name} returned: {text_of(last)}", "final"),
            ]
        )

    user_texts = [text_of(m) for m in conversation if m.author.role == Role.USER]
    user_text = user_texts[-1] if user_texts else ""
    offered = _offered_functions([text_of(m) for m in conversation if m.author.role == Role.DEVELOPER])
    call = _CALL.fullmatch(user_text)
    if call and call.group(1) in offered:
        name, arguments = call.group(1), call.group(2) or "{}"
        if _is_json_object(arguments):
            recipient = name if "." in name else f"{FUNCTIONS_NAMESPACE}.{name}"
            return render_completion(
                [
                    _assistant(f"Calling {name}.", "analysis"),
                    _assistant(arguments, "commentary").with_recipient(recipient).with_content_type("<|constrain|>json"),
                ]
            )

    return render_completion(
        [_assistant(f"The user wrote {len(user_text)} characters.", "analysis"), _assistant(user_text, "final")]
    )


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


class ReplayBackend:
    """The engine interface of `deployments.backends.Backend`, with a scripted model."""

    def __init__(self, config: ReplayConfig | None = None, script: Callable[[list[int]], list[int]] = script_completion) -> None:
        self.config = config or ReplayConfig()
        self._script = script  # prompt token ids -> completion token ids
        self._running: set[str] = set()
        self._aborted: set[str] = set()
        self.num_steps = 0  # engine steps produced, over all requests (for tests and benchmarks)

    def num_running(self) -> int:
        return len(self._running)

    async def check_health(self) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._aborted.add(request_id)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenBatch]:
        config = self.config
        tokens = self._script(request.prompt_token_ids)
        finish_reason = "stop"
        if request.max_tokens is not None and len(tokens) > request.max_tokens:
            tokens, finish_reason = tokens[: request.max_tokens], "length"
        steps = random.Random(config.seed if request.seed is None else request.seed)
        self._running.add(request.request_id)
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
                    num_prompt_tokens=len(request.prompt_token_ids) if first else None,
                    num_cached_tokens=0 if first else None,
                    logprobs=None if request.logprobs is None else [(0.0, [(t, 0.0)] if request.logprobs else []) for t in step],
                )
                first = False
        finally:
            self._running.discard(request.request_id)
            self._aborted.discard(request.request_id)

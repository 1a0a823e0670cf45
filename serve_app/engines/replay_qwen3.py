"""`qwen3-replay`: a scripted Qwen3-style model writing `<think>` and `<tool_call>` text.

The chat-template twin of `gpt-oss-replay` (same rules, same `ReplayBackend` steps). It
reads the conversation back out of the ChatML prompt the ingress rendered with the `qwen3`
template (its turns by their control token ids: a client's text that spells `<|im_end|>` is
text in a turn, as it is to a real model), and writes its completion as text through SmolLM2's real tokenizer, so tags and
multi-byte characters fall across tokens as a real model's would:

1. the last turn is tool results (`<tool_response>`), the last one O, for a call of NAME ->
   `<think>The tool NAME returned a result.</think>` then `Tool NAME returned: O`;
2. the system turn offers NAME (`<tools>`) and the last user text is `call NAME [JSON]` ->
   `<think>Calling NAME.</think>` then `<tool_call>{"name": NAME, "arguments": JSON}</tool_call>`
   (JSON as written, default `{}`); an MCP server's tool is offered as `LABEL.TOOL`, and its
   output comes back as the template's tool turn (rule 1); the built-in tools are offered as
   functions: `call browser.search {"query": "..."}` calls `browser.search`, `call file_search
   {"query": "..."}` calls `file_search`, and `call python
   CODE` calls `python` with `{"code": CODE}` (CODE as it is when it is a JSON object);
   a custom tool (a function of one string `input`): `call NAME TEXT` -> `{"input": TEXT}`;
3. a compaction summary or `What should you remember?` -> the `Remember:` lines, as
   `gpt-oss-replay` writes them;
4. otherwise -> `<think>The user wrote N characters.</think>` then the user text (echo),
   exactly: whitespace at its end is kept (the end of the output is not a tag), and a text
   that starts with whitespace is written with no think block before it (whitespace right
   after `</think>` is the template's formatting, dropped by the parser).
5. a raw prompt (`/v1/completions`: no ChatML turn) -> its own tokens again.

A prompt that already opened `<think>` gets the reasoning without its opening tag (an echo's
leading whitespace then follows `</think>` and is lost, as a real model's would be); one
whose think block is closed (thinking off) gets no reasoning.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from serve_app.core.tokens import EngineImage, OutputConstraint
from serve_app.engines.replay import PYTHON, Call, _is_json_object, _wanted_call, obey, remembered
from serve_app.families.compaction import RECALL_REQUEST, SUMMARY_REQUEST
from serve_app.families.control_tokens import text_tokenizer
from serve_app.families.smollm2 import SMOLLM2, load_tokenizer
from serve_app.families.vision import IMAGE_PAD, smollm2_vision_tokenizer

if TYPE_CHECKING:
    from tokenizers import Tokenizer

_TOOLS = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
_TOOL_CALL_NAME = re.compile(r'<tool_call>\n\{"name": "([^"]+)"')


def _offered_functions(system: str) -> dict[str, bool]:
    """The functions the template shows, by name: True for a custom tool (one string `input`)."""
    block = _TOOLS.search(system)
    if block is None:
        return {}
    functions = [json.loads(line)["function"] for line in block.group(1).split("\n") if line.strip()]
    return {function["name"]: _is_custom(function.get("parameters") or {}) for function in functions}


def _is_custom(parameters: dict[str, Any]) -> bool:
    properties = parameters.get("properties") or {}
    return list(properties) == ["input"] and parameters.get("required") == ["input"] and properties["input"].get("type") == "string"


def _turns(prompt_token_ids: list[int], tokenizer: Any) -> tuple[list[tuple[str, str]], str]:
    """The prompt's closed turns as (role, text), and the text of the turn left open (the
    generation prompt: what the template wrote after `<|im_start|>assistant\n`)."""
    start, end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    turns: list[tuple[str, str]] = []
    turn: list[int] | None = None
    for token in prompt_token_ids:
        if token == start:
            turn = []
        elif token == end and turn is not None:
            role, _, text = tokenizer.decode(turn).partition("\n")
            turns.append((role, text))
            turn = None
        elif turn is not None:
            turn.append(token)
    opened = tokenizer.decode(turn or []).partition("\n")[2]
    return turns, opened


def _answer(turns: list[tuple[str, str]], constraint: OutputConstraint | None) -> tuple[str, str]:
    """(reasoning, answer) the rules give for a rendered prompt's turns."""
    system = turns[0][1] if turns and turns[0][0] == "system" else ""
    last_role, last_text = turns[-1] if turns else ("", "")
    results = _TOOL_RESPONSE.findall(last_text) if last_role == "user" else []
    offered = _offered_functions(system)
    wanted_call = None
    if results:
        calls = [name for role, text in turns if role == "assistant" for name in _TOOL_CALL_NAME.findall(text)]
        name = calls[-1] if calls else "unknown"
        reasoning, answer = f"The tool {name} returned a result.", f"Tool {name} returned: {results[-1]}"
    else:
        user_texts = [text for role, text in turns if role == "user" and not _TOOL_RESPONSE.search(text)]
        user_text = user_texts[-1] if user_texts else ""
        reasoning, answer = f"The user wrote {len(user_text)} characters.", user_text
        wanted_call = _wanted_call(user_text, {name for name, custom in offered.items() if custom})
        if user_text in (SUMMARY_REQUEST, RECALL_REQUEST):
            reasoning, answer = remembered([text for _, text in turns[:-1]])
    choice = obey(constraint, set(offered), wanted_call=wanted_call, answer=answer)
    if isinstance(choice, Call):
        # `call python CODE` and `call NAME TEXT` of a custom tool: one string argument.
        key = "code" if choice.name == PYTHON else "input" if offered.get(choice.name) else None
        arguments = json.dumps({key: choice.arguments}) if key and not _is_json_object(choice.arguments) else choice.arguments
        return f"Calling {choice.name}.", f'<tool_call>\n{{"name": "{choice.name}", "arguments": {arguments}}}\n</tool_call>'
    return reasoning, choice.text


def script_qwen3_completion(prompt_token_ids: list[int], constraint: OutputConstraint | None = None) -> list[int]:
    tokenizer = load_tokenizer(SMOLLM2)
    if tokenizer.convert_tokens_to_ids("<|im_start|>") not in prompt_token_ids:  # a raw prompt: continued with itself
        return [*prompt_token_ids, tokenizer.eos_token_id]
    turns, opened = _turns(prompt_token_ids, tokenizer)
    return _written(*_answer(turns, constraint), opened, tokenizer.eos_token_id)


def script_qwen3_vl_completion(
    prompt_token_ids: list[int], constraint: OutputConstraint | None = None, images: Sequence[EngineImage] = ()
) -> list[int]:
    """`qwen3-vl-replay`: the qwen3 rules, and one more before the echo (rule 4): when the
    last user turn holds images (their placeholders' pad tokens; the prompt holds one per
    image of the request, in order) -> `<think>The user showed N images.</think>` then
    `I see N images: WxH, WxH.`, each image at the size the model sees it. A prompt whose
    placeholders are not as many as the request's images gets an answer that says so."""
    tokenizer = smollm2_vision_tokenizer()
    start, pad = tokenizer.convert_tokens_to_ids(["<|im_start|>", IMAGE_PAD])
    if start not in prompt_token_ids:
        return [*prompt_token_ids, tokenizer.eos_token_id]
    turns, opened = _turns(prompt_token_ids, tokenizer)
    starts = [index for index, token in enumerate(prompt_token_ids) if token == start]
    last_closed = prompt_token_ids[starts[-2] : starts[-1]] if len(starts) >= 2 else []  # before the generation prompt
    asked = bool(turns) and turns[-1][0] == "user" and not _TOOL_RESPONSE.search(turns[-1][1])
    shown = last_closed.count(pad) if asked else 0
    placeholders = prompt_token_ids.count(pad)
    if placeholders != len(images):
        reasoning = "The prompt and the images disagree."
        answer = f"The prompt holds {placeholders} image placeholders for {len(images)} images."
    elif shown and constraint is None:
        noun = "image" if shown == 1 else "images"
        sizes = ", ".join(f"{image.width}x{image.height}" for image in images[len(images) - shown :])
        reasoning, answer = f"The user showed {shown} {noun}.", f"I see {shown} {noun}: {sizes}."
    else:  # a constrained answer (tools, a format) follows the qwen3 rules
        reasoning, answer = _answer(turns, constraint)
    return _written(reasoning, answer, opened, tokenizer.eos_token_id)


def _written(reasoning: str, answer: str, opened: str, eos_token_id: int) -> list[int]:
    """The completion's tokens: the think block (as the prompt left it) and the answer."""
    if "</think>" in opened or (answer[:1].isspace() and "<think>" not in opened):
        text = answer  # thinking off, or an answer whose leading whitespace must survive
    elif "<think>" in opened:  # the template opened the think block
        text = f"{reasoning}\n</think>\n\n{answer}"
    else:
        text = f"<think>\n{reasoning}\n</think>\n\n{answer}"
    # A text that spells a special token is written as text, as a model writes it.
    return [*_text_tokenizer().encode(text, add_special_tokens=False).ids, eos_token_id]


@functools.cache
def _text_tokenizer() -> Tokenizer:
    return text_tokenizer(load_tokenizer(SMOLLM2))

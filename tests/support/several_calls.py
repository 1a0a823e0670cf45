"""Replay scripts that make several tool calls in one response, for the tool loop's tests of
what only shows with more than one call (parallel_tool_calls, max_tool_calls across rounds, a
function call next to a server-side one, several approvals).

The last user message holds one `call NAME [JSON]` per line (two lines or more; one line is
the replay models' own rule, which these scripts fall back to, as for everything else):

- `gpt-oss` (`harmony_calls_in_turn`): harmony calls one tool per round (`<|call|>` stops
  the generation), so the model calls line k once k tool outputs followed the user's message,
  and answers as the replay model does once every line was called;
- `qwen3` (`qwen3_calls_at_once`): a Qwen3-style model calls them all in one completion, one
  `<tool_call>` block after the other, and answers the tool turn as the replay model does.
"""

from __future__ import annotations

import json

from openai_harmony import Message, Role

from serve_app.core.tokens import OutputConstraint
from serve_app.engines.replay import _wanted_call, script_completion
from serve_app.engines.replay_qwen3 import _text_tokenizer, _turns, script_qwen3_completion
from serve_app.families.harmony import FUNCTIONS_NAMESPACE, render_completion
from serve_app.families.smollm2 import SMOLLM2, load_tokenizer
from serve_app.families.vocab import harmony_encoding


def _calls(user_text: str) -> list[tuple[str, str]]:
    """The calls of a user message of several `call ...` lines ([] for anything else)."""
    lines = user_text.splitlines()
    calls = [_wanted_call(line) for line in lines]
    if len(lines) < 2 or None in calls:
        return []
    return [call for call in calls if call is not None]


def harmony_calls_in_turn(prompt_token_ids: list[int], constraint: OutputConstraint | None = None) -> list[int]:
    conversation = harmony_encoding().parse_messages_from_completion_tokens(prompt_token_ids[:-2], role=None)
    users = [index for index, message in enumerate(conversation) if message.author.role == Role.USER]
    if users:
        user = conversation[users[-1]]
        calls = _calls("".join(getattr(part, "text", "") for part in user.content))
        done = sum(message.author.role == Role.TOOL for message in conversation[users[-1] :])
        if done < len(calls):
            name, arguments = calls[done]
            recipient = name if "." in name else f"{FUNCTIONS_NAMESPACE}.{name}"
            return render_completion(
                [
                    Message.from_role_and_content(Role.ASSISTANT, f"Calling {name}.").with_channel("analysis"),
                    Message.from_role_and_content(Role.ASSISTANT, arguments)
                    .with_channel("commentary")
                    .with_recipient(recipient)
                    .with_content_type("<|constrain|>json"),
                ]
            )
    return script_completion(prompt_token_ids, constraint)


def qwen3_calls_at_once(prompt_token_ids: list[int], constraint: OutputConstraint | None = None) -> list[int]:
    tokenizer = load_tokenizer(SMOLLM2)
    turns, opened = _turns(prompt_token_ids, tokenizer)
    role, text = turns[-1] if turns else ("", "")
    calls = _calls(text) if role == "user" and "<tool_response>" not in text else []
    if not calls:
        return script_qwen3_completion(prompt_token_ids, constraint)
    blocks = "\n".join(
        f"<tool_call>\n{json.dumps({'name': name, 'arguments': json.loads(arguments)})}\n</tool_call>" for name, arguments in calls
    )
    if "</think>" in opened:  # thinking off
        completion = blocks
    else:
        completion = f"{'' if '<think>' in opened else '<think>'}\nCalling {len(calls)} tools.\n</think>\n\n{blocks}"
    return [*_text_tokenizer().encode(completion, add_special_tokens=False).ids, tokenizer.eos_token_id]

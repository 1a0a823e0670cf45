"""What a completion must obey (`text.format`, `tool_choice`), as an engine constraint.

`plan()` reads the request: the schema the answer must match (json_schema, json_object), and
which functions may be called, whether one must be (`required`, a named function,
`allowed_tools`, a hosted tool such as `{"type": "file_search"}`) or none may (`none`). The
server's own tools (file_search, the browser, python) are functions of the plan like the
client's: a hosted `tool_choice` forces a call of that tool. Each model family turns the
plan into vLLM structured outputs (`StructuredOutputsParams` keyword arguments): an xgrammar
**structural tag** that leaves the reasoning free and constrains only what follows it, the
way vLLM 0.32 does it —

- harmony (gpt-oss): the shape of vLLM's `vllm/parser/harmony.py` tags (an optional
  `analysis` message, then (when calls are allowed) an optional commentary preamble, then one
  of: a `final` message whose body is the JSON schema (or any text), or a call
  `to=functions.NAME` whose body is the function's argument schema), written as an llguidance
  grammar in which harmony's special tokens are tokens, never text (see `harmony_grammar`).
- chat templates (hermes tool calls, `<think>` reasoning): vLLM's `hermes` tags
  (`<tool_call>\\n{"name": "NAME", "arguments": ` + arguments + `}\\n</tool_call>`), after a
  free `<think>...</think>` block (opened by the prompt, or optional). vLLM gates reasoning
  with an engine-wide `reasoning_parser`; here the gate is part of the per-request grammar,
  so one engine serves thinking and non-thinking templates alike.
Every JSON body (answer, arguments) allows at most one whitespace character between tokens
(see `JSON_MAX_WHITESPACE`; harmony: `LLGUIDANCE_JSON_OPTIONS`), which vLLM's tags do not bound.

The constraint also travels in plain form (answer schema, callable functions) so that the
scripted replay models obey it too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from serve_app.api.errors import invalid_request
from serve_app.api.json_schema import UnsupportedSchema, check_schema
from serve_app.api.request import ResponsesRequest
from serve_app.api.tools import (
    AllowedToolsChoice,
    CustomGrammarFormat,
    CustomTool,
    FunctionTool,
    HostedChoice,
    NamedCustomChoice,
    NamedFunctionChoice,
    server_tool_kind,
)
from serve_app.core.tokens import OutputConstraint
from serve_app.families.custom_grammar import check_grammar, grammar_rules

CallMode = Literal["auto", "required", "none"]


@dataclass(frozen=True, slots=True)
class CustomInput:
    """What a custom tool's input must match: its grammar (None: any text)."""

    grammar: CustomGrammarFormat | None
    param: str  # where the request gave it: `tools[3].format.definition`


@dataclass(frozen=True, slots=True)
class BuiltinCall:
    """A function of the plan that is a built-in tool's (`browser.search`, `python`, `file_search`)."""

    serves: str  # the request's tool type it runs (`server_tool_kind`)
    text_argument: str | None  # harmony: the message is this argument's text (python's code), not JSON


@dataclass(frozen=True, slots=True)
class Plan:
    answer: dict[str, Any] | None  # JSON schema of the answer; None: free text
    calls: CallMode
    functions: dict[str, Any]  # qualified name -> argument schema (True: any JSON) that may be called
    single_call: bool  # at most one call (a named function, parallel_tool_calls false)
    custom: dict[str, CustomInput] = field(default_factory=dict)  # custom tools that may be called, by name
    builtin: dict[str, BuiltinCall] = field(default_factory=dict)  # which `functions` are built-in tools'

    def constraint(self, engine: dict[str, Any]) -> OutputConstraint:
        # A built-in tool that takes its argument as text (python) takes any text, in plain terms too.
        functions = {
            name: True if name in self.builtin and self.builtin[name].text_argument else schema for name, schema in self.functions.items()
        }
        functions |= dict.fromkeys(self.custom, True)
        return OutputConstraint(engine=engine, answer_schema=self.answer, tool_choice=self.calls, functions=functions)


def _arguments_schema(tool: FunctionTool) -> Any:
    """A strict (or unmarked) tool's parameters, when they are enforceable; else any JSON."""
    if tool.strict is False or tool.parameters is None:
        return True
    try:
        check_schema(tool.parameters)
    except (UnsupportedSchema, ValueError):
        return True
    return tool.parameters


def callable_functions(request: ResponsesRequest) -> dict[str, Any]:
    functions = {tool.name: _arguments_schema(tool) for tool in request.function_tools()}
    for namespace in request.namespace_tools():
        functions.update({f"{namespace.name}.{tool.name}": _arguments_schema(tool) for tool in namespace.functions})
    return functions


def builtin_calls(request: ResponsesRequest) -> dict[str, tuple[Any, BuiltinCall]]:
    """The built-in tools the tool loop offers, as functions: `NAME.FUNCTION` (the browser's),
    or the tool itself (`python`, `file_search`), with their argument schemas (the server's
    own: not checked per request as a client's are)."""
    calls: dict[str, tuple[Any, BuiltinCall]] = {}
    for tool in request.builtin_tools():
        call = BuiltinCall(tool.serves, tool.text_argument)
        if tool.functions:
            calls.update({f"{tool.name}.{function.name}": (_own_schema(function.parameters), call) for function in tool.functions})
        else:
            calls[tool.name] = (_own_schema(tool.parameters), call)
    return calls


def _own_schema(parameters: dict[str, Any] | None) -> Any:
    return parameters if parameters is not None else True


def callable_custom_tools(request: ResponsesRequest) -> dict[str, CustomInput]:
    return {
        tool.name: CustomInput(tool.grammar, f"tools[{index}].format.definition")
        for index, tool in enumerate(request.tools)
        if isinstance(tool, CustomTool)
    }


def custom_input_schema(grammar: CustomGrammarFormat | None) -> dict[str, Any]:
    """A custom tool as a chat-template function: one string argument `input` (a regex
    grammar is its `pattern`)."""
    text: dict[str, Any] = {"type": "string"}
    if grammar is not None and grammar.syntax == "regex":
        text["pattern"] = grammar.definition
    return {"type": "object", "properties": {"input": text}, "required": ["input"], "additionalProperties": False}


def _any_strict(functions: dict[str, Any]) -> bool:
    return any(schema is not True for schema in functions.values())


def plan(request: ResponsesRequest) -> Plan | None:
    """What to enforce for this request; None when nothing is (free text, `tool_choice: auto`
    without a strict function). As in the OpenAI API, a strict function's arguments follow
    its schema whatever `tool_choice` says: under `auto` the model may still answer instead,
    and a call it makes is to a function of the request, with valid arguments."""
    fmt = request.text.format if request.text else None
    answer: dict[str, Any] | None = None
    if fmt is not None and fmt.type == "json_schema":
        answer = fmt.schema_
    elif fmt is not None and fmt.type == "json_object":
        answer = {"type": "object"}
    builtin_tools = builtin_calls(request)
    builtin = {name: call for name, (_, call) in builtin_tools.items()}
    functions = callable_functions(request) | {name: schema for name, (schema, _) in builtin_tools.items()}
    custom = callable_custom_tools(request)
    choice = request.tool_choice
    calls: CallMode = "auto"
    single = not request.parallel_tool_calls
    if choice == "none":
        calls, functions, custom = "none", {}, {}
    elif choice == "required":
        calls = "required"
    elif isinstance(choice, NamedFunctionChoice):
        calls, functions, custom, single = "required", {choice.name: functions[choice.name]}, {}, True
    elif isinstance(choice, NamedCustomChoice):
        calls, functions, custom, single = "required", {}, {choice.name: custom[choice.name]}, True
    elif isinstance(choice, HostedChoice):
        kind = server_tool_kind(choice.type)
        if forced := {n: s for n, s in functions.items() if n in builtin and builtin[n].serves == kind}:
            calls, functions, custom, single = "required", forced, {}, True
        # else a hosted tool the server does not run (here): nothing to force
    elif isinstance(choice, AllowedToolsChoice):
        allowed = {(tool.type, tool.name) for tool in choice.tools}
        hosted = {server_tool_kind(tool.type) for tool in choice.tools}
        calls = choice.mode
        functions = {n: s for n, s in functions.items() if ("function", n) in allowed or (n in builtin and builtin[n].serves in hosted)}
        custom = {n: g for n, g in custom.items() if ("custom", n) in allowed}
    grammars = any(tool.grammar is not None for tool in custom.values())
    # The server's own tools' schemas are enforced only when something else is (they are not strict functions).
    clients = {n: s for n, s in functions.items() if n not in builtin}
    if answer is None and calls == "auto" and not isinstance(choice, AllowedToolsChoice) and not _any_strict(clients) and not grammars:
        return None  # free text, and calls whose arguments may be any JSON (any text)
    if calls == "none" and answer is None and not callable_functions(request) and not request.custom_tools():
        return None  # no tools in the request: nothing to forbid
    return Plan(answer, calls, functions, single, custom, {n: c for n, c in builtin.items() if n in functions})


# --- xgrammar structural-tag formats (plain dicts: the protocol does not import xgrammar) ---


def _tag(begin: str, content: dict[str, Any], end: str | list[str]) -> dict[str, Any]:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


# At most one whitespace character between JSON tokens. xgrammar otherwise allows any run of
# whitespace, and small models (SmolLM2 here) fill `max_output_tokens` with newlines between
# the keys of an unfinished object. vLLM's remedy, `disable_any_whitespace`, is engine-wide;
# this is the same per request.
JSON_MAX_WHITESPACE = 1


def _json(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": JSON_MAX_WHITESPACE}


def _any_text(excludes: list[str] | None = None) -> dict[str, Any]:
    return {"type": "any_text", "excludes": excludes} if excludes else {"type": "any_text"}


def _seq(*elements: dict[str, Any]) -> dict[str, Any]:
    return {"type": "sequence", "elements": list(elements)}


def _or(elements: list[dict[str, Any]]) -> dict[str, Any]:
    return elements[0] if len(elements) == 1 else {"type": "or", "elements": elements}


def _optional(content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "optional", "content": content}


def structural_tag(fmt: dict[str, Any]) -> dict[str, Any]:
    """vLLM `StructuredOutputsParams` keyword arguments for one structural-tag format."""
    return {"structural_tag": json.dumps({"type": "structural_tag", "format": fmt})}


# --- harmony: a Lark grammar for llguidance, with harmony's special tokens as tokens ---
#
# vLLM's own harmony tags (`vllm/parser/harmony.py`) are xgrammar structural tags over *text*:
# xgrammar sees `<|channel|>` as the string it decodes to, so a model may spell a header with
# ordinary tokens (`<|` `channel` `|>`), which the harmony parser then reads as message text,
# and may write a special token such as `<|end|>` inside a JSON string, which ends the message
# mid-answer (tests/families/test_constraints.py shows both; under those tags every schema answer of
# the random tiny gpt-oss came out as a raw message).
# llguidance keeps special tokens apart from text: `<|channel|>` in a grammar is that one
# token id, and no text rule (a JSON string, free analysis) can produce a special token. So
# harmony constraints are llguidance grammars (vLLM `StructuredOutputsParams(grammar=...)`,
# the engine's structured-outputs backend `guidance`); the shape is vLLM's: an optional free
# `analysis` message, an optional commentary preamble when calls are allowed, then a `final`
# message or a call `to=functions.NAME` (`json` / `<|constrain|>json`) in any of vLLM's header
# orders, ending at its stop token. One header vLLM allows is left out: `<|channel|>final
# json<|message|>`, which harmony reads as a message to a recipient `json`, not a final answer
# (the random tiny gpt-oss wrote it); a final answer is `final<|message|>` or
# `final <|constrain|>json<|message|>`.

# Formats llguidance does not know (xgrammar does): 400 for an answer, any JSON for arguments.
LLGUIDANCE_UNKNOWN_FORMATS = frozenset({"uri-reference", "uri-template", "json-pointer", "relative-json-pointer"})
# JSON bodies as `json.dumps` writes them: no whitespace run for a small model to fill.
LLGUIDANCE_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
HARMONY_GRAMMAR_HEAD = r"""
analysis: <|channel|> "analysis" <|message|> TEXT <|end|> <|start|> "assistant"
preamble: <|channel|> "commentary" <|message|> TEXT <|end|> <|start|> "assistant"
TEXT: /(?s:.*)/
constrain: " json" | " " <|constrain|> "json"
builtin_constrain: " code" | " " <|constrain|> "code" | constrain
final_header: <|channel|> "final" (" " <|constrain|> "json")? <|message|>
call_channel: <|channel|> ("commentary" | "analysis" | "final")
"""


def _unknown_format(schema: Any) -> str | None:
    if isinstance(schema, dict):
        if isinstance(fmt := schema.get("format"), str) and fmt in LLGUIDANCE_UNKNOWN_FORMATS:
            return fmt
        schema = list(schema.values())
    if isinstance(schema, list):
        return next((fmt for item in schema if (fmt := _unknown_format(item))), None)
    return None


def _lark_json(schema: Any) -> str:
    if schema is True:
        schema = {}
    return "%json " + json.dumps({**schema, "x-guidance": LLGUIDANCE_JSON_OPTIONS})


def harmony_grammar(plan: Plan) -> dict[str, Any]:
    """vLLM structured-output kwargs: free analysis first (harmony keeps reasoning
    unconstrained), then the answer or a call."""
    if plan.answer is not None and (fmt := _unknown_format(plan.answer)):
        raise invalid_request(f"string format '{fmt}' is not supported for this model's structured outputs.", param="text.format.schema")
    rules: list[str] = []
    options: list[str] = []
    if plan.calls != "required":
        options.append("final")
        if plan.answer is not None:
            rules.append("final: final_header answer (<|end|> | <|return|>)")
            rules.append(f"answer: {_lark_json(plan.answer)}")
        else:
            rules.append("final: final_header TEXT (<|end|> | <|return|>)")
    calls = plan.functions if plan.calls != "none" else {}
    for i, (name, arguments) in enumerate(calls.items()):
        builtin = plan.builtin.get(name)
        # gpt-oss's own tools are `to=python` / `to=browser.search`, content type `code`; the request's are `functions.NAME`.
        recipient = json.dumps(" to=" + (name if "." in name or builtin else f"functions.{name}"))
        content = "builtin_constrain" if builtin else "constrain"
        options.append(f"call_{i}")
        rules.append(
            f"call_{i}: ({recipient} call_channel | call_channel {recipient}) {content} <|message|> arguments_{i} (<|call|> | <|end|>)"
        )
        if builtin is not None and builtin.text_argument:
            rules.append(f"arguments_{i}: TEXT")
        else:
            rules.append(f"arguments_{i}: {_lark_json(True if _unknown_format(arguments) else arguments)}")
    custom = plan.custom if plan.calls != "none" else {}
    for i, (name, tool) in enumerate(custom.items()):
        # A custom tool's input is the message as written (no `<|constrain|>json`).
        recipient = json.dumps(f" to=functions.{name}")
        options.append(f"custom_{i}")
        rules.append(f"custom_{i}: ({recipient} call_channel | call_channel {recipient}) <|message|> input_{i} (<|call|> | <|end|>)")
        if tool.grammar is None:
            rules.append(f"input_{i}: TEXT")
        else:
            start, definition = grammar_rules(tool.grammar, i, tool.param)
            rules += [f"input_{i}: {start}", *definition]
    if not options:
        raise invalid_request("tool_choice leaves no function this model may call.", param="tool_choice")
    start = "start: analysis? " + ("preamble? " if calls or custom else "") + "(" + " | ".join(options) + ")"
    grammar_text = "\n".join([start, HARMONY_GRAMMAR_HEAD.strip(), *rules]) + "\n"
    if with_grammar := [tool for tool in custom.values() if tool.grammar is not None]:
        check_grammar(grammar_text, with_grammar[0].param if len(with_grammar) == 1 else "tools")
    return {"grammar": grammar_text}


HERMES_CALL_BEGINS = [('<tool_call>\n{"name": "', "}\n</tool_call>"), ('<tool_call>{"name": "', "}</tool_call>")]
TOOL_CALL_TAG = "<tool_call>"


def _hermes_calls(functions: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        _tag(begin + name + '", "arguments": ', _json(arguments), end)
        for name, arguments in functions.items()
        for begin, end in HERMES_CALL_BEGINS
    ]


def chat_template_constraint(plan: Plan, *, think: tuple[str, str] | None, in_reasoning: bool, tool_calls: bool) -> dict[str, Any] | None:
    """vLLM structured-output kwargs for a chat-template model: `think` are its reasoning tags
    (reasoning stays free: opened by the prompt, or optional), `tool_calls` whether it has
    the hermes tool parser. None when there is nothing to enforce."""
    options: list[dict[str, Any]] = []
    calls = plan.functions if plan.calls != "none" and tool_calls else {}
    if plan.calls != "none" and tool_calls:
        for name, tool in plan.custom.items():
            if tool.grammar is not None and tool.grammar.syntax == "lark":
                raise invalid_request(
                    f"Custom tool '{name}': Lark grammars are supported for gpt-oss (harmony) models; "
                    "this model's structured outputs take a 'regex' grammar.",
                    param=tool.param,
                )
        calls = {**calls, **{name: custom_input_schema(tool.grammar) for name, tool in plan.custom.items()}}
    if plan.calls == "required" and not calls:
        raise invalid_request("tool_choice requires a function call, and there is no function this model can call.", param="tool_choice")
    if plan.answer is None and not tool_calls:
        return None  # without a tool parser no call can come out: free text is all there is
    if plan.calls != "required":
        if plan.answer is not None:
            options.append(_json(plan.answer))
        elif calls:  # text, and calls only to the allowed functions (vLLM's hermes "auto")
            options.append(
                {"type": "triggered_tags", "triggers": [TOOL_CALL_TAG], "tags": _hermes_calls(calls), "stop_after_first": plan.single_call}
            )
            calls = {}
        else:
            options.append(_any_text([TOOL_CALL_TAG] if tool_calls else None))
    if calls:
        options.append(
            {
                "type": "tags_with_separator",
                "tags": _hermes_calls(calls),
                "separator": "",
                "at_least_one": True,
                "stop_after_first": plan.single_call,
            }
        )
    answer = _or(options)
    if think is None:
        return structural_tag(answer)
    start, end = think
    reasoning = _tag("", _any_text(), end) if in_reasoning else _optional(_tag(start, _any_text(), end))
    # Templates put a blank line between the reasoning and the answer.
    return structural_tag(_seq(reasoning, {"type": "regex", "pattern": r"\s{0,4}"}, answer))

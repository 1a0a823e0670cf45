"""A custom tool's grammar (`format: {"type": "grammar", "syntax": "lark" | "regex"}`) as a
rule of the harmony llguidance grammar (families/constraints.py), which bounds the input
the model writes as the call's message.

A Lark grammar is the client's text inside the server's grammar, so it is taken apart into
its tokens and put back with every rule and terminal name prefixed (`expr` -> `c0_expr`,
`NUMBER` -> `C0_NUMBER`): its names never meet the server's, nor another tool's. What would
reach past its own rules is refused with a 400 that names it: directives (`%import`,
`%ignore`, ... and llguidance's `%json`), special tokens (`<|call|>`, `<[200012]>`: text a
client writes never becomes a control token) and references to other grammars (`@name`).
A regex becomes one terminal. llguidance then checks the whole grammar, when it is installed
(with vLLM), so an expression it cannot compile is a 400 too, not an engine error.
"""

from __future__ import annotations

import functools
from typing import Any

import regex

from serve_app.api.errors import invalid_request
from serve_app.api.tools import CustomGrammarFormat

_LARK_TOKEN = regex.compile(
    r"""
    (?P<space>\s+)
    | (?P<comment>//[^\n]*)
    | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
    | (?P<regex>/(?:[^/\\\n]|\\.)+/[imslux]*)
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<number>[0-9]+)
    | (?P<punct>->|\.\.|[:|()\[\]?*+~.,!\-{}])
    | (?P<refused>%\w*|<|@)
    """,
    regex.VERBOSE,
)


def _refusal(token: str) -> str:
    if token.startswith("%"):
        return f"the directive '{token}' is not supported in a custom tool's Lark grammar"
    if token == "<":
        return "special tokens ('<|...|>', '<[...]>') are not allowed in a custom tool's Lark grammar"
    return "references to other grammars ('@name') are not allowed in a custom tool's Lark grammar"


def _renamed(name: str, prefix: str) -> str:
    """`expr` -> `c0_expr`, `NUMBER` -> `C0_NUMBER`, `_ws` -> `_c0_ws`: the case (rule or
    terminal) and a leading underscore kept."""
    lead = "_" if name.startswith("_") else ""
    body = name.removeprefix("_")
    return f"{lead}{prefix.upper() if body[:1].isupper() else prefix}_{body}"


def lark_rules(definition: str, prefix: str, param: str) -> tuple[str, str]:
    """The grammar's rules with names of `prefix`, and the name of its start rule."""
    out: list[str] = []
    names: set[str] = set()
    position = 0
    while position < len(definition):
        match = _LARK_TOKEN.match(definition, position)
        if match is None:
            raise invalid_request(
                f"Invalid Lark grammar for a custom tool: unexpected {definition[position]!r} at character {position}.", param=param
            )
        kind, text = match.lastgroup, match.group()
        if kind == "refused":
            raise invalid_request(f"Invalid Lark grammar: {_refusal(text)}.", param=param)
        if kind == "name":
            names.add(text)
            text = _renamed(text, prefix)
        elif kind == "comment":
            text = ""
        out.append(text)
        position = match.end()
    if "start" not in names:
        raise invalid_request("Invalid Lark grammar for a custom tool: it needs a 'start' rule.", param=param)
    return "".join(out), _renamed("start", prefix)


def regex_rule(definition: str) -> str:
    """A regex as one Lark terminal (`/.../`: its slashes and line breaks escaped)."""
    body = regex.sub(r"(?<!\\)((?:\\\\)*)/", r"\1\\/", definition).replace("\n", "\\n").replace("\r", "\\r")
    return f"/{body}/"


def grammar_rules(fmt: CustomGrammarFormat, index: int, param: str) -> tuple[str, list[str]]:
    """(the rule the input is, the rules that define it) for custom tool number `index`."""
    if fmt.syntax == "regex":
        name = f"C{index}_INPUT"
        return name, [f"{name}: {regex_rule(fmt.definition)}"]
    rules, start = lark_rules(fmt.definition, f"c{index}", param)
    return start, [rules]


@functools.cache
def _llguidance() -> Any:
    try:
        import llguidance  # installed with vLLM; a replay-only install has none
    except ImportError:
        return None
    return llguidance


def check_grammar(grammar: str, param: str) -> None:
    """A 400 naming the problem when llguidance cannot compile `grammar` (a Lark text)."""
    llguidance = _llguidance()
    if llguidance is None:
        return
    try:
        error = llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", grammar), None)
    except ValueError as exc:
        error = str(exc)
    if error:
        raise invalid_request(f"A custom tool's grammar is not supported by this model's structured outputs: {error}", param=param)


__all__ = ["check_grammar", "grammar_rules", "lark_rules", "regex_rule"]

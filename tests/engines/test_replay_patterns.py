"""The replay models check a call's written arguments against the function's schema before
using them: a client's `pattern` (`^(a+)+$`) against its own text (`aaa...a!`) backtracked in
`re` for hours on the engine's event loop (every other request of that engine stood still).
Now the pattern is matched within a bound, and too slow to tell counts as not matching."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from serve_app.engines.replay import _arguments

SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}, "required": ["a"], "additionalProperties": False}


@pytest.mark.slow
def test_a_backtracking_pattern_against_the_written_text_ends():
    """In a process of its own: `re` holds the GIL, so a hang could not even be timed out here."""
    code = (
        f"import json; from serve_app.engines.replay import _arguments; print(_arguments(json.dumps({{'a': 'a' * 60 + '!'}}), {SCHEMA!r}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)  # a bound for a hang
    assert json.loads(done.stdout) == {"a": "a"}  # not a match: an instance of the schema instead


def test_written_arguments_that_match_are_kept():
    assert _arguments(json.dumps({"a": "aaaa"}), SCHEMA) == json.dumps({"a": "aaaa"})
    assert _arguments(json.dumps({"a": "b"}), SCHEMA) == json.dumps({"a": "a"})

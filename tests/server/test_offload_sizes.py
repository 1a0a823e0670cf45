"""What makes a prompt big enough to be rendered off the event loop: everything the history
holds, not only messages' text and calls' arguments. A client's `mcp_call` items carrying
14 × 512 KiB of output (or a tool round's own 1 MiB output) were rendered on the loop: a
concurrent stream on that replica stood still for the whole render."""

from __future__ import annotations

import pytest

from serve_app.api.request import ResponsesRequest
from serve_app.runtime.offload import BIG_HISTORY_CHARS, big_prompt

BIG = "x" * (BIG_HISTORY_CHARS + 1)


def _items(*items: dict) -> list:
    return ResponsesRequest.model_validate({"model": "m", "input": [*items, {"role": "user", "content": "hi"}]}).input_items()


@pytest.mark.parametrize(
    "item",
    [
        {"type": "mcp_call", "id": "mcp_1", "server_label": "lab", "name": "echo", "arguments": "{}", "output": BIG},
        {"type": "mcp_call", "id": "mcp_1", "server_label": "lab", "name": "echo", "arguments": "{}", "error": BIG},
        {
            "type": "mcp_list_tools",
            "id": "mcpl_1",
            "server_label": "lab",
            "tools": [{"name": "t", "description": BIG, "input_schema": {"type": "object"}}],
        },
        {"type": "code_interpreter_call", "id": "ci_1", "container_id": "cntr_1", "code": BIG, "status": "completed", "outputs": None},
        {"type": "message", "role": "user", "content": BIG},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": BIG},
    ],
)
def test_every_big_item_is_a_big_prompt(item):
    assert big_prompt(_items(item), tools=0)


def test_a_small_history_is_rendered_on_the_loop():
    small = {"type": "mcp_call", "id": "mcp_1", "server_label": "lab", "name": "echo", "arguments": "{}", "output": "ok"}
    assert not big_prompt(_items(small, {"role": "assistant", "content": "fine"}), tools=3)


def test_many_small_values_count_too():
    """A listing of many tiny tools costs per value, not per character."""
    tools = [{"name": f"t{i}", "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}}} for i in range(1000)]
    items = _items({"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "lab", "tools": tools})
    assert big_prompt(items * 12, tools=0)

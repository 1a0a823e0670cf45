"""The event contract of DESIGN.md as one reusable check, run on every stream the tests see."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

_EVENT = TypeAdapter(ResponseStreamEvent)
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
_PREFIX = {
    "reasoning": "rs_",
    "message": "msg_",
    "function_call": "fc_",
    "custom_tool_call": "ctc_",
    "compaction": "cmp_",
    "mcp_list_tools": "mcpl_",
    "mcp_call": "mcp_",
    "mcp_approval_request": "mcpr_",
    "web_search_call": "ws_",
    "code_interpreter_call": "ci_",
    "file_search_call": "fs_",
}
# For each item type: the events between its `output_item.added` and `.done`, as a pattern
# (`*`: any number of, `?`: optional, `a|b`: one of).
_ITEM_PATTERN = {
    "message": [
        "response.content_part.added",
        "response.output_text.delta|response.output_text.annotation.added*",
        "response.output_text.done",
        "response.content_part.done",
    ],
    "reasoning": ["response.reasoning_text.delta*", "response.reasoning_text.done"],
    "function_call": ["response.function_call_arguments.delta*", "response.function_call_arguments.done"],
    "custom_tool_call": ["response.custom_tool_call_input.delta*", "response.custom_tool_call_input.done"],
    # Completed (or failed) only after the tool returned: an unfinished call has neither.
    "mcp_call": [
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta*",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed|response.mcp_call.failed?",
    ],
    "mcp_list_tools": ["response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed|response.mcp_list_tools.failed"],
    "mcp_approval_request": [],  # no events of its own
    "compaction": ["response.compaction.compacting"],  # made before the model writes (context_management)
    # The built-in tools: searching / interpreting when the tool is called, completed after it
    # returned (a call that failed, or that the response ended first, has no completed).
    "web_search_call": [
        "response.web_search_call.in_progress",
        "response.web_search_call.searching?",
        "response.web_search_call.completed?",
    ],
    "file_search_call": [
        "response.file_search_call.in_progress",
        "response.file_search_call.searching?",
        "response.file_search_call.completed?",
    ],
    "code_interpreter_call": [
        "response.code_interpreter_call.in_progress",
        "response.code_interpreter_call_code.delta*",
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting?",
        "response.code_interpreter_call.completed?",
    ],
}
_DELTA = {
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.function_call_arguments.delta",
    "response.custom_tool_call_input.delta",
    "response.mcp_call_arguments.delta",
    "response.code_interpreter_call_code.delta",
}
_ARGUMENTS_DONE = {"response.function_call_arguments.done", "response.mcp_call_arguments.done"}
_RUNNING = {
    "web_search_call": "response.web_search_call.searching",
    "code_interpreter_call": "response.code_interpreter_call.interpreting",
    "file_search_call": "response.file_search_call.searching",
}
_COMPLETED = {
    "web_search_call": "response.web_search_call.completed",
    "code_interpreter_call": "response.code_interpreter_call.completed",
    "file_search_call": "response.file_search_call.completed",
}


def _pattern(steps: list[str]) -> str:
    parts = []
    for step in steps:
        repeat = step[-1] if step[-1] in "*?" else ""
        names = "|".join(re.escape(name) for name in step.rstrip("*?").split("|"))
        parts.append(f"(?:(?:{names}) ){repeat}")
    return "".join(parts)


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    """SSE bytes -> event dicts, checking the framing (`event:` line matches `data.type`).
    Comment blocks (the server's keep-alives, `: ...`) are skipped, as SSE clients do."""
    events = []
    text = raw.decode("utf-8")
    assert text.endswith("\n\n"), "stream must end with a complete event"
    for block in text.split("\n\n")[:-1]:
        lines = block.split("\n")
        if all(line.startswith(":") for line in lines):
            continue
        assert len(lines) == 2, block[:200]
        assert lines[0].startswith("event: "), block[:200]
        assert lines[1].startswith("data: "), block[:200]
        data = json.loads(lines[1][len("data: ") :])
        assert data["type"] == lines[0][len("event: ") :], f"event: line {lines[0]!r} but data type {data['type']!r}"
        events.append(data)
    return events


def _item_text(item: Any) -> str:
    if item.type == "message":
        assert len(item.content) == 1, f"a message with {len(item.content)} content parts"
        return item.content[0].text
    if item.type == "reasoning":
        return "".join(part.text for part in item.content or [])
    if item.type in ("mcp_list_tools", "web_search_call", "file_search_call"):
        return ""
    if item.type == "code_interpreter_call":
        return item.code or ""
    if item.type == "custom_tool_call":
        return item.input
    return item.arguments


def _check_server_item(item: Any, inner: list[str]) -> None:
    """A server-side item's end says what happened, as its events did."""
    if item.type == "mcp_call":
        if "response.mcp_call.completed" in inner:
            assert item.status == "completed", item
            assert item.output is not None, item
            assert item.error is None, item
        elif "response.mcp_call.failed" in inner:
            assert item.status == "failed", item
            assert item.error is not None, item
            assert item.output is None, item
        else:
            assert item.status == "incomplete", item
            assert item.output is None, item
            assert item.error is None, item
    elif item.type == "mcp_list_tools":
        assert ("response.mcp_list_tools.failed" in inner) == (item.error is not None), item
        assert item.error is None or not item.tools, "a failed listing with tools"
    elif item.type in _COMPLETED:
        completed = _COMPLETED[item.type] in inner
        assert completed == (item.status == "completed"), f"{item.type} {item.status} with events {inner}"
        assert item.status in ("completed", "failed", "incomplete"), item
        assert not completed or _RUNNING[item.type] in inner, f"{item.type} completed without being run"
        if item.type == "code_interpreter_call":
            assert item.container_id.startswith("cntr_"), f"no real container id: {item.container_id!r}"
            assert item.status == "completed" or not item.outputs, "outputs of a call that did not complete"


def _contains_minus_one(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_contains_minus_one(v) for v in value.values())
    if isinstance(value, list):
        return any(_contains_minus_one(v) for v in value)
    return value == -1 and not isinstance(value, bool)


def check_stream(raw_events: Iterable[Any], allow_replacement: bool = False) -> Response:
    """Assert every rule of the contract; return the terminal event's response.

    `allow_replacement`: for models with random weights, whose bytes may not be UTF-8.
    """
    dicts = [e if isinstance(e, dict) else e.model_dump(mode="json", exclude_unset=True, by_alias=True) for e in raw_events]
    events = [_EVENT.validate_python(d) for d in dicts]  # rule 7: the SDK's own schema
    assert events, "empty stream"

    # Rules 1, 2: lifecycle frame and sequence numbers.
    assert [e.sequence_number for e in events] == list(range(len(events))), "sequence numbers are not 0, 1, 2, ..."
    assert not any(_contains_minus_one(d) for d in dicts), "-1 placeholder on the wire"
    assert events[0].type == "response.created", "no created, in_progress start"
    assert events[1].type == "response.in_progress", "no created, in_progress start"
    assert events[0].response.status == "in_progress", "created is not an empty in_progress response"
    assert events[0].response.output == [], "created is not an empty in_progress response"
    assert events[-1].type in TERMINAL, f"ends with {events[-1].type}, not a terminal event"
    assert sum(e.type in TERMINAL for e in events) == 1, "more than one terminal event"
    terminal = events[-1].response
    assert all(getattr(e, "response", terminal).id == terminal.id for e in events), "the response id changes"
    expected_status = events[-1].type.removeprefix("response.")
    assert terminal.status == expected_status, f"{events[-1].type} with status {terminal.status}"
    if expected_status == "incomplete":
        assert terminal.incomplete_details, "incomplete without a reason"
        assert terminal.incomplete_details.reason, "incomplete without a reason"
    if expected_status == "failed":
        assert terminal.error, "failed without an error code and message"
        assert terminal.error.message, "failed without an error code and message"
        assert terminal.error.code, "failed without an error code and message"

    # Rules 3, 4, 5: items one after another, each with its own complete lifecycle.
    seen_ids: set[str] = set()
    items: list[Any] = []
    body = events[2:-1]
    position = 0
    while position < len(body):
        added = body[position]
        assert added.type == "response.output_item.added", f"expected an item to start, got {added.type}"
        k = len(items)
        assert added.output_index == k, f"item {k} added at output_index {added.output_index}"
        item_type = added.item.type
        item_id = added.item.id
        assert item_id, f"bad or repeated {item_type} id {item_id!r}"
        assert item_id.startswith(_PREFIX[item_type]), f"bad or repeated {item_type} id {item_id!r}"
        assert item_id not in seen_ids, f"bad or repeated {item_type} id {item_id!r}"
        seen_ids.add(item_id)
        inner, deltas, done_text, annotations = [], [], None, []
        position += 1
        while body[position].type != "response.output_item.done":
            event = body[position]
            assert event.output_index == k, event
            assert event.item_id == item_id, event
            if hasattr(event, "content_index"):
                assert event.content_index == 0, f"{event.type} at content_index {event.content_index}"
            if event.type in _DELTA:
                deltas.append(event.delta)
            elif event.type in _ARGUMENTS_DONE:
                done_text = event.arguments
            elif event.type == "response.code_interpreter_call_code.done":
                done_text = event.code
            elif event.type == "response.custom_tool_call_input.done":
                done_text = event.input
            elif event.type == "response.output_text.annotation.added":
                # Sent after the text it annotates, numbered in order.
                annotation = event.annotation
                assert event.annotation_index == len(annotations), f"annotation {event.annotation_index} after {len(annotations)}"
                if annotation.type == "file_citation":  # a position: where the marker stood
                    assert 0 <= annotation.index <= len("".join(deltas)), f"annotation before its text: {annotation}"
                else:
                    assert 0 <= annotation.start_index <= annotation.end_index <= len("".join(deltas)), (
                        f"annotation before its text: {annotation}"
                    )
                annotations.append(annotation.model_dump())
            elif event.type.endswith("text.done"):
                done_text = event.text
            elif event.type == "response.content_part.done":
                assert event.part.text == done_text, "content_part.done text differs from the text's done event"
            inner.append(event.type)
            position += 1
        assert re.fullmatch(_pattern(_ITEM_PATTERN[item_type]), "".join(f"{t} " for t in inner)), (
            f"{item_type} events out of order: {inner}"
        )
        done = body[position]
        assert done.output_index == k, f"item {k} done does not match its added"
        assert done.item.id == item_id, f"item {k} done does not match its added"
        assert done.item.type == item_type, f"item {k} done does not match its added"
        text = "".join(deltas)
        if item_type == "message":
            assert [a.model_dump() for a in done.item.content[0].annotations] == annotations, "streamed annotations differ from the item's"
        if item_type in (
            "mcp_approval_request",
            "mcp_list_tools",
            "web_search_call",
            "file_search_call",
            "compaction",
        ):  # nothing of them is streamed
            assert not deltas, f"{item_type} with deltas"
            assert done_text is None, f"{item_type} with deltas"
        else:
            assert text == done_text == _item_text(done.item), f"{item_type} deltas, done event and item disagree (lost or changed text)"
        _check_server_item(done.item, inner)
        assert allow_replacement or "\ufffd" not in text, "U+FFFD in the text (a character split between deltas)"
        if item_type in ("function_call", "custom_tool_call"):
            assert done.item.call_id, "function call without call_id or name"
            assert done.item.name, "function call without call_id or name"
            assert added.item.call_id == done.item.call_id, "function call's call_id changes"
        items.append(done.item)
        position += 1

    assert [i.model_dump() for i in terminal.output] == [i.model_dump() for i in items], "the final output differs from the streamed items"
    if expected_status == "completed":
        finished = {"completed", "failed"}  # a server-side call may have failed, and the model went on
        server_calls = ("mcp_call", "web_search_call", "code_interpreter_call", "file_search_call")
        assert all(getattr(i, "status", "completed") in (finished if i.type in server_calls else {"completed"}) for i in items), (
            "a completed response with an unfinished item"
        )
    assert terminal.usage is not None, "no usage"
    assert terminal.usage.output_tokens >= 0, "no usage"
    return terminal

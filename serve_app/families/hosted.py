"""Items of server-side tools in a conversation's history, as the calls and outputs the model saw.

A server-side call is rendered as the model made it: an assistant message that calls the
tool, then the tool's own message with what it returned. Both families render these as they
render a function call and its output (harmony: a call `to=LABEL.TOOL` and a tool message
from `LABEL.TOOL`; chat templates: a tool call named `LABEL.TOOL` and the template's tool
turn), so a client that sends the whole history back (`store: false`) gets the same prompt
as one that continues with `previous_response_id`:

    mcp_list_tools                    -> nothing (its tools are offered with the request's tools)
    mcp_call                          -> the call, then its output (or its error; or that it did
                                         not finish: a response cancelled or ended mid-call)
    mcp_approval_request              -> the call, when it was answered later in the history
    mcp_approval_response, approved   -> nothing: the mcp_call that ran it carries the output
    mcp_approval_response, denied     -> the output: the user did not approve the call
    web_search_call                   -> a call of browser.search / open / find, then what
                                         the model read (kept with a stored response or a
                                         conversation; sent back by a client: a note that
                                         it is not kept)
    code_interpreter_call             -> a call of python (its code), then what the model
                                         read (kept likewise; sent back: its logs, when
                                         included)
    file_search_call                  -> a call of file_search (its query), then what the
                                         model read (kept likewise; sent back: its results,
                                         when included)

Custom tools' calls and outputs (the client runs them) are rendered the same way: a call
`to=functions.NAME` whose message is the input as written (harmony), or a tool call of
`NAME` with arguments `{"input": ...}` (chat templates).

gpt-oss calls its built-in tools on the analysis channel with content type `code`
(`to=browser.search code`, `to=python code`), and their messages come back on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from serve_app.api.errors import invalid_request
from serve_app.api.items import (
    CodeInterpreterCallItem,
    CompactionItem,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FileSearchCallItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    HistoryItem,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    McpListToolsItem,
    MessageItem,
    ReasoningItem,
    WebSearchCallItem,
)
from serve_app.families.compaction import compacted

JSON_CONTENT = "<|constrain|>json"
BUILTIN_CONTENT = "code"  # harmony renders it `<|constrain|>code`
FUNCTIONS_PREFIX = "functions."  # harmony's namespace of the request's functions and custom tools
FILE_SEARCH = "file_search"  # the file_search tool's name, as both families call it
CUSTOM_INPUT_KEY = "input"  # a custom tool's input, as a chat-template model writes it: {"input": "..."}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """An assistant message calling a server-side tool."""

    call_id: str
    recipient: str  # LABEL.TOOL, browser.search, python, functions.NAME (a custom tool)
    arguments: str  # as the model wrote them: JSON, or the text of `string_key`
    channel: str = "commentary"  # harmony's channel of the call and of its output
    content_type: str | None = JSON_CONTENT
    string_key: str | None = None  # the arguments are this one string argument (python's code, a custom tool's input), not JSON

    @property
    def chat_name(self) -> str:
        """The tool's name as a chat template calls it (no harmony `functions.` namespace)."""
        return self.recipient.removeprefix(FUNCTIONS_PREFIX)

    def json_arguments(self) -> Any:
        """The arguments as a chat template takes them: a JSON value ({"code": ...} for code)."""
        if self.string_key is not None:
            return {self.string_key: self.arguments}
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments  # templates print a string as it is


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """The message of a server-side tool to the assistant: what it returned."""

    call_id: str
    author: str  # the tool: the call's recipient
    text: str
    channel: str = "commentary"

    @property
    def chat_name(self) -> str:
        return self.author.removeprefix(FUNCTIONS_PREFIX)


RenderedItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem | ToolCall | ToolOutput

NOT_APPROVED = "The user did not approve this call, so it was not run."
RESULT_NOT_KEPT = "(The result of this call is not part of the conversation.)"
NOT_FINISHED = "Not finished: the response ended before the tool returned."


def error_text(error: str | dict[str, Any] | None) -> str:
    """What the model reads of an `mcp_call` error: its message or content, as text."""
    if error is None:
        return ""
    if isinstance(error, str):
        return error
    if "message" in error:
        return str(error["message"])
    content = error.get("content")
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content)
    return content if isinstance(content, str) else json.dumps(content)


def call_result_text(output: str | None, error: str | dict[str, Any] | None) -> str:
    """The tool message of a finished call: its output, or its error as an error."""
    if error is not None:
        return f"Error: {error_text(error)}"
    return output or ""


def rendered_items(history: Iterable[HistoryItem]) -> list[tuple[int, RenderedItem]]:
    """The history with every server-side tool item as the call and output it stands for,
    each with the index of the history item it came from (for errors that name it)."""
    items = list(history)
    answered = {
        item.approval_request_id
        for item in items
        if isinstance(item, McpApprovalResponseItem) or (isinstance(item, McpCallItem) and item.approval_request_id)
    }
    requests = {item.id: item for item in items if isinstance(item, McpApprovalRequestItem)}
    custom_calls: dict[str, str] = {}  # call_id -> recipient
    rendered: list[tuple[int, RenderedItem]] = []
    for index, item in compacted(items):  # the last compaction item and what it stands for: its summary
        turns: list[RenderedItem] = []
        if isinstance(item, McpListToolsItem | CompactionItem):  # an earlier compaction: summarised by the last
            continue
        if isinstance(item, CustomToolCallItem):
            recipient = f"{item.namespace}.{item.name}" if item.namespace else FUNCTIONS_PREFIX + item.name
            custom_calls[item.call_id] = recipient
            turns.append(ToolCall(item.call_id, recipient, item.input, content_type=None, string_key=CUSTOM_INPUT_KEY))
        elif isinstance(item, CustomToolCallOutputItem):
            if item.call_id not in custom_calls:
                raise invalid_request(
                    f"No tool call found for custom tool call output with call_id '{item.call_id}'.", param=f"input[{index}].call_id"
                )
            turns.append(ToolOutput(item.call_id, custom_calls[item.call_id], item.text))
        elif isinstance(item, McpApprovalRequestItem):
            if item.id in answered:  # unanswered, it ran nothing and the model moved on
                turns.append(ToolCall(item.id, f"{item.server_label}.{item.name}", item.arguments))
        elif isinstance(item, McpApprovalResponseItem):
            request = requests.get(item.approval_request_id)
            if request is not None and not item.approve:
                reason = f" The user's reason: {item.reason}" if item.reason else ""
                turns.append(ToolOutput(request.id, f"{request.server_label}.{request.name}", NOT_APPROVED + reason))
        elif isinstance(item, McpCallItem):
            recipient = f"{item.server_label}.{item.name}"
            call_id = item.approval_request_id if item.approval_request_id in requests else (item.id or f"mcp_{index}")
            if call_id != item.approval_request_id:  # an approved call's message is its request's
                turns.append(ToolCall(call_id, recipient, item.arguments))
            unfinished = item.output is None and item.error is None and item.status not in (None, "completed")
            turns.append(ToolOutput(call_id, recipient, NOT_FINISHED if unfinished else call_result_text(item.output, item.error)))
        elif isinstance(item, WebSearchCallItem):
            call_id = item.id or f"ws_{index}"
            recipient, arguments = _browser_call(item.action or {})
            text = item._model_text if item._model_text is not None else RESULT_NOT_KEPT
            turns += [
                ToolCall(call_id, recipient, arguments, "analysis", BUILTIN_CONTENT),
                ToolOutput(call_id, recipient, text, "analysis"),
            ]
        elif isinstance(item, CodeInterpreterCallItem):
            call_id = item.id or f"ci_{index}"
            if item._model_text is not None:
                text = item._model_text
            elif item.outputs is not None:
                text = "".join(str(output.get("logs", "")) for output in item.outputs if output.get("type") == "logs")
            else:
                text = RESULT_NOT_KEPT
            turns += [
                ToolCall(call_id, "python", item.code or "", "analysis", BUILTIN_CONTENT, string_key="code"),
                ToolOutput(call_id, "python", text, "analysis"),
            ]
        elif isinstance(item, FileSearchCallItem):
            call_id = item.id or f"fs_{index}"
            query = (item.queries or [""])[0]
            if item._model_text is not None:
                text = item._model_text
            elif item.results is not None:
                text = "\n\n".join(f"{result.get('filename', '')}: {result.get('text', '')}" for result in item.results)
            else:
                text = RESULT_NOT_KEPT
            turns += [
                ToolCall(call_id, FILE_SEARCH, json.dumps({"query": query}), "analysis", BUILTIN_CONTENT),
                ToolOutput(call_id, FILE_SEARCH, text, "analysis"),
            ]
        else:
            turns.append(item)
        rendered += [(index, turn) for turn in turns]
    return rendered


def _browser_call(action: dict[str, Any]) -> tuple[str, str]:
    """A `web_search_call` action as the harmony browser call it was."""
    kind = action.get("type")
    if kind == "open_page":
        return "browser.open", json.dumps({"id": action.get("url", "")})
    if kind == "find_in_page":
        return "browser.find", json.dumps({"pattern": action.get("pattern", "")})
    return "browser.search", json.dumps({"query": action.get("query", "")})

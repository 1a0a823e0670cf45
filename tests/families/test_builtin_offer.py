"""How the built-in tools are offered: harmony models find gpt-oss's own `browser` and `python`
namespaces in the system message, exactly as openai-harmony renders them for gpt-oss;
chat-template models get them as functions."""

from __future__ import annotations

import datetime
import json

from openai_harmony import Conversation, Message, ReasoningEffort, Role, SystemContent, ToolNamespaceConfig

from serve_app.api.request import ResponsesRequest
from serve_app.families.harmony import render_prompt
from serve_app.families.vocab import harmony_encoding
from serve_app.tools.builtin.browser import BrowserTools
from serve_app.tools.builtin.python import PythonTools
from serve_app.tools.python.mcp_server import tool_description

TODAY = datetime.date(2026, 1, 2)
TOOLS = [{"type": "web_search"}, {"type": "code_interpreter", "container": {"type": "auto"}}]


def offered(tools: list[dict], **fields) -> ResponsesRequest:
    """The request as the tool loop offers it: browser first, then python (as in server_tool_runtime)."""
    request = ResponsesRequest.model_validate({"model": "m", "input": "hi", "tools": tools, **fields})
    if web := request.web_search_tool():
        request = BrowserTools(web, None, include_sources=False).offer(request)  # type: ignore[arg-type]  # offer needs no transport
    if python := request.code_interpreter_tool():
        request = PythonTools(python, None, None, tenant="t", timeout_s=30, include_outputs=False).offer(request)  # type: ignore[arg-type]
    return request


def test_harmony_system_message_is_gpt_oss_own():
    request = offered(TOOLS)
    python = ToolNamespaceConfig(name="python", description=tool_description(30), tools=[])
    system = (
        SystemContent.new()
        .with_reasoning_effort(ReasoningEffort.MEDIUM)
        .with_conversation_start_date(TODAY.isoformat())
        .with_browser_tool()
        .with_tools(python)
    )
    messages = [Message.from_role_and_content(Role.SYSTEM, system), Message.from_role_and_content(Role.USER, "hi")]
    expected = harmony_encoding().render_conversation_for_completion(Conversation.from_messages(messages), Role.ASSISTANT)
    assert render_prompt(request, request.input_items(), today=TODAY) == expected
    text = harmony_encoding().decode(expected)
    assert "## browser\n\n// Tool for browsing." in text
    assert "namespace browser {" in text
    assert "## python\n\n" in text
    assert "<|start|>developer" not in text  # no function tools: no developer message


def test_the_python_description_is_harmonys_with_this_servers_facts():
    harmony = ToolNamespaceConfig.python().description
    ours = tool_description(12.5)
    assert ours != harmony
    assert "time out after 12.5 seconds" in ours
    assert "Internet access for this session is disabled." in ours
    assert ours.split("time out after")[0] == harmony.split("time out after")[0]  # the rest is harmony's, word for word


def test_tool_choice_none_offers_no_builtin_tool():
    request = offered(TOOLS, tool_choice="none")
    text = harmony_encoding().decode(render_prompt(request, request.input_items(), today=TODAY))
    assert "# Tools" not in text
    assert "namespace browser" not in text


def test_chat_template_models_get_them_as_functions():
    from serve_app.families.chat_template import _tools

    names = {tool["function"]["name"]: tool["function"] for tool in _tools(offered(TOOLS))}
    assert set(names) == {"browser.search", "browser.open", "browser.find", "python"}
    assert names["python"]["parameters"]["required"] == ["code"]
    browser = {t.name: t for t in ToolNamespaceConfig.browser().tools}
    assert json.dumps(names["browser.search"]["parameters"], sort_keys=True) == json.dumps(browser["search"].parameters, sort_keys=True)

"""`web_search`: gpt-oss's browser as a `Toolset` of the response.

- Offer: harmony models get gpt-oss's own `browser` namespace in the system message
  (search, open, find, with harmony's descriptions and the instructions to cite);
  chat-template models the functions `browser.search`, `browser.open`, `browser.find`.
  Calls are `web_search_call` items, their action as the browser took it (`sources` only with
  `include: ["web_search_call.action.sources"]`).
- One browsing session per response, under an id of 192 random bits that only this loop
  knows (the model names pages by cursor, never a session); an embedded browser's session
  lives in one replica, so the response's calls go to the replica of its first. The
  request's `filters.allowed_domains` goes with every call, out of the model's reach.
- Citations: every page the browser showed is citable by its cursor; the answer's markers
  become `url_citation` annotations (`ServerTools.citations`, read by the stream).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import mcp_types
from openai.types.responses.response_function_web_search import Action
from openai_harmony import ToolNamespaceConfig
from pydantic import TypeAdapter, ValidationError

from serve_app.api.request import ResponsesRequest
from serve_app.api.tools import BuiltinTool, FunctionTool, WebSearchTool
from serve_app.core.citations import CitedPage
from serve_app.core.tool_items import WEB_SEARCH_CALL, ServerCall, ServerTools, ToolError, ToolOutcome, browser_action
from serve_app.core.utf8 import cap_text
from serve_app.tools.browser.meta import ALLOWED_DOMAINS_META_KEY, RESULT_META_KEY, SESSION_META_KEY, cited_pages
from serve_app.tools.builtin.transport import ToolTransport, ToolUnavailable
from serve_app.tools.server_tools import NothingToPrepare

NAMESPACE = "browser"
INCLUDE_SOURCES = "web_search_call.action.sources"
MAX_TEXT_BYTES = 1024 * 1024  # of what the model reads of one call (a view is ~1024 tokens)
_ACTION: TypeAdapter[Any] = TypeAdapter(Action)


def browser_functions() -> tuple[str, list[FunctionTool]]:
    """The namespace's description and functions, as gpt-oss was trained on them."""
    namespace = ToolNamespaceConfig.browser()
    functions = [FunctionTool(type="function", name=t.name, description=t.description, parameters=t.parameters) for t in namespace.tools]
    return namespace.description or "", functions


class BrowserTools(NothingToPrepare):
    """The browser for one response."""

    def __init__(self, tool: WebSearchTool, transport: ToolTransport, *, include_sources: bool) -> None:
        self.transport = transport
        self.allowed_domains = tool.allowed_domains
        self.include_sources = include_sources
        self.session_id = secrets.token_urlsafe(24)
        self.pages: dict[int, CitedPage] = {}  # cursor -> page: what the answer may cite
        self._route: str | None = None  # the replica holding the session

    def offer(self, request: ResponsesRequest) -> ResponsesRequest:
        description, functions = browser_functions()
        browser = BuiltinTool(name=NAMESPACE, description=description, serves="web_search", functions=functions)
        return request.model_copy(update={"tools": [*request.tools, browser]})

    def route(self, tools: ServerTools) -> None:
        tools.namespaces[NAMESPACE] = WEB_SEARCH_CALL
        tools.citations = self.pages

    def owns(self, call: ServerCall) -> bool:
        return call.kind is WEB_SEARCH_CALL

    def label(self, call: ServerCall) -> str:
        return NAMESPACE

    async def run(self, call: ServerCall) -> ToolOutcome:
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):  # gpt-oss's browser says the same
            return _failed("Invalid function arguments", browser_action(call.name, call.arguments))
        meta: dict[str, Any] = {SESSION_META_KEY: self.session_id}
        if self.allowed_domains is not None:
            meta[ALLOWED_DOMAINS_META_KEY] = self.allowed_domains
        try:
            reply = await self.transport.call(call.name, arguments, meta, self._route)
        except ToolUnavailable as exc:
            return _failed(f"The browser could not be reached: {exc}", browser_action(call.name, call.arguments))
        self._route = reply.route
        result = reply.result
        text = cap_text("\n".join(block.text for block in result.content if isinstance(block, mcp_types.TextContent)), MAX_TEXT_BYTES)
        self.pages.update(cited_pages(result.meta))
        action = self._action(result.meta, call)
        if result.is_error:
            return _failed(text, action)
        return ToolOutcome(output=text, model_text=text, item={"action": action})

    def _action(self, meta: Any, call: ServerCall) -> dict[str, Any]:
        """The action the browser reports (as the SDK types it), else what the arguments say."""
        browser_meta = meta.get(RESULT_META_KEY) if isinstance(meta, dict) else None
        try:
            action = _ACTION.validate_python(browser_meta.get("action") if isinstance(browser_meta, dict) else None)
        except ValidationError:
            return browser_action(call.name, call.arguments)
        reported: dict[str, Any] = action.model_dump(exclude_none=True)
        if not self.include_sources:
            reported.pop("sources", None)
        return reported

    async def aclose(self) -> None:
        await self.transport.aclose()


def _failed(text: str, action: dict[str, Any]) -> ToolOutcome:
    """The browser refused or failed (an error the model reads and acts on)."""
    return ToolOutcome(error=ToolError("mcp_tool_execution_error", text), model_text=text, item={"action": action})

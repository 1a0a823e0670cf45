"""The built-in tools' `ToolFactory`s: a request's `code_interpreter` and `web_search` become
toolsets of its response when the server's config runs them (`tools.builtin`). One that is
not configured is left out of the response (`unconfigured: ignore`, the default: clients
such as Codex send `web_search` with every request), or a 400 saying which config enables
it (`unconfigured: reject`)."""

from __future__ import annotations

from collections.abc import Mapping

from serve_app.api.errors import invalid_request
from serve_app.api.items import HistoryItem
from serve_app.api.request import ResponsesRequest
from serve_app.api.tools import CodeInterpreterTool, Tool, WebSearchTool
from serve_app.config import BuiltinToolsConfig
from serve_app.state.store import Store
from serve_app.state.tenancy import TenantStore
from serve_app.tools.builtin.browser import INCLUDE_SOURCES, BrowserTools
from serve_app.tools.builtin.python import INCLUDE_OUTPUTS, ContainerRecords, PythonTools
from serve_app.tools.builtin.transport import McpTransport, TransportFactory
from serve_app.tools.egress import Resolver
from serve_app.tools.mcp_client import McpLimits
from serve_app.tools.server_tools import ToolFactory


def not_run(
    request: ResponsesRequest,
    kind: type[CodeInterpreterTool] | type[WebSearchTool],
    config_path: str,
    embedded_form: str,
    transport: TransportFactory | None,
    config: BuiltinToolsConfig,
) -> list[Tool]:
    """The request's built-in tools of `kind` when the server does not run them (no
    `transport`): left out (`unconfigured: ignore`), or a 400 naming the config that enables
    them (`reject`)."""
    if transport is not None:
        return []
    tools = [(index, tool) for index, tool in enumerate(request.tools) if isinstance(tool, kind)]
    if tools and config.unconfigured == "reject":
        index, tool = tools[0]
        raise invalid_request(
            f"{tool.type} is not enabled on this server: its operator enables it with "
            f"{config_path} in the app's config ({embedded_form} or url: http://.../mcp).",
            param=f"tools[{index}]",
        )
    return [tool for _, tool in tools]


class PythonFactory:
    def __init__(self, config: BuiltinToolsConfig, transport: TransportFactory | None, store: Store) -> None:
        self.config, self.transport, self.store = config, transport, store

    def check(self, request: ResponsesRequest) -> list[Tool]:
        return not_run(request, CodeInterpreterTool, "tools.builtin.python", "embedded: {...}", self.transport, self.config)

    def __call__(
        self, request: ResponsesRequest, history: list[HistoryItem], input_items: list[HistoryItem], tenant: str
    ) -> PythonTools | None:
        tool, python = request.code_interpreter_tool(), self.config.python
        if tool is None or self.transport is None or python is None:
            return None
        records = ContainerRecords(TenantStore(self.store, tenant), python.container_ttl_s)
        include = INCLUDE_OUTPUTS in request.include
        return PythonTools(tool, self.transport(), records, tenant=tenant, timeout_s=python.call_timeout_s, include_outputs=include)


class BrowserFactory:
    def __init__(self, config: BuiltinToolsConfig, transport: TransportFactory | None) -> None:
        self.config, self.transport = config, transport

    def check(self, request: ResponsesRequest) -> list[Tool]:
        return not_run(request, WebSearchTool, "tools.builtin.browser", "embedded: {search_url: ...}", self.transport, self.config)

    def __call__(
        self, request: ResponsesRequest, history: list[HistoryItem], input_items: list[HistoryItem], tenant: str
    ) -> BrowserTools | None:
        tool = request.web_search_tool()
        if tool is None or self.transport is None:
            return None
        return BrowserTools(tool, self.transport(), include_sources=INCLUDE_SOURCES in request.include)


# A call to a tool server at a URL may take the tool's own time and this margin (its
# interrupt grace, starting a sandbox, the network); replies are capped in bytes (a python
# reply holds up to 8 figures of 2 MiB, base64).
URL_CALL_MARGIN_S = 30.0
URL_CONNECT_TIMEOUT_S = 10.0
BROWSER_CALL_TIMEOUT_S = 120.0  # a search, or a page's fetch with its redirects, and the rendering
PYTHON_REPLY_BYTES = 32 * 1024 * 1024
BROWSER_REPLY_BYTES = 8 * 1024 * 1024


def builtin_factories(
    config: BuiltinToolsConfig,
    store: Store,
    embedded: Mapping[str, TransportFactory] | None = None,
    resolver: Resolver | None = None,
) -> list[ToolFactory]:
    """The built-in tools of `tools.builtin`: an embedded tool through `embedded[name]` (its
    Serve deployment: deployments/tools.py), a tool at a URL through MCP."""
    embedded = embedded or {}

    def transport(name: str, url: str | None, limits: McpLimits) -> TransportFactory:
        if url is not None:
            return lambda: McpTransport(url, limits, resolver)
        if name not in embedded:
            raise ValueError(f"the embedded {name} tool runs as a Serve deployment of the app: build it with build_app (serve run)")
        return embedded[name]

    python = browser = None
    if config.python is not None:
        timeout_s = config.python.call_timeout_s + URL_CALL_MARGIN_S
        python = transport("python", config.python.url, McpLimits(URL_CONNECT_TIMEOUT_S, timeout_s, PYTHON_REPLY_BYTES))
    if config.browser is not None:
        limits = McpLimits(URL_CONNECT_TIMEOUT_S, BROWSER_CALL_TIMEOUT_S, BROWSER_REPLY_BYTES)
        browser = transport("browser", config.browser.url, limits)
    # Browser first: gpt-oss's reference puts its namespace before python's in the system message.
    return [BrowserFactory(config, browser), PythonFactory(config, python, store)]

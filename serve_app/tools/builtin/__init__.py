"""gpt-oss's built-in tools in the tool loop: `code_interpreter` (the python tool) and
`web_search` (the browser), each a `Toolset` of the response (serve_app/tools/server_tools.py)
that reaches its tool through a `ToolTransport`: a Serve deployment of the app (deployments/tools.py),
a standalone MCP server at a URL, or the app's own process. See docs/tools.md."""

"""gpt-oss's browser tool (`web_search`): the browser core and its MCP server (`server.py`)."""

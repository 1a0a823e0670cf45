"""gpt-oss's python tool: sandboxed, stateful interpreters (sandbox.py), their containers
(containers.py) and the MCP server that offers them (mcp_server.py). See docs/tools-python.md."""

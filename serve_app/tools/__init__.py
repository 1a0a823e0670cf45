"""Server-side tools: the MCP client, the egress checks, the built-in tools and their MCP servers. Imports `engines/` and below, no HTTP framework."""

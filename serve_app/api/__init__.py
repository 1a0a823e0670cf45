"""Wire types: the request and its input items and tools, errors, SSE/WebSocket framing. The lowest layer: imports nothing else of ours."""

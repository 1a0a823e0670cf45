"""responses-serve: an OpenAI-compatible Responses API for reasoning models on Ray Serve."""

"""responses-serve's application, Ray-free: an OpenAI-compatible Responses API for reasoning
models. Its folders are layers (pyproject.toml [tool.importlinter]); it never imports
`deployments`, and only `cli/` imports Ray."""

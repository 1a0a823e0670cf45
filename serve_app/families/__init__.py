"""Model families: harmony and chat templates (prompts, parsers, constraints). Imports `api/` and `core/`, never state, HTTP or Ray."""

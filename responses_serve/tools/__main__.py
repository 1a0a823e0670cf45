"""`python -m responses_serve.tools browser|python ...` (the same commands as `responses-serve tool`)."""

from responses_serve.tools.cli import tool_app

if __name__ == "__main__":
    tool_app()

"""`python -m serve_app.tools browser|python ...` (the same commands as `responses-serve tool`)."""

from serve_app.tools.cli import tool_app

if __name__ == "__main__":
    tool_app()

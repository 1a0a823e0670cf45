"""The real Node clients the tests run (tests/clients/package.json, installed by `make install`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

CLIENTS = Path(__file__).resolve().parents[1] / "clients"
HAVE_VERCEL_AI = (CLIENTS / "node_modules" / "ai").is_dir() and shutil.which("node") is not None


def vercel_ai(base: str, model: str, scenario: str, key: str) -> dict:
    """The real Vercel AI SDK (tests/clients/vercel_ai.mjs): its result and every request body it sent."""
    done = subprocess.run(
        ["node", str(CLIENTS / "vercel_ai.mjs"), base, model, scenario, key], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout)


needs_vercel_ai = pytest.mark.skipif(
    not HAVE_VERCEL_AI,
    reason="the Vercel AI SDK is not installed (make install: tests/clients/package.json)",
)

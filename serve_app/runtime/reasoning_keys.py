"""The keys that seal `encrypted_content` of reasoning items, shared by every ingress replica.

`RESPONSES_SERVE_REASONING_KEYS`: comma-separated Fernet keys (from a Kubernetes secret, the
environment of `serve run` ...), the first encrypts, all decrypt (rotation). Unset, the
application uses a key generated when it was built (`build_app`), handed to all of its
ingress replicas: blobs work across replicas but not across a redeploy (then they are a 400,
as any foreign blob), so production sets the variable.
"""

from __future__ import annotations

import logging
import os

from serve_app.core.encrypted_reasoning import ReasoningCipher

ENV_VAR = "RESPONSES_SERVE_REASONING_KEYS"

logger = logging.getLogger(__name__)


def reasoning_keys(fallback: str | None = None) -> list[str]:
    """The configured keys, else `fallback` (the application's own), else a new key."""
    keys = [key.strip() for key in os.environ.get(ENV_VAR, "").split(",") if key.strip()]
    if keys:
        return keys
    logger.warning(
        "%s is not set: reasoning items are sealed with a key %s; set it (a list of Fernet keys "
        "shared by all replicas) so that encrypted reasoning survives restarts.",
        ENV_VAR,
        "made for this application deployment" if fallback else "made for this process only",
    )
    return [fallback or ReasoningCipher.generate_key()]

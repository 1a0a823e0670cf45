"""Each tenant's state on this replica: its stored responses, conversations, files and background
runs (each reaching only the tenant's keys, serve_app/state/tenancy.py) and the service
tiers it may use. A route takes the state of the tenant the auth middleware put into its
scope (`server.context.tenant_state`); there is no state that is not some tenant's."""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from serve_app.core.encrypted_reasoning import ReasoningCipher
from serve_app.runtime.background import BackgroundRuns
from serve_app.runtime.files import FileInputs
from serve_app.runtime.vector_stores import TenantVectorStores
from serve_app.state.conversations import ConversationStore
from serve_app.state.files import FileStore
from serve_app.state.quotas import TenantQuota
from serve_app.state.responses import ResponseStore


@dataclass(frozen=True, slots=True)
class TenantState:
    name: str
    responses: ResponseStore
    conversations: ConversationStore
    background: BackgroundRuns
    service_tiers: frozenset[str] | None  # the tiers it may ask for (None: every one)
    quota: TenantQuota | None  # its limits (None: it has none)
    cipher: ReasoningCipher  # its encrypted reasoning: sealed for it, opened for it only
    cache_salt: str | None = None  # its engine prefix cache's (`prefix_cache_salt`; None: shared)
    vector_stores: TenantVectorStores | None = None  # its vector stores (None: no Vector Stores API)
    files: FileStore | None = None  # its uploads (the Files API; None: no Files API)
    file_inputs: FileInputs | None = None  # what reads its `input_file` parts (None: `file_data` only)


def prefix_cache_salt(key: str, tenant: str) -> str:
    """The salt of `tenant`'s engine requests: vLLM's prefix cache reuses a block only for the
    same salt, so a tenant can neither hit nor time another's cached prompts. Keyed (a key
    derived from the application's first reasoning key, which every ingress replica shares),
    so the same on every replica, and a salt an engine-side log or KV-cache event shows does
    not name the tenant. The API key plays no part in it."""
    salt_key = HKDF(hashes.SHA256(), length=32, salt=None, info=b"responses-serve prefix-cache salt").derive(base64.urlsafe_b64decode(key))
    return hmac.new(salt_key, tenant.encode(), hashlib.sha256).hexdigest()  # 64 characters: within vLLM's 128

"""Each tenant's state on this replica: its stored responses, conversations and background
runs (each reaching only the tenant's keys, responses_serve/state/tenancy.py) and the service
tiers it may use. A route takes the state of the tenant the auth middleware put into its
scope (`tenant_state`); there is no state that is not some tenant's."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import HTTPConnection

from responses_serve.encrypted_reasoning import ReasoningCipher
from responses_serve.server.auth import tenant_of
from responses_serve.server.background import BackgroundRuns
from responses_serve.state.conversations import ConversationStore
from responses_serve.state.quotas import TenantQuota
from responses_serve.state.responses import ResponseStore


@dataclass(frozen=True, slots=True)
class TenantState:
    name: str
    responses: ResponseStore
    conversations: ConversationStore
    background: BackgroundRuns
    service_tiers: frozenset[str] | None  # the tiers it may ask for (None: every one)
    quota: TenantQuota | None  # its limits (None: it has none)
    cipher: ReasoningCipher  # its encrypted reasoning: sealed for it, opened for it only


def tenant_state(connection: HTTPConnection) -> TenantState:
    """The calling tenant's state (HTTP request or WebSocket)."""
    return connection.app.state.tenants[tenant_of(connection.scope)]

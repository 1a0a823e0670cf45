"""`service_tier`: which requests an engine serves first when it cannot serve them all.

OpenAI's tiers become vLLM's request priority (lower is served earlier). An engine with
`scheduling_policy: priority` (our default) keeps its waiting requests ordered by (priority,
arrival), and when its KV cache runs out it preempts the running request with the largest
(priority, arrival) first. Requests of one tier keep first-come-first-served order, so a
deployment whose clients send no tier is scheduled exactly as with `fcfs`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

# What a request may ask for (the OpenAI API's values).
ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]
# What a response reports: the tier it was actually served in.
ServedTier = Literal["default", "flex", "priority"]

_ENGINE_PRIORITY: dict[ServedTier, int] = {"priority": -1, "default": 0, "flex": 1}


def served_tier(requested: ServiceTier | None, tiered: bool, allowed: Collection[str] | None = None) -> ServedTier:
    """The tier a request is served in. `auto` and `scale` (OpenAI's reserved capacity, which
    a self-hosted deployment does not sell) are `default`; so is every tier of a model whose
    requests are not ordered by tier (`tiered` false: a vLLM engine with fcfs scheduling),
    and a tier the caller's tenant may not use (not in `allowed`; None: every tier):
    the response says so."""
    if tiered and requested in ("flex", "priority") and (allowed is None or requested in allowed):
        return requested
    return "default"


def engine_priority(tier: ServedTier) -> int:
    """vLLM's `priority` for a served tier (`default` is vLLM's own default, 0)."""
    return _ENGINE_PRIORITY[tier]

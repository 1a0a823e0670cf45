"""LangChain, Pydantic AI and LiteLLM, unmodified, on both families (tests/support/framework_scenarios.py);
the same scenarios run through Serve in tests/deployments/test_agent_frameworks_e2e.py."""

from __future__ import annotations

import pytest

from tests.support import framework_scenarios

pytestmark = pytest.mark.slow  # each framework run is a few round trips and imports


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
@pytest.mark.parametrize("scenario", framework_scenarios.SCENARIOS, ids=lambda f: f.__name__)
def test_framework(inprocess_url, scenario, model):
    scenario(inprocess_url, model)

"""The official `openai` SDK against the FastAPI app served in-process (uvicorn, no Ray)."""

from __future__ import annotations

import openai
import pytest

from tests.support import sdk_scenarios


@pytest.mark.parametrize("model", sdk_scenarios.REPLAY_MODELS)
@pytest.mark.parametrize("scenario", sdk_scenarios.ALL, ids=lambda f: f.__name__)
def test_scenario(inprocess_url, scenario, model):
    scenario(inprocess_url, model)


@pytest.mark.parametrize(
    "scenario", [sdk_scenarios.non_stream_echo, sdk_scenarios.stream_helper_accumulates, sdk_scenarios.tool_call_round_trip]
)
def test_template_that_opens_think_in_the_prompt(inprocess_url, scenario):
    scenario(inprocess_url, "qwen3-replay-thinking")


@pytest.mark.slow
def test_16_concurrent_streams(inprocess_url, replay_backend):
    sdk_scenarios.concurrent_streams(inprocess_url, 16)
    assert replay_backend.num_running() == 0
    sdk_scenarios.concurrent_streams(inprocess_url, 16, "qwen3-replay")


def test_models_and_retrieve(inprocess_url):
    sdk = sdk_scenarios.client(inprocess_url)
    assert [m.id for m in sdk.models.list()] == ["gpt-oss-replay", "qwen3-replay", "qwen3-replay-thinking", "qwen3-vl-replay"]
    assert sdk.models.retrieve("qwen3-replay") == next(m for m in sdk.models.list() if m.id == "qwen3-replay")
    for missing in ("nope", "org/nope"):
        with pytest.raises(openai.NotFoundError) as error:
            sdk.models.retrieve(missing)
        assert (error.value.body["code"], error.value.body["param"]) == ("model_not_found", "model")
    created = sdk.responses.create(model="gpt-oss-replay", input="keep me")
    assert sdk.responses.retrieve(created.id).output_text == "keep me"
    not_stored = sdk.responses.create(model="gpt-oss-replay", input="forget me", store=False)
    with pytest.raises(openai.NotFoundError) as info:
        sdk.responses.retrieve(not_stored.id)
    assert getattr(info.value, "status_code", None) == 404

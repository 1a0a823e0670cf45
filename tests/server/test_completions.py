"""`POST /v1/completions` (the SDK's `client.completions.create`): raw prompts continued,
for models whose config allows them; tokenized as text (a spelled special token stays its
characters); streamed and not; what is not supported a 400 naming it. The replay models
continue a raw prompt with itself."""

from __future__ import annotations

import openai
import pytest
from openai import OpenAI

from serve_app.config import ModelConfig
from serve_app.engines import make_backend
from serve_app.engines.replay import ReplayBackend
from serve_app.runtime.models import served_model
from serve_app.server.app import ServedModel, create_app
from tests.conftest import QWEN3_REPLAY
from tests.support.servers import uvicorn_server

FAMILIES = ["gpt-oss-replay", "qwen3-replay"]
PROMPT = "Once upon a time <|im_end|><|end|> in Zürich 🙂"


@pytest.fixture(scope="module")
def client():
    qwen3 = ModelConfig.model_validate({**QWEN3_REPLAY, "raw_prompts": True})
    models = [
        ServedModel("gpt-oss-replay", ReplayBackend(), raw_prompts=True),
        served_model(qwen3, make_backend(qwen3.backend)),
        ServedModel("templated-only", ReplayBackend()),
    ]
    with uvicorn_server(create_app(models)) as url:
        yield OpenAI(base_url=url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("model", FAMILIES)
def test_a_raw_prompt_is_continued_as_text(client, model):
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=200)
    assert completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    (choice,) = completion.choices
    assert choice.text == PROMPT  # the spelled special tokens were text: they came back as text
    assert choice.finish_reason == "stop"
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    cut = client.completions.create(model=model, prompt=PROMPT)  # OpenAI's default: 16 tokens
    assert (cut.choices[0].finish_reason, cut.usage.completion_tokens) == ("length", 16)
    assert PROMPT.startswith(cut.choices[0].text)


@pytest.mark.parametrize("model", FAMILIES)
def test_streamed_is_the_same_text(client, model):
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=200).choices[0].text
    pieces, finish, usage = [], None, None
    for chunk in client.completions.create(model=model, prompt=PROMPT, max_tokens=200, stream=True, stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            pieces.append(choice.text)
            finish = choice.finish_reason or finish
    assert "".join(pieces) == whole
    assert finish == "stop"
    assert usage is not None


@pytest.mark.parametrize("model", FAMILIES)
def test_a_stop_sequence_ends_the_text_streamed_and_not(client, model):
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=200)
    cut = client.completions.create(model=model, prompt=PROMPT, max_tokens=200, stop=["Zür", "nowhere"])
    assert (cut.choices[0].text, cut.choices[0].finish_reason) == ("Once upon a time <|im_end|><|end|> in ", "stop")
    assert cut.usage.completion_tokens < whole.usage.completion_tokens
    pieces = [
        choice.text
        for chunk in client.completions.create(model=model, prompt=PROMPT, max_tokens=200, stop="Zür", stream=True)
        for choice in chunk.choices
    ]
    assert "".join(pieces) == cut.choices[0].text


def test_token_ids_are_a_prompt_too(client):
    ids = client.completions.create(model="gpt-oss-replay", prompt=[12194, 13, 2375], max_tokens=10)
    assert ids.usage.prompt_tokens == 3
    assert ids.choices[0].text


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"n": 2}, "n"), ({"echo": True}, "echo"), ({"suffix": "x"}, "suffix"), ({"logprobs": 2}, "logprobs")],
)
def test_what_is_not_supported_is_a_400_naming_it(client, extra, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model="gpt-oss-replay", prompt="hi", **extra)
    assert error.value.body["param"] == param


def test_a_model_without_raw_prompts_refuses_them(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model="templated-only", prompt="hi")
    assert error.value.body["param"] == "model"
    assert "raw_prompts" in error.value.body["message"]

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


def _streamed(client: OpenAI, **body) -> tuple[str, dict[str, list]]:
    """A streamed completion's text and its chunks' logprobs put together."""
    text, logprobs = "", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in client.completions.create(stream=True, **body):
        for choice in chunk.choices:
            text += choice.text
            for key, values in logprobs.items():
                values += getattr(choice.logprobs, key) if choice.logprobs else []
    return text, logprobs


def _check_offsets(text: str, logprobs) -> None:
    """Each token at its `text_offset` in the text (tokens of whole characters)."""
    assert "".join(logprobs["tokens"]) == text
    assert len(logprobs["text_offset"]) == len(logprobs["tokens"])
    for token, offset in zip(logprobs["tokens"], logprobs["text_offset"]):
        assert text[offset : offset + len(token)] == token


@pytest.mark.parametrize("model", FAMILIES)
def test_logprobs_are_written_the_legacy_way(client, model):
    """`logprobs: N`: a token, its logprob, its top N alternatives and its offset in the text,
    per token of the text, streamed and not; with `stop`, of the text shown only."""
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=200, logprobs=2)
    text, logprobs = whole.choices[0].text, whole.choices[0].logprobs.model_dump()
    assert text == PROMPT
    _check_offsets(text, logprobs)
    assert logprobs["token_logprobs"] == [0.0] * len(logprobs["tokens"])  # the replay engine is sure
    assert all(top == {token: 0.0} for token, top in zip(logprobs["tokens"], logprobs["top_logprobs"]))
    assert _streamed(client, model=model, prompt=PROMPT, max_tokens=200, logprobs=2) == (text, logprobs)
    stopped = client.completions.create(model=model, prompt=PROMPT, max_tokens=200, logprobs=0, stop=" in")
    assert stopped.choices[0].text == "Once upon a time <|im_end|><|end|>"
    _check_offsets(stopped.choices[0].text, stopped.choices[0].logprobs.model_dump())
    assert stopped.choices[0].logprobs.top_logprobs == [{}] * len(stopped.choices[0].logprobs.tokens)  # none asked for


@pytest.mark.parametrize("model", FAMILIES)
def test_echo_returns_the_prompt_and_its_logprobs(client, model):
    """`echo`: the prompt before the completion; with `logprobs`, the prompt's tokens first,
    the first with no logprob (nothing predicts it), streamed and not."""
    plain = client.completions.create(model=model, prompt=PROMPT, max_tokens=200, echo=True)
    assert plain.choices[0].text == PROMPT + PROMPT
    assert plain.choices[0].logprobs is None
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=200, echo=True, logprobs=1)
    text, logprobs = whole.choices[0].text, whole.choices[0].logprobs.model_dump()
    assert text == PROMPT + PROMPT
    _check_offsets(text, logprobs)
    prompt_tokens = whole.usage.prompt_tokens
    assert len(logprobs["tokens"]) == prompt_tokens + whole.usage.completion_tokens - 1  # the completion's end token writes nothing
    assert logprobs["token_logprobs"][0] is None
    assert logprobs["top_logprobs"][0] is None
    assert logprobs["token_logprobs"][1:] == [0.0] * (len(logprobs["tokens"]) - 1)
    assert "".join(logprobs["tokens"][:prompt_tokens]) == PROMPT
    assert _streamed(client, model=model, prompt=PROMPT, max_tokens=200, echo=True, logprobs=1) == (text, logprobs)
    ids = client.completions.create(model="gpt-oss-replay", prompt=[12194, 13, 2375], max_tokens=10, echo=True)
    assert ids.choices[0].text.startswith(
        client.completions.create(model="gpt-oss-replay", prompt=[12194, 13, 2375], max_tokens=10).choices[0].text
    )


def test_token_ids_are_a_prompt_too(client):
    ids = client.completions.create(model="gpt-oss-replay", prompt=[12194, 13, 2375], max_tokens=10)
    assert ids.usage.prompt_tokens == 3
    assert ids.choices[0].text


@pytest.mark.parametrize("prompt", [[-1], [2**40], [5, 2**31]])
def test_a_token_id_no_engine_takes_is_a_400(client, prompt):
    """Found by the schema fuzzer: a negative or 64-bit id failed in the parser (a 503)."""
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model="gpt-oss-replay", prompt=prompt)
    assert error.value.body["param"].startswith("prompt")


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"n": 2}, "n"), ({"suffix": "x"}, "suffix"), ({"logprobs": 6}, "logprobs"), ({"best_of": 2}, "best_of")],
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

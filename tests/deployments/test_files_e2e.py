"""Files through a real Serve cluster: two ingress replicas (each at its own address) sharing
an S3-compatible blob store and the embedded state store (tests/deployments/conftest.py). A
file uploaded through one replica is listed, read and given to a model through the other,
and deleted through either: with a blob store per replica, half of these would fail."""

from __future__ import annotations

import io

import openai
import pytest

from tests.support.pdfs import text_pdf

MODELS = ["gpt-oss-replay", "qwen3-replay"]


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)


def test_a_file_uploaded_on_one_replica_is_read_on_the_other(ingress_urls, serve_url):
    first, second = (sdk(url) for url in ingress_urls)
    pdf = text_pdf(["The harbour opens at DAWN.", "Bring the BLUE lantern."], compress=True)
    uploaded = first.files.create(file=("orders.pdf", io.BytesIO(pdf)), purpose="user_data")
    assert second.files.retrieve(uploaded.id) == uploaded
    assert uploaded.id in [file.id for file in second.files.list()]
    assert second.files.content(uploaded.id).content == pdf
    for client in (first, second, sdk(serve_url)):
        for model in MODELS:
            answer = client.responses.create(
                model=model,
                input=[
                    {
                        "role": "user",
                        "content": [{"type": "input_text", "text": "When?"}, {"type": "input_file", "file_id": uploaded.id}],
                    }
                ],
            )
            assert "The harbour opens at DAWN." in answer.output_text, (model, answer.output_text)
            assert "Bring the BLUE lantern." in answer.output_text
            assert "[file: orders.pdf]" in answer.output_text
    assert second.files.delete(uploaded.id).deleted
    for client in (first, second):
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(uploaded.id)
        with pytest.raises(openai.NotFoundError):
            client.files.content(uploaded.id)

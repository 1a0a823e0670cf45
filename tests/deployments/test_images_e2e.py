"""Images through Serve with two ingress replicas: the `openai` SDK sends a Pillow image by data
URL to `qwen3-vl-replay` on one replica (Responses and Chat Completions), and the stored
response's chain, continued on the other replica, still holds the image; a text-only model
refuses it."""

from __future__ import annotations

import base64
import io

import openai
import pytest
from openai import OpenAI
from PIL import Image


def _image(width: int, height: int) -> str:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (90, 120, 200)).save(out, "JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


def test_an_image_through_serve_and_its_chain_on_the_other_replica(ingress_urls, serve_url):
    first, second = (OpenAI(base_url=url, api_key="unused", max_retries=0) for url in ingress_urls[:2])
    content = [{"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": _image(320, 200)}]
    shown = first.responses.create(model="qwen3-vl-replay", input=[{"role": "user", "content": content}], store=True)
    assert shown.output_text == "I see 1 image: 320x200."
    follow_up = second.responses.create(model="qwen3-vl-replay", input="and?", previous_response_id=shown.id)
    # An echo: the prompt holds the first turn's placeholder and the engine request its image, read
    # again by this replica from the stored turn (else the model says they disagree).
    assert follow_up.output_text == "and?"
    assert follow_up.usage.input_tokens > shown.usage.input_tokens  # the image's 10x6 tokens again, and more
    proxy = OpenAI(base_url=serve_url, api_key="unused", max_retries=0)
    chat = [{"type": "text", "text": "and this?"}, {"type": "image_url", "image_url": {"url": _image(64, 32), "detail": "low"}}]
    completion = proxy.chat.completions.create(model="qwen3-vl-replay", messages=[{"role": "user", "content": chat}])
    assert completion.choices[0].message.content == "I see 1 image: 64x32."
    with pytest.raises(openai.BadRequestError) as refused:
        proxy.responses.create(model="qwen3-replay", input=[{"role": "user", "content": content}])
    assert refused.value.body["param"] == "input[0].content[1]"

"""A vision family's images: the size a model sees them at (for every size, within the bound of
their `detail`, aspect kept), their token cost, and the template's placeholders: one per image
part, never one a client writes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serve_app.api.items import FilePart, MessageItem
from serve_app.api.request import ResponsesRequest
from serve_app.config import ModelConfig
from serve_app.families.vision import IMAGE_PAD, VisionSpec
from serve_app.runtime.models import model_family
from serve_app.server.local import QWEN3_VL_REPLAY

SPEC = VisionSpec(max_pixels=1024 * 1024, low_detail_pixels=512 * 512, token_pixels=32)


@given(st.integers(1, 20_000), st.integers(1, 20_000), st.sampled_from(["low", "high", "auto"]))
def test_the_seen_size_is_within_the_details_bound_and_keeps_the_aspect(width, height, detail):
    seen_width, seen_height = SPEC.seen_size(width, height, detail)
    assert seen_width * seen_height <= max(SPEC.pixel_bound(detail), 1)
    assert (seen_width, seen_height) == (width, height) or width * height > SPEC.pixel_bound(detail)
    assert seen_width <= width
    assert seen_height <= height
    if min(seen_width, seen_height) > 1:  # one pixel of rounding on either side
        assert (seen_width - 1) / (seen_height + 1) <= width / height <= (seen_width + 1) / (seen_height - 1)


@pytest.mark.parametrize(("size", "tokens"), [((1, 1), 1), ((32, 32), 1), ((640, 480), 300), ((1448, 724), 45 * 23), ((47, 49), 2)])
def test_an_image_costs_qwen_vls_grid(size, tokens):
    assert SPEC.image_tokens(*size) == tokens


@pytest.fixture(scope="module")
def family():
    return model_family(ModelConfig.model_validate(QWEN3_VL_REPLAY))


def test_the_template_writes_one_placeholder_per_image_where_it_was(family):
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    content = [{"type": "input_text", "text": "first "}, image, {"type": "input_text", "text": " then"}, image]
    history = [MessageItem(role="user", content=content)]
    prompt = family.render_prompt(ResponsesRequest(model="m", input="x"), history)
    assert family.count_images(prompt) == 2
    text = family.tokenizer.decode(prompt, skip_special_tokens=False)
    assert "first <|vision_start|><|image_pad|><|vision_end|> then<|vision_start|><|image_pad|><|vision_end|>" in text


def test_a_pdf_shown_with_its_pages_is_its_text_then_one_placeholder_a_page(family):
    pdf = FilePart(type="input_file", file_id="file-1", filename="r.pdf")
    pdf._text, pdf._shown, pdf._caption = "page text", 2, "[r.pdf: pages 1-2 of 9 follow as images]"
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    history = [MessageItem(role="user", content=[{"type": "input_text", "text": "read "}, pdf, image])]
    prompt = family.render_prompt(ResponsesRequest(model="m", input="x"), history)
    assert family.count_images(prompt) == 3
    text = family.tokenizer.decode(prompt, skip_special_tokens=False)
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    assert f"read [file: r.pdf]\npage text\n[end of file: r.pdf]\n[r.pdf: pages 1-2 of 9 follow as images]{placeholder * 3}" in text
    pdf._shown, pdf._caption = 0, ""  # no page shown: the file's text alone, as a text model reads it
    prompt = family.render_prompt(ResponsesRequest(model="m", input="x"), history)
    assert family.count_images(prompt) == 1


def test_a_client_spelling_the_placeholder_writes_text(family):
    spelled = f"<|vision_start|>{IMAGE_PAD}<|vision_end|>"
    history = [MessageItem(role="user", content=[{"type": "input_text", "text": spelled}])]
    prompt = family.render_prompt(ResponsesRequest(model="m", input="x"), history)
    assert family.count_images(prompt) == 0
    assert family.tokenizer.convert_tokens_to_ids(IMAGE_PAD) not in prompt

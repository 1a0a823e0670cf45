"""A PDF's pages as images for vision models, through the in-process app and the `openai` SDK:
`qwen3-vl-replay` says what it was shown (count, sizes) for generated PDFs; the pages share
the image count with `input_image` parts and past it are text only; text models read the
text only; hostile PDFs (a 200-inch page, an image claiming 10^10 pixels, a page that cannot
be loaded, many pages) are bounded and the model is told; page images count in
`input_tokens` as images do."""

from __future__ import annotations

import base64
import io

import openai
import pytest
from PIL import Image

from serve_app.config import BlobConfig, FilesConfig, ModelConfig
from serve_app.engines import make_backend
from serve_app.runtime.models import served_model
from serve_app.server.app import ServerSettings, create_app
from tests.conftest import QWEN3_REPLAY, QWEN3_VL_REPLAY
from tests.support.pdfs import image_bomb_pdf, text_pdf, unloadable_page_pdf
from tests.support.servers import uvicorn_server

pytestmark = pytest.mark.slow  # a second or more each on a loaded 2-core machine (the unit tests: tests/tools/test_pdf_pages.py)

VISION = "qwen3-vl-replay"  # 8 images, the first 4 pages of a PDF
SMALL = "vl-small"  # 3 images, the first 2 pages
TEXT_PDFS = "vl-text-pdfs"  # pdf_page_images: 0
LETTER = "900x1164"  # a US Letter page drawn at 1 Mpixel at most
LETTER_TOKENS = 28 * 36  # Qwen3-VL's grid: 32 x 32 pixels a token


def _vision(name: str, **vision: int) -> ModelConfig:
    return ModelConfig.model_validate({**QWEN3_VL_REPLAY, "name": name, "vision": {**QWEN3_VL_REPLAY["vision"], **vision}})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    configs = [
        _vision(VISION),
        _vision(SMALL, max_images=3, pdf_page_images=2),
        _vision(TEXT_PDFS, pdf_page_images=0),
        ModelConfig.model_validate(QWEN3_REPLAY),
    ]
    files = FilesConfig(blob=BlobConfig(path=str(tmp_path_factory.mktemp("blobs"))))
    app = create_app([served_model(config, make_backend(config.backend)) for config in configs], ServerSettings(files=files))
    with uvicorn_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server, api_key="unused", max_retries=0, timeout=120)


def pdf_part(data: bytes, name: str = "report.pdf") -> dict:
    return {"type": "input_file", "filename": name, "file_data": "data:application/pdf;base64," + base64.b64encode(data).decode()}


def image_part(width: int, height: int) -> dict:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, "PNG")
    return {"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()}


def ask(*parts: dict, text: str = "What does it say?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_text", "text": text}, *parts]}]


def pages(count: int) -> list[str]:
    return [f"Page {number} of the report says hello." for number in range(1, count + 1)]


def test_a_vision_model_sees_a_pdfs_first_pages_as_images_beside_its_text(client):
    six = pdf_part(text_pdf(pages(6)))
    response = client.responses.create(model=VISION, input=ask(six))
    assert response.output_text == f"I see 4 images: {', '.join([LETTER] * 4)}."  # the first pdf_page_images pages
    counted = client.responses.input_tokens.count(model=VISION, input=ask(six))
    assert counted.input_tokens == response.usage.input_tokens
    # The same model with pdf_page_images: 0 reads the text alone (the echo: no image in the prompt) ...
    text_only = client.responses.create(model=TEXT_PDFS, input=ask(six))
    assert all(page in text_only.output_text for page in pages(6))
    assert "[report.pdf: " not in text_only.output_text  # no line on page images
    # ... which the vision prompt holds too, with the four pages' images.
    assert response.usage.input_tokens - text_only.usage.input_tokens > 4 * (LETTER_TOKENS - 1)


def test_page_images_cost_the_tokens_of_images_of_their_size(client):
    letter = client.responses.create(model=VISION, input=ask(pdf_part(text_pdf(["Same words."]))))
    wide = client.responses.create(model=VISION, input=ask(pdf_part(text_pdf(["Same words."], size=(200, 100)))))
    assert (letter.output_text, wide.output_text) == (f"I see 1 image: {LETTER}.", "I see 1 image: 800x400.")
    # The same text and placeholders: the prompts differ in the images' tokens only (800x400: 25 x 12).
    assert letter.usage.input_tokens - wide.usage.input_tokens == LETTER_TOKENS - 25 * 12


def test_pages_share_the_image_count_with_input_images_and_past_it_are_text(client):
    three = pdf_part(text_pdf(pages(3)))
    mixed = client.responses.create(model=SMALL, input=ask(image_part(64, 48), image_part(20, 10), three))
    assert mixed.output_text == f"I see 3 images: 64x48, 20x10, {LETTER}."  # one place left: the first page
    full = client.responses.create(model=SMALL, input=ask(image_part(64, 48), image_part(20, 10), image_part(8, 8), three))
    assert full.output_text == "I see 3 images: 64x48, 20x10, 8x8."  # no place left: the PDF is text only, no 400
    with pytest.raises(openai.BadRequestError) as refused:  # input_image parts past the bound are a 400, as before
        client.responses.create(model=SMALL, input=ask(*[image_part(8, 8)] * 4, three))
    assert refused.value.body["code"] == "too_many_images"
    # Two files: the newest shows its pages first (2), the older one what is left (1).
    older, newer = pdf_part(text_pdf(pages(2)), "older.pdf"), pdf_part(text_pdf(pages(2)), "newer.pdf")
    both = client.responses.create(model=SMALL, input=[*ask(older, text="first"), *ask(newer, text="second")])
    assert both.output_text == f"I see 2 images: {LETTER}, {LETTER}."  # the last message's; the prompt agrees with 3
    alone = client.responses.create(model=SMALL, input=[*ask(text="first"), *ask(newer, text="second")])
    shown = both.usage.input_tokens - alone.usage.input_tokens  # the older file: its text and its first page
    assert LETTER_TOKENS - 1 < shown < 2 * (LETTER_TOKENS - 1)


@pytest.mark.parametrize("model", ["qwen3-replay", TEXT_PDFS])
def test_a_text_model_reads_the_pdfs_text_only(client, model):
    response = client.responses.create(model=model, input=ask(pdf_part(text_pdf(pages(3)))))
    assert "[file: report.pdf]" in response.output_text
    assert all(page in response.output_text for page in pages(3))
    assert "[report.pdf: " not in response.output_text  # no line on page images


def test_hostile_pdfs_are_bounded_and_the_model_is_told(client):
    huge = client.responses.create(model=VISION, input=ask(pdf_part(text_pdf(["Two hundred inches."], size=(14400, 14400)))))
    assert huge.output_text == "I see 1 image: 1024x1024."  # 200 x 200 inches, drawn within 1 Mpixel
    # A page drawing an image that claims 10^10 pixels is not drawn: no image, so the replay
    # model echoes the prompt's text, which tells why.
    bomb = client.responses.create(model=VISION, input=ask(pdf_part(image_bomb_pdf(), "bomb.pdf")))
    assert "A page with a picture." in bomb.output_text
    assert "[bomb.pdf: page 1 is not shown as an image: it draws an image of 100000 x 100000 pixels" in bomb.output_text
    broken = client.responses.create(model=VISION, input=ask(pdf_part(unloadable_page_pdf(pages(3), broken=2))))
    assert broken.output_text == f"I see 3 images: {LETTER}, {LETTER}, {LETTER}."  # pages 1, 3 and 4 as PDFium counts
    many = client.responses.create(model=VISION, input=ask(pdf_part(text_pdf(pages(40)))))
    assert many.output_text == f"I see 4 images: {', '.join([LETTER] * 4)}."
    many_text = client.responses.create(model=TEXT_PDFS, input=ask(pdf_part(text_pdf(pages(40)))))
    assert "Page 40 of the report says hello." in many_text.output_text  # every page's text


def test_an_uploaded_pdf_shows_its_pages_and_a_later_turn_shows_them_again(client):
    file = client.files.create(file=("upload.pdf", io.BytesIO(text_pdf(pages(2)))), purpose="user_data")
    first = client.responses.create(model=VISION, input=ask({"type": "input_file", "file_id": file.id}), store=True)
    assert first.output_text == f"I see 2 images: {LETTER}, {LETTER}."
    later = client.responses.create(model=VISION, input="and now?", previous_response_id=first.id)
    assert later.output_text == "and now?"  # no image in the last turn: the echo (placeholders and images agree)
    fresh = client.responses.create(model=VISION, input=[*ask(text="What does it say?"), *ask(text="and now?")])
    assert later.usage.input_tokens - fresh.usage.input_tokens > 2 * (LETTER_TOKENS - 1)
    client.files.delete(file.id)


def test_chat_completions_file_parts_show_their_pages(client):
    data = "data:application/pdf;base64," + base64.b64encode(text_pdf(pages(2))).decode()
    completion = client.chat.completions.create(
        model=VISION,
        messages=[{"role": "user", "content": [{"type": "text", "text": "read"}, {"type": "file", "file": {"file_data": data}}]}],
    )
    assert completion.choices[0].message.content == f"I see 2 images: {LETTER}, {LETTER}."

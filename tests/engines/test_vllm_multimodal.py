"""A vision model's engine request as vLLM is given it (no VL model runs here: the request is
built and checked): its prompt's token ids with one `<|image_pad|>` per image, the images as
`multi_modal_data` in their order at the size the ingress chose (a PDF's drawn pages among
them, as any image), the tenant's cache salt; and the engine arguments of the shipped
Qwen3-VL config."""

from __future__ import annotations

import io
import time
from pathlib import Path

import yaml
from PIL import Image

from serve_app.config import AppConfig
from serve_app.core.tokens import EngineImage, GenerationRequest
from serve_app.engines.vllm import _engine_kwargs, multimodal_prompt
from serve_app.families.vision import VisionSpec
from serve_app.runtime.images import page_image
from serve_app.tools.pdf_pages import PageBounds, render_pages
from tests.support.pdfs import text_pdf

PAD = 151655  # Qwen-VL's <|image_pad|>


def _png(width: int, height: int, color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def test_the_engine_request_carries_the_images_as_multi_modal_data_in_order():
    images = [
        EngineImage(_png(640, 480, (255, 0, 0)), 640, 480, 300),
        EngineImage(_png(2048, 1024, (0, 0, 255)), 1448, 724, 45 * 23),  # scaled down for its detail
    ]
    prompt_ids = [151644, 872, 198, 151652, PAD, 151653, 151652, PAD, 151653, 151645]
    request = GenerationRequest("resp_1", prompt_ids, images=images, cache_salt="tenant-salt")
    prompt = multimodal_prompt(request)
    assert prompt["prompt_token_ids"] == prompt_ids
    assert prompt["cache_salt"] == "tenant-salt"
    shown = prompt["multi_modal_data"]["image"]
    assert [(image.mode, image.size) for image in shown] == [("RGB", (640, 480)), ("RGB", (1448, 724))]
    assert [image.getpixel((0, 0)) for image in shown] == [(255, 0, 0), (0, 0, 255)]
    assert prompt["prompt_token_ids"].count(PAD) == len(shown)
    assert request.image_tokens == 299 + 45 * 23 - 1


def test_a_pdfs_drawn_pages_are_carried_as_images_are():
    spec = VisionSpec()
    drawn = render_pages(
        text_pdf(["first page", "second page"]), PageBounds(2, spec.max_pixels, spec.max_decode_pixels), time.monotonic() + 60
    )
    pages = [page_image(page, spec) for page in drawn.images]
    images = [EngineImage(_png(64, 32, (0, 255, 0)), 64, 32, 2), *pages]
    prompt_ids = [151644, 872, 198, *[151652, PAD, 151653] * 3, 151645]
    prompt = multimodal_prompt(GenerationRequest("resp_2", prompt_ids, images=images))
    shown = prompt["multi_modal_data"]["image"]
    assert [(image.mode, image.size) for image in shown] == [("RGB", (64, 32)), ("RGB", (900, 1164)), ("RGB", (900, 1164))]
    assert [page.tokens for page in pages] == [28 * 36, 28 * 36]
    assert shown[1].getextrema()[0][0] < 128  # the page's text, drawn black on white


def test_the_qwen3_vl_gpu_config_loads_and_maps_to_a_multi_modal_engine():
    document = yaml.safe_load((Path(__file__).parents[2] / "serve_app" / "configs" / "qwen3-vl-8b.yaml").read_text())
    (model,) = AppConfig.model_validate(document["applications"][0]["args"]).models
    assert model.family == "chat_template"
    assert model.vision is not None
    assert model.tokenizer == "Qwen/Qwen3-VL-8B-Instruct"
    assert model.chat_template.template is None  # the tokenizer's own writes the placeholders
    kwargs = _engine_kwargs(model.backend)
    assert kwargs["model"] == "Qwen/Qwen3-VL-8B-Instruct"
    assert kwargs["limit_mm_per_prompt"] == {"image": model.vision.max_images}  # vLLM refuses more per prompt
    assert model.vision.spec().image_tokens(1024, 1024) == 1024

"""Images for vision models, through the in-process app and the `openai` SDK: `qwen3-vl-replay`
says what it was shown (count, the sizes it sees them at); text-only models refuse an image
with a 400 naming the model and the part; images that cannot be read are 400s naming why;
stored responses keep image parts as sent and `previous_response_id` chains show them again."""

from __future__ import annotations

import base64
import io
import random
import struct
import zlib

import httpx
import openai
import pytest
from openai import OpenAI
from PIL import Image

from serve_app.config import BlobConfig, FilesConfig, ModelConfig
from serve_app.engines import make_backend
from serve_app.runtime.models import served_model
from serve_app.server.app import ServerSettings, create_app
from tests.conftest import QWEN3_VL_REPLAY
from tests.support.servers import uvicorn_server

VISION = "qwen3-vl-replay"


def png(width: int, height: int, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def image_part(data: bytes, detail: str = "auto") -> dict:
    return {"type": "input_image", "image_url": data_url(data), "detail": detail}


def ask(*parts: dict, text: str = "What do you see?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_text", "text": text}, *parts]}]


@pytest.fixture(scope="module")
def client(inprocess_url):
    return OpenAI(base_url=inprocess_url, api_key="unused", max_retries=0)


@pytest.mark.slow
def test_the_sdk_sends_images_by_data_url_and_the_model_says_what_it_saw(client):
    response = client.responses.create(model=VISION, input=ask(image_part(png(64, 48)), image_part(png(20, 10))))
    assert response.output_text == "I see 2 images: 64x48, 20x10."
    reasoning = next(item for item in response.output if item.type == "reasoning")
    assert reasoning.content[0].text == "The user showed 2 images."
    streamed = client.responses.create(model=VISION, input=ask(image_part(png(64, 48))), stream=True)
    texts = [event.delta for event in streamed if event.type == "response.output_text.delta"]
    assert "".join(texts) == "I see 1 image: 64x48."


def test_chat_completions_image_url_parts(client):
    content = [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": data_url(png(33, 17))}}]
    completion = client.chat.completions.create(model=VISION, messages=[{"role": "user", "content": content}])
    assert completion.choices[0].message.content == "I see 1 image: 33x17."
    low = [{"type": "image_url", "image_url": {"url": data_url(png(1024, 768)), "detail": "low"}}]
    completion = client.chat.completions.create(model=VISION, messages=[{"role": "user", "content": low}])
    assert completion.choices[0].message.content == "I see 1 image: 591x443."  # 512x512 pixels at most, aspect kept


@pytest.mark.slow
def test_detail_bounds_the_pixels_and_the_tokens_count_the_image(client, inprocess_url):
    big = png(2048, 1024)
    high = client.responses.create(model=VISION, input=ask(image_part(big, "high")))
    low = client.responses.create(model=VISION, input=ask(image_part(big, "low")))
    assert high.output_text == "I see 1 image: 1448x724."  # 1 Mpixel at most
    assert low.output_text == "I see 1 image: 724x362."
    # Qwen3-VL's grid: one token per 32x32 pixels (45 x 23 and 23 x 11), the pad token widened.
    assert high.usage.input_tokens - low.usage.input_tokens == 45 * 23 - 23 * 11
    counted = httpx.post(f"{inprocess_url}/responses/input_tokens", json={"model": VISION, "input": ask(image_part(big, "high"))})
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] == high.usage.input_tokens


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
def test_a_text_only_model_refuses_an_image_naming_itself_and_the_part(client, model):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=model, input=ask(image_part(png(8, 8))))
    error = refused.value.body
    assert error["param"] == "input[0].content[1]"
    assert f"Model '{model}' does not read images" in error["message"]
    content = [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": data_url(png(8, 8))}}]
    with pytest.raises(openai.BadRequestError) as chat_refused:
        client.chat.completions.create(
            model=model, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": content}]
        )
    assert f"Model '{model}' does not read images" in chat_refused.value.body["message"]
    assert chat_refused.value.body["param"] == "messages[1].content[1]"


def test_stored_responses_keep_the_image_parts_and_chains_show_them_again(client):
    first_image = image_part(png(40, 30))
    first = client.responses.create(model=VISION, input=ask(first_image), store=True)
    assert first.output_text == "I see 1 image: 40x30."
    listed = client.responses.input_items.list(first.id)
    stored = [part for item in listed.data for part in item.content if part.type == "input_image"]
    assert [(part.image_url, part.detail) for part in stored] == [(first_image["image_url"], "auto")]
    second = client.responses.create(model=VISION, input=ask(image_part(png(64, 64))), previous_response_id=first.id)
    assert second.output_text == "I see 1 image: 64x64."  # the last turn's images; the prompt holds both
    text_only = client.responses.create(model=VISION, input="and now?", previous_response_id=second.id)
    assert text_only.output_text == "and now?"  # no image in the last turn: the echo (placeholders and images agree)
    # Both earlier images are in its prompt: 64x64 pixels are 2x2 tokens (its pad token widened by 3).
    alone = client.responses.create(model=VISION, input="and now?")
    assert text_only.usage.input_tokens - alone.usage.input_tokens > 3


def _truncated_png() -> bytes:
    data = png(64, 64)
    return data[: len(data) // 2]


def _bomb_png(width: int = 100_000, height: int = 100_000) -> bytes:
    """A valid PNG header that claims `width` x `height` pixels (10 Gpixels), with a tiny body."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    ihdr = struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    body = zlib.compress(b"\0" * 1024)
    idat = struct.pack(">I", len(body)) + b"IDAT" + body + struct.pack(">I", zlib.crc32(b"IDAT" + body))
    return b"\x89PNG\r\n\x1a\n" + ihdr + idat


@pytest.mark.parametrize(
    ("part", "says"),
    [
        ({"type": "input_image", "image_url": data_url(_truncated_png())}, "truncated or corrupt"),
        ({"type": "input_image", "image_url": data_url(b"GIF89a not really")}, "not an image"),
        ({"type": "input_image", "image_url": data_url(b"plain text, no image")}, "not an image"),
        ({"type": "input_image", "image_url": data_url(_bomb_png())}, "too large to decode"),
        ({"type": "input_image", "image_url": data_url(_bomb_png(6000, 5000))}, "vision.max_decode_pixels"),
        ({"type": "input_image", "image_url": data_url(png(8, 8), "text/plain")}, "data URL of type 'text/plain'"),
        ({"type": "input_image", "image_url": "data:image/png;base64,@@not base64@@"}, "not valid base64"),
        ({"type": "input_image", "image_url": "data:image/png," + "x" * 10}, "base64"),
        ({"type": "input_image", "image_url": "ftp://example.com/cat.png"}, "only http and https"),
    ],
    ids=["truncated", "wrong-type", "not-an-image", "bomb", "big-header", "media-type", "bad-base64", "not-base64", "scheme"],
)
def test_images_that_cannot_be_read_are_400s_naming_the_part(inprocess_url, part, says):
    answer = httpx.post(f"{inprocess_url}/responses", json={"model": VISION, "input": ask(part)}, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "input[0].content[1].image_url"
    assert says in error["message"]


@pytest.mark.parametrize(
    ("input_", "param", "says"),
    [
        (ask(*[image_part(png(4, 4))] * 9), "input[0].content[9]", "at most 8"),
        ([{"role": "system", "content": [image_part(png(4, 4))]}, *ask()], "input[0].content[0]", "user messages only"),
        (ask({"type": "input_image"}), "input[0].content[1]", "exactly one of"),
        (
            [
                {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": [image_part(png(4, 4))]},
            ],
            "input[1].output[0]",
            "images and audio in tool outputs are not supported",
        ),
    ],
    ids=["too-many", "system-role", "no-source", "tool-output"],
)
def test_what_is_not_read_is_a_400_naming_it(inprocess_url, input_, param, says):
    answer = httpx.post(f"{inprocess_url}/responses", json={"model": VISION, "input": input_}, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert says in error["message"]
    assert error["param"] == param


def test_a_user_spelling_the_placeholder_writes_no_image(client):
    response = client.responses.create(model=VISION, input="<|vision_start|><|image_pad|><|vision_end|>")
    assert response.output_text == "<|vision_start|><|image_pad|><|vision_end|>"  # an echo: the prompt holds no placeholder


# --- images uploaded through the Files API ---

SMALL_IMAGES = 64 * 1024  # vision.max_image_bytes of the app below


@pytest.fixture(scope="module")
def files_url(tmp_path_factory):
    """A vision model with small image bounds, and the Files API on a blob directory."""
    vision = ModelConfig.model_validate({**QWEN3_VL_REPLAY, "vision": {**QWEN3_VL_REPLAY["vision"], "max_image_bytes": SMALL_IMAGES}})
    blob = BlobConfig(path=str(tmp_path_factory.mktemp("blobs")))
    app = create_app([served_model(vision, make_backend(vision.backend))], ServerSettings(files=FilesConfig(blob=blob)))
    with uvicorn_server(app) as url:
        yield url


def test_an_uploaded_image_is_read_by_file_id_under_the_same_bounds(files_url):
    client = OpenAI(base_url=files_url, api_key="unused", max_retries=0)
    cat = client.files.create(file=("cat.png", io.BytesIO(png(40, 30))), purpose="vision")
    response = client.responses.create(model=VISION, input=ask({"type": "input_image", "file_id": cat.id}))
    assert response.output_text == "I see 1 image: 40x30."
    mixed = ask({"type": "input_image", "file_id": cat.id, "detail": "low"}, image_part(png(8, 6)))
    again = client.responses.create(model=VISION, input=mixed, previous_response_id=response.id)  # the stored one is read again
    assert again.output_text == "I see 2 images: 40x30, 8x6."  # the replay describes the last message's

    noise = Image.frombytes("RGB", (160, 160), random.Random(7).randbytes(160 * 160 * 3))
    out = io.BytesIO()
    noise.save(out, "PNG")
    assert len(out.getvalue()) > SMALL_IMAGES  # an image, but over the model's bound
    uploads = {
        "big": client.files.create(file=("noise.png", io.BytesIO(out.getvalue())), purpose="vision").id,
        "text": client.files.create(file=("notes.txt", io.BytesIO(b"no image here")), purpose="user_data").id,
        "bomb": client.files.create(file=("bomb.png", io.BytesIO(_bomb_png())), purpose="vision").id,
    }
    for name, says, code in [
        ("big", f"more than {SMALL_IMAGES} bytes (vision.max_image_bytes)", "file_too_large"),
        ("text", "not an image", "invalid_value"),
        ("bomb", "too large to decode", "invalid_value"),
    ]:
        with pytest.raises(openai.BadRequestError) as error:
            client.responses.create(model=VISION, input=ask({"type": "input_image", "file_id": uploads[name]}))
        assert error.value.body["param"] == "input[0].content[1].file_id", name
        assert says in error.value.body["message"], name
        assert error.value.body["code"] == code, name
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model=VISION, input=ask({"type": "input_image", "file_id": "file-nope"}))
    assert missing.value.body["param"] == "input[0].content[1].file_id"

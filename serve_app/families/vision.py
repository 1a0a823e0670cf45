"""Images for vision models (Qwen2.5-VL / Qwen3-VL style): how one is decoded and bounded,
what size the model sees it at, and what it costs in prompt tokens.

A chat-template vision model's prompt holds one placeholder per image, written by its
template (`<|vision_start|><|image_pad|><|vision_end|>`), and the engine request carries the
images in the same order; the engine (vLLM's multi-modal processor) widens each pad token
into the image's tokens. The cost this family states for an image of W x H pixels (after
the bound of its `detail`) is Qwen-VL's grid: `round(W / P) * round(H / P)` tokens (each side
at least 1), P = `token_pixels` (32 for Qwen3-VL: 16-pixel patches merged 2 x 2; 28 for
Qwen2.5-VL), so a prompt's size counts `tokens - 1` more for each of its pad tokens.

Decoding (Pillow) is done by the caller in a worker thread, bounded in time; it is bounded
here in what it may hold: encoded bytes, the pixels its header claims before any pixel is
decoded (a decompression bomb is refused by its header), the formats read (PNG, JPEG, WebP,
GIF: first frame), and a truncated or corrupt file is an error rather than a gray tail.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

Detail = Literal["low", "high", "auto"]

VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
VISION_TOKENS = (VISION_START, IMAGE_PAD, VISION_END)
# Formats read, by Pillow's name, and the media types they are sent as.
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
MEDIA_TYPES = frozenset(FORMATS.values())
_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[\w.+-]+=[\w.+-]+)*)(?P<base64>;base64)?,", re.A)


class ImageError(ValueError):
    """An image that cannot be read: the message says why (the client sees it)."""


@dataclass(frozen=True, slots=True)
class VisionSpec:
    """What a vision model reads of images (the model config's `vision`)."""

    max_images: int = 8
    max_image_bytes: int = 10 * 1024 * 1024
    max_pixels: int = 1024 * 1024  # detail high/auto: larger images are scaled down to this
    low_detail_pixels: int = 512 * 512  # detail low
    max_decode_pixels: int = 25_000_000  # a header claiming more is refused before decoding
    token_pixels: int = 32
    pdf_page_images: int = 4  # the first pages of an `input_file` PDF also shown as images (0: none)

    def pixel_bound(self, detail: Detail) -> int:
        return min(self.low_detail_pixels, self.max_pixels) if detail == "low" else self.max_pixels

    def seen_size(self, width: int, height: int, detail: Detail) -> tuple[int, int]:
        """The size the model sees an image of `width` x `height` at: scaled down (aspect kept)
        to the pixel bound of `detail`, never up."""
        bound = self.pixel_bound(detail)
        if width * height <= bound:
            return width, height
        scale = math.sqrt(bound / (width * height))
        return max(1, math.floor(width * scale)), max(1, math.floor(height * scale))

    def image_tokens(self, width: int, height: int) -> int:
        """Prompt tokens an image seen at `width` x `height` stands for (Qwen-VL's grid)."""
        side = self.token_pixels
        return max(1, round(width / side)) * max(1, round(height / side))


@dataclass(frozen=True, slots=True)
class DecodedImage:
    media_type: str
    width: int  # as sent
    height: int


def data_url_bytes(url: str, max_bytes: int) -> bytes:
    """The bytes of a base64 `data:` URL of an image, at most `max_bytes` of them."""
    match = _DATA_URL.match(url)
    if match is None or not match.group("base64"):
        raise ImageError("a data URL of an image must be 'data:image/<type>;base64,<data>'")
    media_type = (match.group("type") or "").lower()
    if media_type not in MEDIA_TYPES:
        raise ImageError(f"data URL of type '{media_type or 'none'}': images are read as {', '.join(sorted(MEDIA_TYPES))}")
    payload = url[match.end() :]
    if len(payload) // 4 * 3 > max_bytes + 2:
        raise ImageError(f"the image is larger than {max_bytes} bytes (vision.max_image_bytes)")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the data URL's base64 data is not valid base64") from None
    if len(data) > max_bytes:
        raise ImageError(f"the image is larger than {max_bytes} bytes (vision.max_image_bytes)")
    return data


def decode_image(data: bytes, spec: VisionSpec) -> DecodedImage:
    """Check that `data` is a whole image of a format read here, no larger than the spec
    allows: its header first (format, claimed size), then every pixel decoded. Blocking:
    call it in a worker thread."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > spec.max_image_bytes:
        raise ImageError(f"the image is larger than {spec.max_image_bytes} bytes (vision.max_image_bytes)")
    try:
        with Image.open(io.BytesIO(data), formats=list(FORMATS)) as image:
            width, height = image.size
            if width < 1 or height < 1:
                raise ImageError("the image has no pixels")
            if width * height > spec.max_decode_pixels:
                raise ImageError(
                    f"the image is {width}x{height} pixels, more than the {spec.max_decode_pixels} read (vision.max_decode_pixels)"
                )
            media_type = FORMATS[str(image.format)]
            image.load()  # every pixel of the first frame: a truncated or corrupt file fails here
    except UnidentifiedImageError:
        raise ImageError(f"not an image of a format read here ({', '.join(sorted(MEDIA_TYPES))})") from None
    except Image.DecompressionBombError as exc:
        raise ImageError(f"the image is too large to decode: {exc}") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        if isinstance(exc, ImageError):
            raise
        raise ImageError(f"the image is truncated or corrupt: {exc}") from None
    return DecodedImage(media_type, width, height)


def rgb_image(data: bytes, width: int, height: int) -> Any:
    """The image of `data` as a PIL RGB image of `width` x `height` (what an engine is given:
    decoded again on its side, scaled to the size the ingress chose). Blocking."""
    from PIL import Image

    with Image.open(io.BytesIO(data), formats=list(FORMATS)) as image:
        rgb = image.convert("RGB")
    return rgb if rgb.size == (width, height) else rgb.resize((width, height), Image.Resampling.BICUBIC)


def with_vision_tokens(tokenizer: Any) -> Any:
    """`tokenizer` with Qwen-VL's vision tokens as special tokens of its own, if it has none:
    a text tokenizer (SmolLM2's, for the replay vision model) that writes image placeholders
    as Qwen-VL's tokenizer does, one token each."""
    missing = [token for token in VISION_TOKENS if token not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    return tokenizer


@functools.cache
def smollm2_vision_tokenizer() -> Any:
    """SmolLM2's tokenizer with the vision tokens (the replay vision model's), loaded once."""
    from serve_app.families.smollm2 import SMOLLM2, load_tokenizer

    return with_vision_tokens(load_tokenizer(SMOLLM2))

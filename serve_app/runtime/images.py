"""A request's images, read for a vision model (`ModelConfig.vision`) before its prompt is rendered.

Every `input_image` part of the conversation (this request's input, and the history of its
`previous_response_id` or `conversation`, which keep the parts as the client sent them) is
read again for each turn: a base64 `data:` URL decoded, an http(s) URL fetched under the
egress policy (`Fetcher.fetch_bytes`: public addresses only, every redirect checked, bounded
in time and bytes), a `file_id` read from the tenant's uploads (the Files API:
runtime/files.py, bounded in bytes the same), then decoded by Pillow in a worker thread, bounded in time. The model
sees each image at the size its `detail` allows (`VisionSpec.seen_size`). A text-only model
answers any image part with a 400 naming the model and the part; so does a part that cannot
be read, naming why. Images are read in user messages only, `max_images` per request.

A PDF given as `input_file` in a user message is shown to a vision model as its text and
as images of its first pages (`VisionSpec.pdf_page_images`, drawn by runtime/files.py). The
`input_image` parts come first in `max_images`; the pages share what is left, the newest
files' first: past it a file's pages are text only (never a 400), and a line after the file's
text tells the model which pages it sees as images and why any of them is not drawn.

The prompt holds a placeholder for each image it kept (truncation may have left the oldest
out), so its images are the last ones read (`prompt_images`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from serve_app.api.errors import APIError, invalid_request
from serve_app.api.items import FilePart, HistoryItem, ImagePart, MessageItem, file_parts, image_parts
from serve_app.api.request import ResponsesRequest
from serve_app.core.tokens import EngineImage
from serve_app.families.vision import MEDIA_TYPES, ImageError, VisionSpec, data_url_bytes, decode_image
from serve_app.runtime.files import FileInputs
from serve_app.tools.browser.fetch import Fetcher, FetchError, FetchLimits
from serve_app.tools.browser.policy import FetchPolicy, FetchRefused, HostRules
from serve_app.tools.egress import Resolver
from serve_app.tools.pdf_pages import PageBounds, PageImage, PageImages


@runtime_checkable
class SeesImages(Protocol):
    """A family whose prompts hold image placeholders (`ChatTemplateModel` with `vision`)."""

    def count_images(self, prompt: list[int]) -> int: ...


@dataclass(frozen=True, slots=True)
class ImageReader:
    """How one vision model reads images: its bounds, the fetcher of image URLs, the time one
    decoding may take."""

    spec: VisionSpec
    fetcher: Fetcher
    decode_timeout_s: float = 10.0

    @classmethod
    def create(
        cls,
        spec: VisionSpec,
        *,
        fetch_timeout_s: float = 10.0,
        max_redirects: int = 3,
        decode_timeout_s: float = 10.0,
        allow_hosts: Sequence[str] = (),
        resolver: Resolver | None = None,
    ) -> ImageReader:
        """`resolver`: host names to addresses (tests; default: the machine's, bounded in time)."""
        limits = FetchLimits(max_bytes=spec.max_image_bytes, timeout_s=fetch_timeout_s, max_redirects=max_redirects)
        return cls(spec, Fetcher(FetchPolicy(HostRules(allow_hosts), resolver), limits), decode_timeout_s)

    def page_bounds(self) -> PageBounds | None:
        """What of a PDF this model sees as images (None: PDFs are text only)."""
        spec = self.spec
        if spec.pdf_page_images < 1:
            return None
        return PageBounds(min(spec.pdf_page_images, spec.max_images), spec.max_pixels, spec.max_decode_pixels)

    async def read(self, part: ImagePart, param: str, files: FileInputs | None = None) -> EngineImage:
        """The image of `part` as the engine gets it; a 400 naming `param` when it cannot be
        read. `files`: the tenant's uploads, for an image by `file_id` (None: it has none)."""
        spec = self.spec
        url = part.image_url
        where = f"{param}.image_url" if url is not None else f"{param}.file_id"
        try:
            if url is None:  # an uploaded file: the same bounds as a URL's bytes
                assert part.file_id is not None  # ImagePart has exactly one source
                files = files or FileInputs(None, None)
                data: bytes | None = await files.uploaded_bytes(part.file_id, spec.max_image_bytes, where, "vision.max_image_bytes")
            elif url.startswith("data:"):
                data = None
            else:
                data = (await self.fetcher.fetch_bytes(url, MEDIA_TYPES)).data

            def decoded() -> tuple[bytes, int, int]:
                raw = data_url_bytes(url or "", spec.max_image_bytes) if data is None else data
                image = decode_image(raw, spec)
                return raw, image.width, image.height

            async with asyncio.timeout(self.decode_timeout_s):
                raw, width, height = await asyncio.to_thread(decoded)
        except (FetchRefused, FetchError) as exc:
            raise invalid_request(f"The image at {where} could not be fetched: {exc}", param=where) from None
        except ImageError as exc:
            raise invalid_request(f"The image at {where} could not be read: {exc}", param=where) from None
        except TimeoutError:
            raise invalid_request(f"The image at {where} took longer than {self.decode_timeout_s:g} s to decode.", param=where) from None
        width, height = spec.seen_size(width, height, part.detail)
        return EngineImage(raw, width, height, spec.image_tokens(width, height))


def _image_parts(history: list[HistoryItem], first_input: int, input_count: int, origin: str) -> list[tuple[str, MessageItem, ImagePart]]:
    """(param, message, part) of every image part of `history`, in order: `input[i].content[j]`
    for this request's input (the `input_count` items from `first_input`), else `origin`."""
    found: list[tuple[str, MessageItem, ImagePart]] = []
    for index, item in enumerate(history):
        if not isinstance(item, MessageItem):
            continue
        for position, part in image_parts(item.content):
            inside = first_input <= index < first_input + input_count
            found.append((f"input[{index - first_input}].content[{position}]" if inside else origin, item, part))
    return found


def refuse_text_only(request: ResponsesRequest, model_name: str, reader: ImageReader | None) -> None:
    """A 400 for an image part of the request's own input when `model_name` reads no images
    (before anything is read from the store)."""
    if reader is not None:
        return
    for index, item in enumerate(request.input_items()):
        if isinstance(item, MessageItem) and (parts := image_parts(item.content)):
            raise _text_only(model_name, f"input[{index}].content[{parts[0][0]}]")


def _text_only(model_name: str, param: str) -> APIError:
    return invalid_request(
        f"Model '{model_name}' does not read images: send images to a vision model (one configured with 'vision').",
        param=param,
        code="unsupported_value",
    )


async def read_images(
    request: ResponsesRequest,
    history: list[HistoryItem],
    first_input: int,
    input_count: int,
    model_name: str,
    reader: ImageReader | None,
    files: FileInputs | None = None,
) -> list[EngineImage]:
    """The images of `history` (the conversation as it will be rendered; this request's input
    is its `input_count` items from `first_input`), read concurrently, in order; `files`: the
    tenant's uploads, which images by `file_id` name."""
    origin = "previous_response_id" if request.previous_response_id is not None else "conversation"
    parts = _image_parts(history, first_input, input_count, origin)
    if reader is None:
        if not parts:
            return []
        raise _text_only(model_name, parts[0][0])
    for param, message, _ in parts:
        if message.role != "user":
            raise invalid_request(f"Images are read in user messages only; this message's role is '{message.role}'.", param=param)
    if len(parts) > reader.spec.max_images:
        raise invalid_request(
            f"The conversation holds {len(parts)} images; model '{model_name}' reads at most {reader.spec.max_images} per request "
            "(vision.max_images).",
            param=parts[reader.spec.max_images][0],
            code="too_many_images",
        )
    read = iter(await asyncio.gather(*(reader.read(part, param, files) for param, _, part in parts)))
    _show_pages(history, reader.spec.max_images - len(parts))
    images: list[EngineImage] = []
    for item in history:  # in the order the template writes their placeholders
        if isinstance(item, MessageItem) and not isinstance(item.content, str):
            for part in item.content:
                if isinstance(part, ImagePart):
                    images.append(next(read))
                elif isinstance(part, FilePart) and part.page_images:
                    images += [page_image(page, reader.spec) for page in part._pages.images[: part.page_images]]
    return images


def _show_pages(history: list[HistoryItem], room: int) -> None:
    """How many of its drawn pages each PDF shows (`FilePart._shown`), the newest files' first,
    `room` in all, and the line that tells the model so (`FilePart._caption`)."""
    drawn = [
        part
        for item in history
        if isinstance(item, MessageItem) and item.role == "user"
        for part in file_parts(item.content)
        if isinstance(part._pages, PageImages)
    ]
    for part in reversed(drawn):
        pages: PageImages = part._pages
        shown = min(room, len(pages.images))
        part._shown, part._caption = shown, page_caption(part.name, pages, shown) if room > 0 else ""
        room -= shown


def page_caption(name: str, pages: PageImages, shown: int) -> str:
    """What the model is told of a PDF's page images: which pages follow its text as images,
    and why a page that could have been one is not ("" when there is nothing to say)."""
    said = []
    if shown:
        numbers = [image.number for image in pages.images[:shown]]
        which = f"{_spans(numbers)} of {pages.pages}"
        said.append(f"pages {which} follow as images" if shown > 1 else f"page {which} follows as an image")
    last = pages.images[shown - 1].number if shown else 0
    for number, why in pages.missing:
        if number == 0:
            said.append(f"its pages are not shown as images: {why}")
        elif number < last or shown == len(pages.images):  # a page it would have shown
            said.append(f"page {number} is not shown as an image: {why}")
    return f"[{name}: {'; '.join(said)}]" if said else ""


def _spans(numbers: list[int]) -> str:
    """1, 2, 3, 5 -> "1-3, 5"."""
    spans: list[list[int]] = []
    for number in numbers:
        if spans and spans[-1][1] == number - 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(f"{first}-{last}" if last > first else str(first) for first, last in spans)


def page_image(page: PageImage, spec: VisionSpec) -> EngineImage:
    """A drawn page as the engine gets it: a PNG at the size it was drawn (within `max_pixels`)."""
    return EngineImage(page.png, page.width, page.height, spec.image_tokens(page.width, page.height))


def prompt_images(family: object, prompt: list[int], images: list[EngineImage]) -> list[EngineImage]:
    """The images of `prompt`: the last of `images` (the conversation's), one per placeholder
    the prompt holds (truncation and compaction leave the oldest items out)."""
    if not images or not isinstance(family, SeesImages):
        return []
    count = family.count_images(prompt)
    if count > len(images):  # only the template writes a placeholder
        raise RuntimeError(f"the prompt holds {count} image placeholders for {len(images)} images")
    return images[len(images) - count :] if count else []

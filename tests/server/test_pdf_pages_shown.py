"""Which of a PDF's drawn pages a vision model's prompt shows (runtime/images.py): the
`input_image` parts first, then the newest files' pages, in the order the template writes
their placeholders; and the line that tells the model which pages follow as images and why a
page it would have seen is not one."""

from __future__ import annotations

import asyncio
import base64
import io

from PIL import Image

from serve_app.api.items import FilePart, MessageItem
from serve_app.api.request import ResponsesRequest
from serve_app.families.vision import VisionSpec
from serve_app.runtime.images import ImageReader, page_caption, read_images
from serve_app.tools.pdf_pages import PageImage, PageImages


def drawn(pages: int, numbers: list[int], missing: tuple[tuple[int, str], ...] = ()) -> PageImages:
    """Pages as if drawn: page n is a PNG of n x 10 pixels (its size tells it apart)."""
    images = []
    for number in numbers:
        out = io.BytesIO()
        Image.new("RGB", (number, 10)).save(out, "PNG")
        images.append(PageImage(number, out.getvalue(), number, 10))
    return PageImages(pages, tuple(images), missing)


def pdf(name: str, pages: PageImages) -> FilePart:
    part = FilePart(type="input_file", file_id=f"file-{name}", filename=name)
    part._text, part._pages = f"the text of {name}", pages
    return part


def image(width: int) -> dict:
    out = io.BytesIO()
    Image.new("RGB", (width, 7)).save(out, "PNG")
    return {"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()}


def shown(history: list[MessageItem], max_images: int) -> list[tuple[int, int]]:
    reader = ImageReader.create(VisionSpec(max_images=max_images))
    images = asyncio.run(read_images(ResponsesRequest(model="m", input="x"), history, 0, len(history), "m", reader))
    return [(image.width, image.height) for image in images]


def test_images_first_then_the_newest_files_pages_in_the_templates_order():
    older, newer = pdf("older.pdf", drawn(5, [1, 2, 3])), pdf("newer.pdf", drawn(2, [1, 2]))
    history = [
        MessageItem(role="user", content=[image(40), older]),
        MessageItem(role="user", content=[newer, image(30)]),
    ]
    # 5 places: two images, the newer file's two pages, one of the older file's.
    assert shown(history, 5) == [(40, 7), (1, 10), (1, 10), (2, 10), (30, 7)]
    assert (older.page_images, newer.page_images) == (1, 2)
    assert older.text.endswith("[end of file: older.pdf]\n[older.pdf: page 1 of 5 follows as an image]")
    assert newer.text.endswith("[newer.pdf: pages 1-2 of 2 follow as images]")
    # 2 places: the images alone; the files are text only and say nothing of pages.
    assert shown(history, 2) == [(40, 7), (30, 7)]
    assert (older.page_images, newer.page_images) == (0, 0)
    assert older.text == "[file: older.pdf]\nthe text of older.pdf\n[end of file: older.pdf]"


def test_a_file_outside_user_messages_shows_no_pages():
    system = pdf("system.pdf", drawn(1, [1]))
    system._pages = None  # runtime/files.py draws the pages of user messages' files only
    assert shown([MessageItem(role="system", content=[system]), MessageItem(role="user", content="hi")], 4) == []


def test_the_caption_says_which_pages_follow_and_why_one_it_would_show_is_not():
    pages = drawn(12, [1, 3, 4, 6], missing=((2, "the renderer cannot load it"), (5, "it draws an image of 9 x 9 pixels")))
    assert page_caption("a.pdf", pages, 4) == (
        "[a.pdf: pages 1, 3-4, 6 of 12 follow as images; page 2 is not shown as an image: the renderer cannot load it; "
        "page 5 is not shown as an image: it draws an image of 9 x 9 pixels]"
    )
    # Two places: page 5 would not have been shown anyway.
    assert (
        page_caption("a.pdf", pages, 2)
        == "[a.pdf: pages 1, 3 of 12 follow as images; page 2 is not shown as an image: the renderer cannot load it]"
    )
    unopened = PageImages(0, missing=((0, "the renderer cannot open it"),))
    assert page_caption("b.pdf", unopened, 0) == "[b.pdf: its pages are not shown as images: the renderer cannot open it]"
    assert page_caption("c.pdf", drawn(1, [1]), 1) == "[c.pdf: page 1 of 1 follows as an image]"

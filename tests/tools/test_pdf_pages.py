"""A PDF's first pages as images (serve_app/tools/pdf_pages.py): every page drawn within the
pixel bound whatever size it claims, hostile pages left out with a reason (an image claiming
billions of pixels, a page PDFium cannot load, a deadline passed), and the renderer process
killed when it passes the deadline and started again for the next file."""

from __future__ import annotations

import asyncio
import io
import math
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from serve_app.tools.pdf_pages import (
    MAX_ASPECT,
    OUT_OF_TIME,
    PageBounds,
    PageRenderer,
    _checked,
    _Stopped,
    fit,
    render_off_loop,
    render_pages,
)
from tests.support.pdfs import broken_pdf, form_bomb_pdf, image_bomb_pdf, text_pdf, unloadable_page_pdf

MPIXEL = 1024 * 1024
BOUNDS = PageBounds(count=4, max_pixels=MPIXEL, max_image_pixels=25_000_000)


def later(seconds: float = 60.0) -> float:
    return time.monotonic() + seconds


sides = st.floats(min_value=0.01, max_value=1e7, allow_nan=False, allow_infinity=False)


@given(sides, sides, st.integers(1024, 50_000_000))
def test_a_page_is_drawn_within_the_pixel_bound_whatever_size_it_claims(width, height, max_pixels):
    size = fit(width, height, max_pixels)
    if max(width, height) / min(width, height) > MAX_ASPECT:
        assert size is None
        return
    assert size is not None
    drawn_width, drawn_height = size
    assert drawn_width >= 1
    assert drawn_height >= 1
    assert drawn_width * drawn_height <= max_pixels
    if min(drawn_width, drawn_height) > 1:  # the aspect, within a pixel of rounding
        assert (drawn_width - 1) / (drawn_height + 1) <= width / height <= (drawn_width + 1) / (drawn_height - 1)


@pytest.mark.parametrize("size", [(0, 792), (612, -1), (math.inf, 5), (math.nan, 5), (14400, 1)])
def test_a_page_without_area_or_too_long_and_narrow_is_not_drawn(size):
    assert fit(*size, MPIXEL) is None


def _decoded(png: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(png), formats=["PNG"])
    image.load()
    return image


def test_the_first_pages_are_drawn_as_pngs_of_their_text():
    drawn = render_pages(text_pdf([f"Page number {n} says hello." for n in range(1, 7)]), BOUNDS, later())
    assert drawn.pages == 6
    assert [image.number for image in drawn.images] == [1, 2, 3, 4]  # the first `count` only
    assert drawn.missing == ()
    assert not drawn.timed_out
    for image in drawn.images:
        decoded = _decoded(image.png)
        assert decoded.size == (image.width, image.height) == (900, 1164)  # US Letter at 1 Mpixel at most
        assert decoded.mode == "RGB"
        darkest, lightest = decoded.convert("L").getextrema()
        assert darkest < 128  # the text is drawn: black on the white page
        assert lightest == 255


def test_a_200_inch_page_is_drawn_within_the_bound_not_at_its_size():
    huge = text_pdf(["A very large page."], size=(14400, 14400))  # 200 x 200 inches: 207 Mpixels at 72 dpi
    (image,) = render_pages(huge, BOUNDS, later()).images
    assert (image.width, image.height) == (1024, 1024)
    assert _decoded(image.png).size == (1024, 1024)
    (small,) = render_pages(huge, PageBounds(1, 4096, 25_000_000), later()).images
    assert (small.width, small.height) == (64, 64)


def test_a_page_drawing_an_image_that_claims_billions_of_pixels_is_not_drawn():
    drawn = render_pages(image_bomb_pdf(100_000, 100_000), BOUNDS, later())
    assert drawn.images == ()
    ((number, why),) = drawn.missing
    assert number == 1
    assert "an image of 100000 x 100000 pixels, more than 25000000" in why
    assert len(render_pages(image_bomb_pdf(300, 200), BOUNDS, later()).images) == 1  # a real picture's page is drawn


def test_a_page_that_cannot_be_loaded_is_left_out_and_the_others_drawn():
    drawn = render_pages(unloadable_page_pdf(["one", "two", "three"], broken=2), BOUNDS, later())
    assert drawn.pages == 4  # PDFium counts the entry that is not a page
    assert [image.number for image in drawn.images] == [1, 3, 4]
    assert drawn.missing == ((2, "the renderer cannot load it"),)


def test_a_file_pdfium_cannot_open_has_no_page_images():
    drawn = render_pages(broken_pdf(), BOUNDS, later())
    assert (drawn.pages, drawn.images) == (0, ())
    ((number, why),) = drawn.missing
    assert number == 0
    assert "the renderer cannot open it" in why


def test_past_the_deadline_no_page_is_drawn():
    drawn = render_pages(text_pdf(["one", "two"]), BOUNDS, time.monotonic() - 1)
    assert drawn.timed_out
    assert drawn.images == ()
    assert drawn.missing == ((1, OUT_OF_TIME), (2, OUT_OF_TIME))


def test_the_renderer_process_answers_and_is_kept_for_the_next_file(monkeypatch):
    monkeypatch.setenv("REDIS_PASSWORD", "a secret of the server's")
    renderer = PageRenderer()
    try:
        first = asyncio.run(render_off_loop(text_pdf(["one", "two"]), BOUNDS, 60, renderer))
        assert renderer._process is not None
        environ = Path(f"/proc/{renderer._process.pid}/environ").read_bytes()
        assert b"REDIS_PASSWORD" not in environ  # a process that parses a client's file holds no secret
        second = asyncio.run(render_off_loop(text_pdf(["three"], size=(200, 100)), BOUNDS, 60, renderer))
        assert [(image.number, image.width, image.height) for image in first.images] == [(1, 900, 1164), (2, 900, 1164)]
        assert [(image.width, image.height) for image in second.images] == [(800, 400)]  # 4 pixels a unit at most
        assert _decoded(second.images[0].png).size == (800, 400)
        assert renderer.started == 1
    finally:
        renderer.close()


@pytest.mark.slow
def test_a_file_pdfium_would_parse_for_minutes_is_stopped_at_the_deadline():
    """A page drawing a form that draws a form ... 10^7 times (PDFium parses every instance:
    more than a minute of one core) is stopped when the deadline passes: its process is
    killed, and the next file gets a new one."""
    renderer = PageRenderer()
    try:
        stopped = asyncio.run(render_off_loop(form_bomb_pdf(depth=8, fanout=10), BOUNDS, 2, renderer))
        assert stopped.timed_out
        assert stopped.images == ()
        assert stopped.missing == ((0, OUT_OF_TIME),)
        after = asyncio.run(render_off_loop(text_pdf(["still here"]), BOUNDS, 60, renderer))
        assert len(after.images) == 1
        assert renderer.started == 2
    finally:
        renderer.close()


def _answer(**changed: object) -> dict[str, object]:
    return {"pages": 1, "missing": [], "images": [[1, 10, 10, 3]], "timed_out": False, **changed}


@pytest.mark.parametrize(
    ("answer", "body"),
    [
        (_answer(images=[[1, 2000, 2000, 3]]), b"png"),  # more pixels than asked for
        (_answer(images=[[1, 10, 10, 2]]), b"png"),  # lengths that do not add up to the bytes sent
        (_answer(images=[[number, 10, 10, 1] for number in range(1, 6)]), b"12345"),  # more pages than asked for
        (_answer(images=[[1, 10, 10, 0]]), b""),
        (_answer(pages="1"), b"png"),
        (_answer(timed_out=None), b"png"),
        ({"pages": 1}, b""),
    ],
)
def test_an_answer_out_of_line_stops_the_renderer(answer, body):
    bounds = PageBounds(count=4, max_pixels=MPIXEL, max_image_pixels=1)
    with pytest.raises(_Stopped):
        _checked(answer, body, bounds)
    assert _checked(_answer(), b"png", bounds).images[0].png == b"png"

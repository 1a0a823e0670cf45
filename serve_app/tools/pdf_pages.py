"""A PDF's first pages as images, for a vision model (pypdfium2: PDFium, Chrome's PDF renderer).

Why pypdfium2: pypdf (the text, documents.py) parses PDFs but cannot rasterize them. PDFium
is the renderer of Chrome, built to open hostile files (fuzzed continuously there), and
pypdfium2's wheel bundles it: no system library, nothing to compile, the same renderer on
every machine; maintained, Apache-2.0 / BSD-3-Clause. (pdf2image runs poppler's programs,
which the system must provide; PyMuPDF is AGPL.)

Every file here is hostile; rendering is bounded in what it may allocate and in time:
- a page's bitmap: drawn at the scale that fits `max_pixels` (aspect kept), whatever size
  its MediaBox claims (`fit`); a page more than `MAX_ASPECT` times longer than wide (or the
  other way) is not drawn at all;
- the images a page draws: a page holding one whose dictionary claims more than
  `max_image_pixels` pixels is not drawn (PDFium would decode it), nor one holding more than
  `MAX_OBJECTS` page objects;
- time: one deadline for the file, checked between pages, between page objects and inside a
  page's drawing (PDFium's progressive rendering, paused when the deadline passes).
A page that cannot be drawn is no error: it is left out of the images (`PageImages.missing`
says which and why) and the model reads its text as a text model does.

PDFium draws in a process of its own (`PageRenderer`: one per replica, started when first
needed), never in the server's: it is killed when the deadline passes (a page PDFium would
parse for minutes, a form drawing a form a million times, stops there), its address space is
bounded (`WORKER_MEMORY`), its environment is `WORKER_ENV` alone (no secret of the server's),
and whatever a file makes PDFium do cannot touch the server's memory. What comes back is
checked (sizes, counts) and never unpickled. PDFium is not thread-safe, not even on
different documents: in that process one page is drawn at a time, so a file that keeps it
busy delays the next ones, each within its own deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import io
import json
import math
import os
import select
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

MAX_SCALE = 4.0  # 288 dpi: a small page is not blown up further than this
MAX_ASPECT = 200  # longer side / shorter side (Qwen-VL's image processors refuse more)
MAX_OBJECTS = 200_000  # page objects looked at on one page, those of its forms included
MAX_FORM_DEPTH = 8  # forms inside forms looked into
WORKER_MEMORY = 2 * 1024**3  # the renderer process's address space (RLIMIT_AS)
MAX_REASON_CHARS = 300
WORKER_ENV = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "TMPDIR")  # what the renderer process inherits
OUT_OF_TIME = "drawing the pages took longer than files.input.timeout_s"

_LOCK = threading.Lock()  # PDFium in this process (render_pages called directly): one caller at a time
_FRAME = struct.Struct("<II")  # a message: the lengths of its JSON head and of its bytes


@dataclass(frozen=True, slots=True)
class PageBounds:
    """What of a PDF a vision model sees as images."""

    count: int  # the first pages drawn
    max_pixels: int  # of one page's image
    max_image_pixels: int  # of an image a page draws, as its dictionary claims


@dataclass(frozen=True, slots=True)
class PageImage:
    number: int  # from 1
    png: bytes
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class PageImages:
    """The first pages of a PDF as PNG images, in page order."""

    pages: int  # of the PDF, as PDFium counts them (0: not known: it could not open it, or the renderer stopped)
    images: tuple[PageImage, ...] = ()
    missing: tuple[tuple[int, str], ...] = ()  # pages asked for and not drawn: (number, why); 0: the whole file
    timed_out: bool = False  # the deadline left pages out (another time they may be drawn)

    @property
    def size(self) -> int:
        """Bytes held (a cache's measure)."""
        return sum(len(image.png) for image in self.images) + 64


class _NotDrawn(Exception):
    """A page left out of the images; the message says why (the model reads it)."""


class _OutOfTime(_NotDrawn):
    def __init__(self) -> None:
        super().__init__(OUT_OF_TIME)


def fit(width: float, height: float, max_pixels: int) -> tuple[int, int] | None:
    """The pixel size a page of `width` x `height` (PDF units) is drawn at: as large as fits
    `max_pixels` (aspect kept, at most `MAX_SCALE` pixels a unit); None for a page that has no
    area or is more than `MAX_ASPECT` times longer than wide."""
    if not (math.isfinite(width) and math.isfinite(height)) or width <= 0 or height <= 0 or max_pixels < 1:
        return None
    if max(width, height) / min(width, height) > MAX_ASPECT:
        return None
    scale = min(MAX_SCALE, math.sqrt(max_pixels / (width * height)))
    pixels = max(1, math.floor(width * scale)), max(1, math.floor(height * scale))
    return pixels if pixels[0] * pixels[1] <= max_pixels else None


def render_pages(data: bytes, bounds: PageBounds, deadline: float) -> PageImages:
    """The first `bounds.count` pages of the PDF `data` as images, stopping at `deadline`
    (`time.monotonic()`), with PDFium in this process (the renderer process's work; tests).
    Blocking; one caller at a time in the process."""
    with _LOCK:
        return _render(data, bounds, deadline)


class PageRenderer:
    """The renderer process, seen from the server: one request at a time (`render`, blocking,
    on a thread of its own: `render_off_loop`), the process started when needed and killed
    when a request passes its deadline or it answers out of line."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.started = 0  # processes started (tests)

    def render(self, data: bytes, bounds: PageBounds, deadline: float) -> PageImages:
        with self._lock:
            try:
                return self._ask(data, bounds, deadline)
            except _Stopped as exc:
                self.close()
                return PageImages(0, missing=((0, str(exc)),), timed_out=exc.timed_out)

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()

    def _ask(self, data: bytes, bounds: PageBounds, deadline: float) -> PageImages:
        try:
            process = self._running()
        except OSError as exc:  # no process to be had (out of processes, of memory)
            raise _Stopped(f"the renderer cannot start ({exc})") from None
        assert process.stdin is not None
        assert process.stdout is not None
        head = {
            "count": bounds.count,
            "max_pixels": bounds.max_pixels,
            "max_image_pixels": bounds.max_image_pixels,
            "timeout_s": deadline - time.monotonic(),
        }
        try:
            _write(process.stdin.fileno(), head, data, deadline)
            answer, body = _read(process.stdout.fileno(), deadline, max_body=bounds.count * (4 * bounds.max_pixels + 65536))
        except TimeoutError:
            raise _Stopped(OUT_OF_TIME, timed_out=True) from None
        except (OSError, ValueError) as exc:
            raise _Stopped(f"the renderer stopped ({_exit(process) or exc})") from None
        return _checked(answer, body, bounds)

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self.close()
        # -P: the script's folder (serve_app/tools) is not put on the module path. The
        # environment: where Python finds its packages, nothing else (no secret of the server's
        # is the business of a process that parses a client's file).
        self._process = subprocess.Popen(
            [sys.executable, "-P", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            env={name: os.environ[name] for name in WORKER_ENV if name in os.environ},
        )
        self.started += 1
        return self._process


_RENDERER = PageRenderer()
_WORKER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdf-pages")


async def render_off_loop(data: bytes, bounds: PageBounds, timeout_s: float, renderer: PageRenderer | None = None) -> PageImages:
    """The first pages of `data` drawn by the renderer process, within `timeout_s` (waiting for
    an earlier file's pages included): past it, no page is shown as an image."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + timeout_s
    drawing = loop.run_in_executor(_WORKER, (renderer or _RENDERER).render, data, bounds, deadline)
    try:
        return await asyncio.wait_for(drawing, timeout_s + 1)  # the thread itself gives up at the deadline
    except TimeoutError:
        return PageImages(0, missing=((0, OUT_OF_TIME),), timed_out=True)


class _Stopped(Exception):
    """The renderer process did not answer in time or as it should: it is killed."""

    def __init__(self, why: str, *, timed_out: bool = False) -> None:
        super().__init__(why)
        self.timed_out = timed_out


def _exit(process: subprocess.Popen[bytes]) -> str:
    code = process.poll()
    return "" if code is None else f"exit status {code}"


def _write(fd: int, head: dict[str, Any], data: bytes, deadline: float) -> None:
    encoded = json.dumps(head).encode()
    message = memoryview(_FRAME.pack(len(encoded), len(data)) + encoded + data)
    while message:
        _wait(fd, deadline, write=True)
        message = message[os.write(fd, message[: 1 << 16]) :]


def _read(fd: int, deadline: float, *, max_body: int) -> tuple[Any, bytes]:
    heads, size = _FRAME.unpack(_read_exactly(fd, _FRAME.size, deadline))
    if heads > 1 << 20 or size > max_body:
        raise ValueError("an answer larger than asked for")
    return json.loads(_read_exactly(fd, heads, deadline)), _read_exactly(fd, size, deadline)


def _read_exactly(fd: int, size: int, deadline: float) -> bytes:
    out = bytearray()
    while len(out) < size:
        _wait(fd, deadline, write=False)
        chunk = os.read(fd, min(size - len(out), 1 << 20))
        if not chunk:
            raise ValueError("its output ended")
        out += chunk
    return bytes(out)


def _wait(fd: int, deadline: float, *, write: bool) -> None:
    left = None if deadline == math.inf else deadline - time.monotonic()
    if left is not None and left <= 0:
        raise TimeoutError
    ready = select.select([], [fd], [], left)[1] if write else select.select([fd], [], [], left)[0]
    if not ready:
        raise TimeoutError


def _checked(answer: Any, body: bytes, bounds: PageBounds) -> PageImages:
    """The renderer process's answer, as this side asked for it (else `_Stopped`)."""
    try:
        pages = answer["pages"]
        missing = tuple((int(number), str(why)[:MAX_REASON_CHARS]) for number, why in answer["missing"])
        images: list[PageImage] = []
        at = 0
        for number, width, height, length in answer["images"]:
            values = (number, width, height, length)
            if not all(type(value) is int and value >= 1 for value in values) or width * height > bounds.max_pixels:
                raise ValueError("an image out of bounds")
            images.append(PageImage(number, body[at : at + length], width, height))
            at += length
        if (
            type(pages) is not int
            or type(answer["timed_out"]) is not bool
            or at != len(body)
            or len(images) > bounds.count
            or len(missing) > bounds.count + 1
        ):
            raise ValueError("counts that do not add up")
    except (KeyError, TypeError, ValueError) as exc:
        raise _Stopped(f"the renderer answered out of line ({exc})") from None
    return PageImages(pages, tuple(images), missing, answer["timed_out"])


def _serve() -> None:
    """The renderer process (`python -P pdf_pages.py`): requests on stdin, answers on stdout,
    one at a time, until stdin ends."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    with contextlib.suppress(OSError, AttributeError):  # Linux: killed with the server
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    requests, answers = 0, os.dup(1)
    os.dup2(2, 1)  # whatever a library prints goes to stderr, never into the answers
    forever = math.inf
    while True:
        try:
            heads, size = _FRAME.unpack(_read_exactly(requests, _FRAME.size, forever))
        except ValueError:  # stdin ended: the server is gone
            return
        head = json.loads(_read_exactly(requests, heads, forever))
        data = _read_exactly(requests, size, forever)
        bounds = PageBounds(int(head["count"]), int(head["max_pixels"]), int(head["max_image_pixels"]))
        result = render_pages(data, bounds, time.monotonic() + float(head["timeout_s"]))
        _write(
            answers,
            {
                "pages": result.pages,
                "missing": [list(entry) for entry in result.missing],
                "images": [[image.number, image.width, image.height, len(image.png)] for image in result.images],
                "timed_out": result.timed_out,
            },
            b"".join(image.png for image in result.images),
            forever,
        )


def _render(data: bytes, bounds: PageBounds, deadline: float) -> PageImages:
    import pypdfium2 as pdfium

    try:
        pdf = pdfium.PdfDocument(data)
    except (pdfium.PdfiumError, ValueError, OSError) as exc:
        return PageImages(0, missing=((0, f"the renderer cannot open it ({exc})"),))
    try:
        pages = len(pdf)
        asked = min(bounds.count, pages)
        images: list[PageImage] = []
        missing: list[tuple[int, str]] = []
        for number in range(1, asked + 1):
            try:
                if time.monotonic() > deadline:
                    raise _OutOfTime
                images.append(_page(pdf, number, bounds, deadline))
            except _OutOfTime:
                missing += [(later, OUT_OF_TIME) for later in range(number, asked + 1)]
                return PageImages(pages, tuple(images), tuple(missing), timed_out=True)
            except _NotDrawn as exc:
                missing.append((number, str(exc)))
        return PageImages(pages, tuple(images), tuple(missing))
    finally:
        pdf.close()  # here, on this thread: never left to a finalizer on another one


def _page(pdf: Any, number: int, bounds: PageBounds, deadline: float) -> PageImage:
    import pypdfium2 as pdfium

    try:
        page = pdf[number - 1]
    except (pdfium.PdfiumError, ValueError, OSError):
        raise _NotDrawn("the renderer cannot load it") from None
    try:
        width, height = page.get_size()
        size = fit(width, height, bounds.max_pixels)
        if size is None:
            raise _NotDrawn(f"its size ({width:g} x {height:g}) has no area or is too long and narrow")
        _check_objects(page, bounds.max_image_pixels, deadline)
        return PageImage(number, *_draw(page, size, deadline))
    except (pdfium.PdfiumError, ValueError, OSError, MemoryError) as exc:
        raise _NotDrawn(f"the renderer failed ({type(exc).__name__})") from None
    finally:
        page.close()


def _check_objects(page: Any, max_image_pixels: int, deadline: float) -> None:
    """Refuse a page that draws an image claiming more than `max_image_pixels` pixels, holds
    more than `MAX_OBJECTS` objects, or takes past `deadline` to look through."""
    import pypdfium2.raw as pdfium_c

    width, height = ctypes.c_uint(), ctypes.c_uint()
    seen = 0
    stack: list[tuple[Any, int]] = [(None, 0)]  # (a form object, or None for the page; its depth)
    while stack:
        form, depth = stack.pop()
        count = pdfium_c.FPDFPage_CountObjects(page) if form is None else pdfium_c.FPDFFormObj_CountObjects(form)
        for index in range(max(count, 0)):
            seen += 1
            if seen > MAX_OBJECTS:
                raise _NotDrawn(f"it holds more than {MAX_OBJECTS} objects")
            if seen % 1024 == 0 and time.monotonic() > deadline:
                raise _OutOfTime
            obj = pdfium_c.FPDFPage_GetObject(page, index) if form is None else pdfium_c.FPDFFormObj_GetObject(form, index)
            if not obj:
                continue
            kind = pdfium_c.FPDFPageObj_GetType(obj)
            if kind == pdfium_c.FPDF_PAGEOBJ_IMAGE and pdfium_c.FPDFImageObj_GetImagePixelSize(obj, width, height):
                if width.value * height.value > max_image_pixels:
                    raise _NotDrawn(
                        f"it draws an image of {width.value} x {height.value} pixels, more than {max_image_pixels} "
                        "(vision.max_decode_pixels)"
                    )
            elif kind == pdfium_c.FPDF_PAGEOBJ_FORM and depth < MAX_FORM_DEPTH:
                stack.append((obj, depth + 1))


def _draw(page: Any, size: tuple[int, int], deadline: float) -> tuple[bytes, int, int]:
    """The page drawn into a `size` RGB bitmap, as PNG; PDFium's progressive rendering,
    paused and given up when `deadline` passes."""
    import pypdfium2.internal as pdfium_i
    import pypdfium2.raw as pdfium_c
    from PIL import Image

    width, height = size
    stride = width * 3
    buffer = (ctypes.c_ubyte * (stride * height))()
    bitmap = pdfium_c.FPDFBitmap_CreateEx(width, height, pdfium_c.FPDFBitmap_BGR, buffer, stride)
    if not bitmap:
        raise _NotDrawn("the renderer could not make its bitmap")
    try:
        pdfium_c.FPDFBitmap_FillRect(bitmap, 0, 0, width, height, 0xFFFFFFFF)
        pause = pdfium_c.IFSDK_PAUSE(version=1)
        pdfium_i.set_callback(pause, "NeedToPauseNow", lambda _pause: time.monotonic() > deadline)
        flags = pdfium_c.FPDF_ANNOT | pdfium_c.FPDF_REVERSE_BYTE_ORDER  # annotations drawn; RGB, not BGR
        status = pdfium_c.FPDF_RenderPageBitmap_Start(bitmap, page, 0, 0, width, height, 0, flags, pause)
        while status == pdfium_c.FPDF_RENDER_TOBECONTINUED:
            if time.monotonic() > deadline:
                raise _OutOfTime
            status = pdfium_c.FPDF_RenderPage_Continue(page, pause)
        if status != pdfium_c.FPDF_RENDER_DONE:
            raise _NotDrawn("the renderer failed to draw it")
    finally:
        pdfium_c.FPDF_RenderPage_Close(page)
        pdfium_c.FPDFBitmap_Destroy(bitmap)
    out = io.BytesIO()
    Image.frombuffer("RGB", (width, height), bytes(buffer), "raw", "RGB", stride, 1).save(out, "PNG", compress_level=1)
    return out.getvalue(), width, height


if __name__ == "__main__":
    _serve()

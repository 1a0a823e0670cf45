"""A PDF's pages as images through Serve with two ingress replicas: a multi-page PDF written
with pypdf (pages of different sizes) is sent to `qwen3-vl-replay` by `file_data` and by an
uploaded `file_id`, to each ingress replica at its own address and through the proxy; the
replay model says how many page images it was shown and at what size. Each replica draws the
pages in a renderer process it started (PDFium's, tools/pdf_pages.py): a renderer that cannot
start leaves the pages text only, and the model would echo the text instead."""

from __future__ import annotations

import base64
import contextlib
import io

import openai
import psutil

VISION = "qwen3-vl-replay"  # the first 4 pages of a PDF as images, each within 1 Mpixel


def pdf(pages: list[tuple[str, tuple[int, int]]]) -> bytes:
    """A PDF written with pypdf: one line of text on each page, each page its own size (PDF
    units), the content streams compressed."""
    from pypdf import PdfWriter
    from pypdf.generic import ContentStream, DictionaryObject, NameObject

    writer = PdfWriter()
    helvetica = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    for text, (width, height) in pages:
        page = writer.add_blank_page(width, height)
        page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): DictionaryObject({NameObject("/F1"): helvetica})})
        content = ContentStream(None, writer)
        content.set_data(f"BT /F1 12 Tf 10 {height - 30} Td ({text}) Tj ET".encode())
        page.replace_contents(content)
        page.compress_content_streams()
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


# Page sizes (PDF units) and the images the model sees of them: drawn as large as fits 1 Mpixel.
LETTER, WIDE, TALL = (612, 792), (200, 100), (300, 600)
SEEN = {LETTER: "900x1164", WIDE: "800x400", TALL: "724x1448"}
INLINE = [("Apples are red.", LETTER), ("Pears are green.", WIDE), ("Plums are purple.", TALL)]
UPLOADED = [(f"Chapter {number}.", size) for number, size in enumerate([TALL, WIDE, LETTER, WIDE, TALL], 1)]


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)


def ask(part: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_text", "text": "What is in it?"}, part]}]


def test_pdf_pages_reach_the_vision_model_as_images_on_every_replica(ingress_urls, serve_url):
    inline = {
        "type": "input_file",
        "filename": "fruit.pdf",
        "file_data": "data:application/pdf;base64," + base64.b64encode(pdf(INLINE)).decode(),
    }
    replicas = [sdk(url) for url in ingress_urls]
    uploaded = replicas[0].files.create(file=("book.pdf", io.BytesIO(pdf(UPLOADED))), purpose="user_data")
    by_id = {"type": "input_file", "file_id": uploaded.id}
    for client in [*replicas, sdk(serve_url)]:
        shown = client.responses.create(model=VISION, input=ask(inline))
        assert shown.output_text == f"I see 3 images: {', '.join(SEEN[size] for _, size in INLINE)}.", shown.output_text
        shown = client.responses.create(model=VISION, input=ask(by_id))  # the first 4 of its 5 pages
        assert shown.output_text == f"I see 4 images: {', '.join(SEEN[size] for _, size in UPLOADED[:4])}.", shown.output_text
    # The pages were drawn in a renderer process under each ingress replica of the app.
    assert len(renderer_parents()) >= len(ingress_urls)
    replicas[1].files.delete(uploaded.id)


def renderer_parents() -> set[int]:
    """The process ids of the session app's ingress replicas that run a PDF renderer."""
    parents = set()
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if not (cmdline and cmdline[-1].endswith("serve_app/tools/pdf_pages.py")):
            continue
        with contextlib.suppress(psutil.Error):  # a process that ended meanwhile
            parent = process.parent()
            if parent is not None and "ServeReplica:responses:ResponsesIngress" in " ".join(parent.cmdline()):
                parents.add(parent.pid)
    return parents

"""A file's bytes → the text a model reads (tools/documents.py), and `file_data` decoding
(runtime/files.py): every supported format, and hostile files refused in bounded time."""

from __future__ import annotations

import base64

import pytest

from serve_app.api.errors import APIError
from serve_app.api.limits import DEFAULT_LIMITS, check_shape
from serve_app.runtime.files import decode_file_data
from serve_app.tools.documents import DocumentError, DocumentLimits, extract_off_loop, extract_text, media_type_of
from tests.support.pdfs import bomb_pdf, broken_pdf, text_pdf

LIMITS = DocumentLimits(max_pages=50, max_chars=10_000)


def _text(data: bytes, name: str | None = None, content_type: str | None = None) -> str:
    return extract_text(data, filename=name, content_type=content_type, limits=LIMITS).text


def test_a_pdfs_pages_become_text():
    extracted = extract_text(text_pdf(["First page.", "Second (page)."], compress=True), filename=None, content_type=None, limits=LIMITS)
    assert (extracted.text, extracted.pages, extracted.media_type) == ("First page.\n\nSecond (page).", 2, "application/pdf")


def test_what_a_file_is_comes_from_its_bytes_then_its_type_then_its_name():
    assert media_type_of(b"%PDF-1.4 ...", "notes.txt", "text/plain") == "application/pdf"
    assert media_type_of(b"a,b", "x.bin", "text/csv; charset=utf-8") == "text/csv"
    assert media_type_of(b"# t", "README.md", "application/octet-stream") == "text/markdown"
    assert media_type_of(b"??", None, None) == "application/octet-stream"


def test_text_formats():
    assert _text(b"# Title\n\nbody", "a.md") == "# Title\n\nbody"
    assert _text(b"a,b\n1,2\n", "a.csv") == "a,b\n1,2\n"
    assert _text(b'{"k": [1, 2]}', "a.json") == '{"k": [1, 2]}'
    assert _text("caf\u00e9".encode("latin-1"), None, "text/plain; charset=latin-1") == "caf\u00e9"
    assert _text(b"\xef\xbb\xbfbom", "a.txt") == "bom"
    html = b"<html><head><style>p{}</style><script>steal()</script></head><body><h1>Head</h1><p>One</p><p>Two</p></body></html>"
    assert _text(html, "a.html") == "Head\n\nOne\n\nTwo"


@pytest.mark.parametrize(
    ("data", "name", "why"),
    [
        (b'{"unclosed": ', "a.json", "not valid JSON"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "a.png", "cannot be read"),
        (b"text\x00with NUL", "a.txt", "NUL"),
        (b"x" * 10_001, "a.txt", "10000 characters"),
        (text_pdf(["page"] * 51), "a.pdf", "more than 50 pages"),
        (text_pdf(["y" * 3000] * 5), "a.pdf", "10000 characters"),
        (broken_pdf(), "a.pdf", "cannot be read as a PDF"),
        (text_pdf(["truncated"])[:200], "a.pdf", "cannot be read as a PDF"),
    ],
    ids=["bad-json", "image", "nul", "long-text", "too-many-pages", "long-pdf", "broken-pdf", "truncated-pdf"],
)
def test_unreadable_files_say_why(data, name, why):
    with pytest.raises(DocumentError, match=why):
        _text(data, name)


@pytest.mark.slow
def test_a_decompression_bomb_stops_at_its_bound():
    bomb = bomb_pdf(128 * 1024 * 1024)  # ~130 KiB that inflate to 128 MiB
    with pytest.raises(DocumentError, match="decompressed bytes"):
        extract_text(bomb, filename="bomb.pdf", content_type=None, limits=DocumentLimits(max_inflated_bytes=16 * 1024 * 1024))


@pytest.mark.anyio
async def test_extraction_runs_off_the_loop_within_its_time():
    pdf = text_pdf(["page"] * 40)
    assert (await extract_off_loop(pdf, filename=None, content_type=None, limits=LIMITS)).pages == 40
    with pytest.raises(DocumentError, match="longer than"):
        await extract_off_loop(pdf, filename=None, content_type=None, limits=DocumentLimits(timeout_s=1e-9))


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_file_data_is_a_base64_data_url_or_bare_base64():
    encoded = base64.b64encode(b"%PDF-1.4 body").decode()
    assert decode_file_data(f"data:application/pdf;base64,{encoded}", 100, "p") == (b"%PDF-1.4 body", "application/pdf")
    assert decode_file_data(encoded, 100, "p") == (b"%PDF-1.4 body", None)
    for bad, code in (("data:text/plain,plain", "invalid_file"), ("not base64!", "invalid_file"), ("QUJD" * 100, "file_too_large")):
        with pytest.raises(APIError) as error:
            decode_file_data(bad, 100, "input[0].content[1].file_data")
        assert (error.value.code, error.value.param) == (code, "input[0].content[1].file_data")


def test_file_data_is_bounded_by_the_body_not_by_max_text_chars():
    big = "A" * (DEFAULT_LIMITS.max_text_chars + 8)
    check_shape({"input": [{"role": "user", "content": [{"type": "input_file", "file_data": big}]}]}, DEFAULT_LIMITS)
    with pytest.raises(APIError, match="max_text_chars"):
        check_shape({"input": [{"role": "user", "content": [{"type": "input_text", "text": big}]}]}, DEFAULT_LIMITS)

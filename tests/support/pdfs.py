"""Small PDFs written by hand for the tests (nothing downloaded): text pages in Helvetica, and
hostile ones (a decompression bomb, thousands of pages, a broken one; for page images: a
huge page, an image claiming billions of pixels, forms drawing forms, a page that is not
one)."""

from __future__ import annotations

import zlib


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def _document(objects: list[bytes]) -> bytes:
    """A PDF of `objects` (object 1 the catalog), its xref table computed."""
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def _stream(data: bytes, compress: bool = False) -> bytes:
    if compress:
        packed = zlib.compress(data, 9)
        return b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(packed) + packed + b"\nendstream"
    return b"<< /Length %d >>\nstream\n" % len(data) + data + b"\nendstream"


def text_pdf(pages: list[str], *, compress: bool = False, size: tuple[float, float] = (612, 792)) -> bytes:
    """A PDF with one line of `pages[i]` on page i (ASCII text), each page `size` (PDF units:
    1/72 inch; US Letter by default)."""
    # 1 catalog, 2 pages, 3 font, then per page: page, content
    kids = [4 + 2 * index for index in range(len(pages))]
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % kid for kid in kids) + b"] /Count %d >>" % len(pages),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for index, text in enumerate(pages):
        content = b"BT /F1 12 Tf 72 720 Td (" + _escape(text).encode("latin-1") + b") Tj ET"
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %g %g] /Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>"
            % (*size, kids[index] + 1)
        )
        objects.append(_stream(content, compress))
    return _document(objects)


def bomb_pdf(inflated_bytes: int = 512 * 1024 * 1024) -> bytes:
    """One page whose content stream inflates to `inflated_bytes` (spaces: a valid content
    stream, so only the size bounds it), from a few hundred KiB."""
    packer = zlib.compressobj(9)
    block = b" " * (1024 * 1024)
    packed = bytearray()
    for _ in range(inflated_bytes // len(block)):
        packed += packer.compress(block)
    packed += packer.flush()
    stream = b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(packed) + bytes(packed) + b"\nendstream"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [4 0 R] /Count 1 >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents 5 0 R >>",
        stream,
    ]
    return _document(objects)


def broken_pdf() -> bytes:
    """A PDF header, then garbage: no objects, no xref, no trailer."""
    return b"%PDF-1.7\n" + bytes(range(256)) * 8 + b"\n%%EOF"


_HEAD = [
    b"<< /Type /Catalog /Pages 2 0 R >>",
    b"<< /Type /Pages /Kids [4 0 R] /Count 1 >>",
    b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
]


def image_bomb_pdf(width: int = 100_000, height: int = 100_000) -> bytes:
    """One text page that also draws an image whose dictionary claims `width` x `height`
    gray pixels (its data: a few compressed bytes)."""
    packed = zlib.compress(bytes(1024))
    image = (
        b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray /BitsPerComponent 8 "
        b"/Length %d /Filter /FlateDecode >>\nstream\n" % (width, height, len(packed)) + packed + b"\nendstream"
    )
    return _document(
        [
            *_HEAD,
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> /XObject << /Im 6 0 R >> >> "
            b"/Contents 5 0 R >>",
            _stream(b"BT /F1 12 Tf 72 720 Td (A page with a picture.) Tj ET q 100 0 0 100 72 500 cm /Im Do Q"),
            image,
        ]
    )


def form_bomb_pdf(depth: int = 8, fanout: int = 10) -> bytes:
    """One page drawing form 1, which draws form 2 `fanout` times, ... down to a form that
    writes a word: `fanout ** (depth - 1)` words from a few hundred bytes (a renderer that
    expands every form parses them all)."""
    objects = [
        *_HEAD,
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> /XObject << /X 6 0 R >> >> "
        b"/Contents 5 0 R >>",
        _stream(b"BT /F1 12 Tf 72 740 Td (Forms all the way down.) Tj ET /X Do"),
    ]
    for level in range(depth):
        number = 6 + level
        last = level == depth - 1
        body = b"BT /F1 1 Tf 72 720 Td (x) Tj ET" if last else b" ".join([b"/Y Do"] * fanout)
        resources = b"<< /Font << /F1 3 0 R >> >>" if last else b"<< /XObject << /Y %d 0 R >> >>" % (number + 1)
        objects.append(
            b"<< /Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources "
            + resources
            + b" /Length %d >>\nstream\n" % len(body)
            + body
            + b"\nendstream"
        )
    return _document(objects)


def unloadable_page_pdf(pages: list[str], broken: int) -> bytes:
    """`text_pdf(pages)` whose page tree lists, before page `broken` (from 1), an entry that is
    not a page: pypdf skips it (the text is whole), PDFium counts it and cannot load it."""
    document = text_pdf(pages)
    kids = [b"%d 0 R" % (4 + 2 * index) for index in range(len(pages))]
    kids.insert(broken - 1, b"%d 0 R" % (4 + 2 * len(pages)))
    tree = b"<< /Type /Pages /Kids [" + b" ".join(kids) + b"] /Count %d >>" % (len(pages) + 1)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        tree,
        *_objects(document)[2:],
        b"(not a page)",
    ]
    return _document(objects)


def _objects(document: bytes) -> list[bytes]:
    """The bodies of a `_document`'s objects, in order."""
    return [chunk.split(b"\nendobj\n", 1)[0] for chunk in document.split(b" 0 obj\n")[1:]]

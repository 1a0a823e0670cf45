"""Image URLs are fetched under the one egress policy (the browser's and MCP's): a URL at a
private address, or one that redirects to one, is a 400 and the private address is never
reached; an allowed host is fetched, bounded in bytes, and read as an image."""

from __future__ import annotations

import asyncio
import io
import ipaddress
from collections.abc import Iterator

import httpx
import pytest
from PIL import Image
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from serve_app.api.errors import APIError
from serve_app.api.items import ImagePart
from serve_app.families.vision import VisionSpec
from serve_app.runtime.images import ImageReader
from tests.support.servers import uvicorn_server

ALLOWED = "images.test"  # resolved to the loopback server below, allowed by name


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 10)).save(out, "PNG")
    return out.getvalue()


class Origin:
    """A loopback web: an image, a redirect to the loopback address, a page that is not an
    image; every request recorded."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.port = 0

        async def cat(request: Request) -> Response:
            self.paths.append(request.url.path)
            return Response(_png(40, 30), media_type="image/png")

        async def hop(request: Request) -> Response:
            self.paths.append(request.url.path)
            return RedirectResponse(f"http://127.0.0.1:{self.port}/secret.png", status_code=302)

        async def secret(request: Request) -> Response:
            self.paths.append(request.url.path)
            return Response(_png(2, 2), media_type="image/png")

        async def page(request: Request) -> Response:
            self.paths.append(request.url.path)
            return Response("<html>not an image</html>", media_type="text/html")

        async def huge(request: Request) -> Response:
            self.paths.append(request.url.path)
            return Response(b"\0" * 200_000, media_type="image/png")

        self.app = Starlette(
            routes=[
                Route("/cat.png", cat),
                Route("/hop", hop),
                Route("/secret.png", secret),
                Route("/page", page),
                Route("/huge.png", huge),
            ]
        )


@pytest.fixture(scope="module")
def origin() -> Iterator[Origin]:
    web = Origin()
    with uvicorn_server(web.app) as url:
        web.port = httpx.URL(url).port or 0
        yield web


async def _resolve(host: str, port: int) -> list[ipaddress.IPv4Address]:
    return [ipaddress.IPv4Address("127.0.0.1")]


def _reader(**spec: int) -> ImageReader:
    return ImageReader.create(VisionSpec(**spec), allow_hosts=[ALLOWED], resolver=_resolve, fetch_timeout_s=10)


def _read(reader: ImageReader, url: str):
    return asyncio.run(reader.read(ImagePart(type="input_image", image_url=url), "input[0].content[1]"))


def test_an_allowed_host_is_fetched_and_read(origin):
    image = _read(_reader(), f"http://{ALLOWED}:{origin.port}/cat.png")
    assert (image.width, image.height, image.tokens) == (40, 30, 1)
    assert image.data == _png(40, 30)


def test_a_redirect_to_a_private_address_is_refused_before_it_is_reached(origin):
    before = list(origin.paths)
    with pytest.raises(APIError) as refused:
        _read(_reader(), f"http://{ALLOWED}:{origin.port}/hop")
    assert refused.value.param == "input[0].content[1].image_url"
    assert "a loopback address" in refused.value.message
    assert origin.paths[len(before) :] == ["/hop"]  # never /secret.png


def test_bodies_that_are_not_images_or_are_too_large_are_refused(origin):
    with pytest.raises(APIError, match="content of type `text/html`"):
        _read(_reader(), f"http://{ALLOWED}:{origin.port}/page")
    with pytest.raises(APIError, match="larger than 100000 bytes"):
        _read(_reader(max_image_bytes=100_000), f"http://{ALLOWED}:{origin.port}/huge.png")


def test_a_data_url_over_the_byte_bound_is_refused_before_it_is_decoded():
    import base64

    url = "data:image/png;base64," + base64.b64encode(_png(300, 300) + b"\0" * 20_000).decode()
    with pytest.raises(APIError, match=r"vision\.max_image_bytes"):
        _read(_reader(max_image_bytes=10_000), url)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "169.254.169.254", "10.0.0.1"])
def test_a_private_image_url_through_the_api_is_a_400_and_never_fetched(inprocess_url, origin, host):
    before = list(origin.paths)
    port = f":{origin.port}" if host in ("127.0.0.1", "localhost", "[::1]") else ""
    content = [{"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": f"http://{host}{port}/secret.png"}]
    answer = httpx.post(f"{inprocess_url}/responses", json={"model": "qwen3-vl-replay", "input": [{"role": "user", "content": content}]})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "input[0].content[1].image_url"
    assert "could not be fetched" in error["message"]
    assert origin.paths == before

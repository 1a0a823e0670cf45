"""A small web on loopback for the browser's tests: pages, a SearXNG-shaped search API and a
Tavily-shaped one, each request recorded (path and Host header) so a test can show that a
refused URL never reached the server."""

from __future__ import annotations

import asyncio
import functools
import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.servers import uvicorn_server

TAVILY_KEY = "tvly-test-key-0123456789"

ARTICLE = """<html><head><title>Harmony, explained</title></head><body><main>
<h1>Harmony</h1>
<p>Harmony is the response format gpt-oss was trained on. It has roles and channels, and it
is described in the <a href="/pages/channels">channels page</a> and on
<a href="https://cookbook.example.org/harmony">the cookbook</a>.</p>
<p>The browser tool cites pages with cursors and line numbers.</p>
<p>The final channel carries the answer the user reads.</p>
</main></body></html>"""

CHANNELS = """<html><head><title>Channels</title></head><body><main>
<p>There are three channels: analysis, commentary and final. Each message names one.</p>
</main></body></html>"""


@dataclass
class Web:
    base: str = ""
    requests: list[tuple[str, str]] = field(default_factory=list)  # (path, Host header)
    results: list[dict] = field(default_factory=list)  # what the search APIs answer
    pages: dict[str, str] = field(default_factory=lambda: {"article": ARTICLE, "channels": CHANNELS})

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]

    def url(self, path: str) -> str:
        return self.base + path

    def app(self) -> Starlette:
        async def record(request: Request) -> None:
            self.requests.append((request.url.path, request.headers.get("host", "")))

        async def search(request: Request) -> Response:
            await record(request)
            if request.query_params.get("format") != "json":
                return PlainTextResponse("format=json required", status_code=403)
            return JSONResponse({"query": request.query_params.get("q"), "results": self.results})

        async def big_search(request: Request) -> Response:
            await record(request)

            async def body():
                yield b'{"results": ['
                for _ in range(5000):  # 5 MB
                    yield b'{"url": "https://a.example/", "title": "' + b"t" * 1000 + b'"},'
                yield b"{}]}"

            return StreamingResponse(body(), media_type="application/json")

        async def tavily(request: Request) -> Response:
            await record(request)
            if request.headers.get("authorization") != f"Bearer {TAVILY_KEY}":
                # A careless API that echoes the credential it was given.
                return PlainTextResponse(f"invalid key: {request.headers.get('authorization')}", status_code=401)
            body = json.loads(await request.body())
            return JSONResponse({"query": body["query"], "results": self.results[: body["max_results"]]})

        async def page(request: Request) -> Response:
            await record(request)
            html = self.pages.get(request.path_params["name"])
            return Response(html, media_type="text/html") if html is not None else PlainTextResponse("not found", status_code=404)

        async def redirect(request: Request) -> Response:
            await record(request)
            return RedirectResponse(request.query_params["to"], status_code=302)

        async def loop(request: Request) -> Response:
            await record(request)
            return RedirectResponse("/loop", status_code=302)

        async def huge(request: Request) -> Response:
            await record(request)

            async def body():
                yield b"<html><head><title>Huge</title></head><body>"
                for i in range(20_000):  # ~20 MB if read to the end
                    yield f"<p>Paragraph {i} ".encode() + b"x" * 1000 + b"</p>"

            return StreamingResponse(body(), media_type="text/html")

        async def slow(request: Request) -> Response:
            await record(request)

            async def body():
                yield b"<html><body><p>"
                for _ in range(600):
                    await asyncio.sleep(0.1)
                    yield b"x"

            return StreamingResponse(body(), media_type="text/html")

        async def binary(request: Request) -> Response:
            await record(request)
            return Response(b"\x00\x01", media_type="application/octet-stream")

        async def plain(request: Request) -> Response:
            await record(request)
            return PlainTextResponse("Plain text line one.\nLine two 【0†not a link】.")

        async def bomb(request: Request) -> Response:
            await record(request)
            return Response(_bomb(), media_type="text/html", headers={"content-encoding": "gzip"})

        async def brotli(request: Request) -> Response:
            await record(request)
            return Response(b"\x0b\x02\x80hello\x03", media_type="text/html", headers={"content-encoding": "br"})

        async def secret(request: Request) -> Response:
            await record(request)
            return PlainTextResponse("the secret")

        return Starlette(
            routes=[
                Route("/search", search),
                Route("/big/search", big_search),
                Route("/tavily/search", tavily, methods=["POST"]),
                Route("/pages/{name}", page),
                Route("/redirect", redirect),
                Route("/loop", loop),
                Route("/huge", huge),
                Route("/slow", slow),
                Route("/binary", binary),
                Route("/plain", plain),
                Route("/bomb", bomb),
                Route("/brotli", brotli),
                Route("/secret", secret),
            ]
        )


@functools.cache
def _bomb() -> bytes:
    """64 MiB of HTML inflated from about 64 KiB of gzip."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"<html><body><p>" + b"0" * (1024 * 1024)
    return b"".join(compressor.compress(zeros) for _ in range(64)) + compressor.flush()


@contextmanager
def running_web() -> Iterator[Web]:
    web = Web()
    with uvicorn_server(web.app()) as url:
        web.base = url.removesuffix("/v1")
        yield web

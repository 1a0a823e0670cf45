"""The HTTP surface: a FastAPI app factory over token sources.

`create_app(models)` takes, per model name, something that turns a `GenerationRequest` into
`TokenBatch`es: a backend object in-process (tests, benchmarks, debugging) or a Ray Serve
deployment handle inside the `ResponsesIngress` deployment. Everything between the request
bytes and the SSE bytes is the same code in both cases.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Protocol, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from openai.types import Model
from openai_harmony import Message, Role
from openai.types.responses import ResponseStreamEvent
from starlette.exceptions import HTTPException as StarletteHTTPException

from .protocol.errors import APIError, invalid_request, model_not_found, model_unavailable, server_error
from .protocol.harmony import HarmonyModel, HistoryItem, render_completion, render_prompt
from .protocol.items import CompletionParser, ItemSink
from .protocol.request import ResponsesRequest, parse_request
from .protocol.sse import encode_events
from .protocol.stream import ResponseStream, new_id
from .protocol.tokens import GenerationRequest, TokenBatch
from .store import InMemoryStore

logger = logging.getLogger("responses_serve")

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024


class TokenSource(Protocol):
    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenBatch]: ...


class ModelFamily(Protocol):
    """How a kind of model is prompted and parsed (`HarmonyModel`, `ChatTemplateModel`)."""

    stop_token_ids: list[int]

    def render_prompt(self, request: ResponsesRequest, history: list[HistoryItem]) -> list[int]: ...
    def parser(self, sink: ItemSink, prompt: list[int]) -> CompletionParser: ...


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    source: TokenSource
    max_model_len: int = 131_072
    family: ModelFamily = field(default_factory=HarmonyModel)
    owned_by: str = "responses-serve"
    # Why the model cannot take requests now (e.g. its engine deployment has no running
    # replica), or None: such requests get a 503 instead of waiting for an engine.
    unavailable: Callable[[str], Awaitable[str | None]] | None = None


async def _run(stream: ResponseStream, source: TokenSource, generation: GenerationRequest) -> AsyncIterator[list[ResponseStreamEvent]]:
    """Events of one response, a list per token batch. Ends with exactly one terminal event."""
    yield stream.start()
    try:
        # aclosing: a client that goes away closes this generator, which must close (and so
        # abort) the engine stream at once rather than whenever the GC gets to it.
        async with contextlib.aclosing(source.generate(generation)) as batches:
            # Read the source to its end even after the last batch, so a finished engine
            # call ends normally instead of being cancelled.
            async for batch in batches:
                if stream.finished:
                    logger.warning("response %s: engine sent tokens after its last batch", stream.response.id)
                    continue
                if events := stream.feed(batch):
                    yield events
        if not stream.finished:  # the source ended without a finish reason: a normal stop
            yield stream.feed(TokenBatch([], finish_reason="stop"))
    except Exception as exc:  # engine died or raised: the client still gets a proper ending
        logger.exception("response %s: engine stream failed", stream.response.id)
        yield stream.fail(f"The engine failed while generating this response: {type(exc).__name__}: {exc}")


def create_app(
    models: Sequence[ServedModel],
    *,
    store: InMemoryStore | None = None,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> FastAPI:
    _warm_up()
    served = {model.name: model for model in models}
    store = store if store is not None else InMemoryStore()
    app = FastAPI(title="responses-serve", docs_url=None, redoc_url=None)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status_code)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"{exc.detail}: {request.method} {request.url.path}"
        error = APIError(message, status_code=exc.status_code, code=None)
        return JSONResponse(error.body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error")
        error = server_error("The server had an error while processing your request.")
        return JSONResponse(error.body(), status_code=500)

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        authorized = request.headers.get("authorization") == f"Bearer {api_key}"
        if api_key and request.url.path.startswith("/v1/") and not authorized:
            error = APIError("Incorrect API key provided.", status_code=401, code="invalid_api_key")
            return JSONResponse(error.body(), status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models() -> dict:
        data = [Model(id=m.name, object="model", created=0, owned_by=m.owned_by).model_dump() for m in served.values()]
        return {"object": "list", "data": data}

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str) -> Response:
        stored = store.get(response_id)
        if stored is None:
            raise APIError(f"No response found with id '{response_id}'.", status_code=404, param="response_id", code="not_found")
        return Response(stored.response.model_dump_json(), media_type="application/json")

    @app.post("/v1/responses")
    async def create_response(http_request: Request) -> Response:
        started = time.perf_counter()
        request = parse_request(await _read_body(http_request, max_request_bytes))
        model = served.get(request.model)
        if model is None:
            raise model_not_found(request.model)
        if model.unavailable is not None and (state := await model.unavailable(model.name)):
            raise model_unavailable(model.name, state)
        history = _history(request, store)
        prompt = model.family.render_prompt(request, history)
        generation = _generation_request(request, prompt, model)
        stream = ResponseStream(request, response_id=generation.request_id, parser_factory=lambda sink: model.family.parser(sink, prompt))
        logger.info(
            "response %s: model=%s stream=%s prompt_tokens=%d max_tokens=%d",
            generation.request_id, model.name, request.stream, len(prompt), generation.max_tokens,
        )

        def finished() -> None:
            response = stream.response
            if request.store and response.status in ("completed", "incomplete"):
                store.put(response, history)
            usage = response.usage
            logger.info(
                "response %s: %s output_tokens=%d in %.3fs",
                response.id, response.status, usage.output_tokens if usage else 0, time.perf_counter() - started,
            )

        if request.stream:
            return StreamingResponse(
                _sse(_run(stream, model.source, generation), stream, finished),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        async for _ in _run(stream, model.source, generation):
            pass
        finished()
        response = stream.response
        if response.status == "failed":
            raise server_error(response.error.message, status_code=503)
        # The same serialization as the terminal event of a stream: one source of truth.
        return Response(response.model_dump_json(), media_type="application/json")

    return app


def _warm_up() -> None:
    """Build the lazy pydantic schemas and the harmony encoding now, not on the first request."""
    request = ResponsesRequest(model="warm-up", input="warm up")
    render_prompt(request, request.input_items())
    completion = render_completion(
        [
            Message.from_role_and_content(Role.ASSISTANT, "thinking").with_channel("analysis"),
            Message.from_role_and_content(Role.ASSISTANT, "{}").with_channel("commentary").with_recipient("functions.f"),
            Message.from_role_and_content(Role.ASSISTANT, "answer").with_channel("final"),
        ]
    )
    stream = ResponseStream(request)
    encode_events(stream.start() + stream.feed(TokenBatch(completion, finish_reason="stop")))


async def _sse(events: AsyncIterator[list[ResponseStreamEvent]], stream: ResponseStream, finished) -> AsyncIterator[bytes]:
    try:
        async with contextlib.aclosing(events):
            async for batch_events in events:
                yield encode_events(batch_events)
    finally:
        if stream.finished:
            finished()
        else:
            logger.info("response %s: client went away, generation aborted", stream.response.id)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    too_large = APIError(
        f"The request body is larger than this server accepts ({limit} bytes).", status_code=413, code="request_too_large"
    )
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _history(request: ResponsesRequest, store: InMemoryStore) -> list[HistoryItem]:
    items = request.input_items()
    if request.previous_response_id is None:
        return items
    stored = store.get(request.previous_response_id)
    if stored is None:
        raise invalid_request(
            f"Previous response with id '{request.previous_response_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return stored.conversation + items


def _generation_request(request: ResponsesRequest, prompt: list[int], model: ServedModel) -> GenerationRequest:
    max_model_len = model.max_model_len
    room = max_model_len - len(prompt)
    if room < 1:
        raise invalid_request(
            f"This model's maximum context length is {max_model_len} tokens, but the input has "
            f"{len(prompt)} tokens. Shorten the input.",
            param="input",
            code="context_length_exceeded",
        )
    max_tokens = min(request.max_output_tokens or room, room)
    return GenerationRequest(
        request_id=new_id("resp"),
        prompt_token_ids=prompt,
        stop_token_ids=model.family.stop_token_ids,
        max_tokens=max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
    )

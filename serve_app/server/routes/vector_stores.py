"""`/v1/vector_stores`: vector stores (create, list, retrieve, update, delete), their files
(attach, list, retrieve, update attributes, delete, content), file batches (create,
retrieve, cancel, list files) and search. Shapes as the `openai` SDK's `vector_stores`
resource reads them; the work is runtime/vector_stores.py's. Writes and searches count a
request of the tenant's `requests_per_minute` (`COUNTED`); embedding counts tokens. Without
`vector_stores:` in the config every route is a 404 saying so."""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from openai.types import VectorStoreSearchResponse
from openai.types.vector_store_search_response import Content
from pydantic import BaseModel

from serve_app.api.errors import APIError
from serve_app.api.request import parse_body
from serve_app.api.vector_stores import (
    AUTO,
    BatchCreate,
    FileAttach,
    FileUpdate,
    SearchPage,
    SearchRequest,
    VectorStoreCreate,
    VectorStoreUpdate,
)
from serve_app.runtime.vector_stores import TenantVectorStores
from serve_app.server.context import tenant_state
from serve_app.server.rate_headers import COUNTED
from serve_app.tools.file_search import ranking_of_options

router = APIRouter()
Body = TypeVar("Body", bound=BaseModel)
Order = Literal["asc", "desc"]


def _json(data: str | dict[str, Any]) -> Response:
    return Response(data if isinstance(data, str) else json.dumps(data, separators=(",", ":")), media_type="application/json")


def _stores(request: Request) -> TenantVectorStores:
    stores = tenant_state(request).vector_stores
    if stores is None:
        raise APIError(
            "This server has no Vector Stores API: its operator enables it with vector_stores: {...} in the app's config.",
            status_code=404,
            code="not_found",
        )
    return stores


async def _body(request: Request, model: type[Body]) -> Body:
    from serve_app.server.routes.responses import read_request

    return await read_request(request, lambda body, limits: parse_body(body or b"{}", model, limits))


def _page(items: list[dict[str, Any]], limit: int, order: Order, after: str | None, before: str | None) -> dict[str, Any]:
    """A cursor page of `items` (oldest first as given) as OpenAI lists: `order`, then `after`/`before` an id."""
    ordered = items if order == "asc" else list(reversed(items))
    ids = [item["id"] for item in ordered]
    if after is not None and after in ids:
        ordered = ordered[ids.index(after) + 1 :]
    if before is not None and before in ids:
        ordered = ordered[: ids.index(before)]
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }


_LIMIT = Query(20, ge=1, le=100)
_ORDER = Query("desc")


@router.post("/v1/vector_stores", dependencies=COUNTED)
async def create_vector_store(request: Request) -> Response:
    body = await _body(request, VectorStoreCreate)
    stores = _stores(request)
    vector_store = await stores.create(
        name=body.name,
        metadata=body.metadata,
        expires_after=body.expires_after.model_dump() if body.expires_after else None,
        file_ids=body.file_ids,
        chunking=body.chunking_strategy or AUTO,
    )
    return _json(vector_store.model_dump_json())


@router.get("/v1/vector_stores")
async def list_vector_stores(
    request: Request, limit: int = _LIMIT, order: Order = _ORDER, after: str | None = None, before: str | None = None
) -> Response:
    stores = await _stores(request).records.all()
    return _json(_page([store.model_dump(mode="json") for store in stores], limit, order, after, before))


@router.get("/v1/vector_stores/{vector_store_id}")
async def retrieve_vector_store(vector_store_id: str, request: Request) -> Response:
    return _json((await _stores(request).records.existing(vector_store_id)).model_dump_json())


@router.post("/v1/vector_stores/{vector_store_id}", dependencies=COUNTED)
async def update_vector_store(vector_store_id: str, request: Request) -> Response:
    body = await _body(request, VectorStoreUpdate)
    changes = body.model_dump(exclude_unset=True)
    return _json((await _stores(request).update(vector_store_id, changes)).model_dump_json())


@router.delete("/v1/vector_stores/{vector_store_id}")
async def delete_vector_store(vector_store_id: str, request: Request) -> Response:
    stores = _stores(request)
    await stores.records.existing(vector_store_id)
    deleted = await stores.delete(vector_store_id)
    return _json({"id": vector_store_id, "object": "vector_store.deleted", "deleted": deleted})


@router.post("/v1/vector_stores/{vector_store_id}/search", dependencies=COUNTED)
async def search_vector_store(vector_store_id: str, request: Request) -> Response:
    body = await _body(request, SearchRequest)
    stores = _stores(request)
    max_results = min(body.max_num_results, stores.service.limits.max_search_results)
    hits = await stores.search(
        [vector_store_id], body.text, max_results=max_results, ranking=ranking_of_options(body.ranking_options), filters=body.filters
    )
    data = [
        VectorStoreSearchResponse(
            file_id=hit.file_id,
            filename=hit.filename,
            score=hit.score,
            attributes=hit.attributes or None,
            content=[Content(type="text", text=hit.text)],
        )
        for hit in hits
    ]
    query = body.query if isinstance(body.query, list) else [body.query]
    return _json(SearchPage(search_query=query, data=data).model_dump_json())


# -- files --


@router.post("/v1/vector_stores/{vector_store_id}/files", dependencies=COUNTED)
async def attach_file(vector_store_id: str, request: Request) -> Response:
    body = await _body(request, FileAttach)
    file = await _stores(request).attach(vector_store_id, body.file_id, attributes=body.attributes, chunking=body.chunking_strategy or AUTO)
    return _json(file.model_dump_json())


@router.get("/v1/vector_stores/{vector_store_id}/files")
async def list_files(
    vector_store_id: str,
    request: Request,
    limit: int = _LIMIT,
    order: Order = _ORDER,
    after: str | None = None,
    before: str | None = None,
    filter: Literal["in_progress", "completed", "failed", "cancelled"] | None = None,
) -> Response:
    stores = _stores(request)
    await stores.records.existing(vector_store_id)
    files = [f.model_dump(mode="json") for f in await stores.records.files(vector_store_id) if filter is None or f.status == filter]
    return _json(_page(files, limit, order, after, before))


@router.get("/v1/vector_stores/{vector_store_id}/files/{file_id}")
async def retrieve_file(vector_store_id: str, file_id: str, request: Request) -> Response:
    return _json((await _stores(request).file(vector_store_id, file_id)).model_dump_json())


@router.post("/v1/vector_stores/{vector_store_id}/files/{file_id}", dependencies=COUNTED)
async def update_file(vector_store_id: str, file_id: str, request: Request) -> Response:
    body = await _body(request, FileUpdate)
    return _json((await _stores(request).update_file(vector_store_id, file_id, body.attributes)).model_dump_json())


@router.delete("/v1/vector_stores/{vector_store_id}/files/{file_id}")
async def delete_file(vector_store_id: str, file_id: str, request: Request) -> Response:
    stores = _stores(request)
    await stores.file(vector_store_id, file_id)
    deleted = await stores.detach(vector_store_id, file_id)
    return _json({"id": file_id, "object": "vector_store.file.deleted", "deleted": deleted})


# -- file batches --


@router.post("/v1/vector_stores/{vector_store_id}/file_batches", dependencies=COUNTED)
async def create_file_batch(vector_store_id: str, request: Request) -> Response:
    body = await _body(request, BatchCreate)
    entries = [(entry.file_id, entry.attributes, entry.chunking_strategy or AUTO) for entry in body.entries()]
    param = "files" if body.files is not None else "file_ids"
    return _json((await _stores(request).create_batch(vector_store_id, entries, param=param)).model_dump_json())


@router.get("/v1/vector_stores/{vector_store_id}/file_batches/{batch_id}")
async def retrieve_file_batch(vector_store_id: str, batch_id: str, request: Request) -> Response:
    return _json((await _stores(request).batch(vector_store_id, batch_id)).model_dump_json())


@router.post("/v1/vector_stores/{vector_store_id}/file_batches/{batch_id}/cancel", dependencies=COUNTED)
async def cancel_file_batch(vector_store_id: str, batch_id: str, request: Request) -> Response:
    return _json((await _stores(request).cancel_batch(vector_store_id, batch_id)).model_dump_json())


@router.get("/v1/vector_stores/{vector_store_id}/file_batches/{batch_id}/files")
async def list_file_batch_files(
    vector_store_id: str,
    request: Request,
    batch_id: str,
    limit: int = _LIMIT,
    order: Order = _ORDER,
    after: str | None = None,
    before: str | None = None,
    filter: Literal["in_progress", "completed", "failed", "cancelled"] | None = None,
) -> Response:
    _, files = await _stores(request).batch_files(vector_store_id, batch_id)
    data = [f.model_dump(mode="json") for f in files if filter is None or f.status == filter]
    return _json(_page(data, limit, order, after, before))

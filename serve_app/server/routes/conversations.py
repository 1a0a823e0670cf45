"""`/v1/conversations`: create, retrieve, update metadata, delete; and its items: list, create,
retrieve, delete. Shapes as the `openai` SDK's `conversations` resource reads them. The
writes (create, update, items create) count a request of the tenant's `requests_per_minute`
(`COUNTED`); reads and deletes count none."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response
from openai.types.conversations import Conversation
from pydantic import BaseModel, ValidationError

from serve_app.api.conversations import ConversationCreate, ConversationUpdate, ItemsCreate, ItemsQuery
from serve_app.api.errors import APIError, from_validation_error, invalid_request
from serve_app.api.request import parse_body
from serve_app.server.context import tenant_state
from serve_app.server.rate_headers import COUNTED
from serve_app.state.conversations import ConversationStore, conversation_not_found

router = APIRouter()

Body = TypeVar("Body", bound=BaseModel)


def _json(data: str | bytes | dict[str, Any]) -> Response:
    body = data if isinstance(data, (str, bytes)) else json.dumps(data, separators=(",", ":"))
    return Response(body, media_type="application/json")


def _item_not_found(item_id: str) -> APIError:
    return APIError(f"Item with id '{item_id}' not found.", status_code=404, param="item_id", code="not_found")


def _store(request: Request) -> ConversationStore:
    return tenant_state(request).conversations


async def _body(request: Request, model: type[Body]) -> Body:
    """The body as `model`, read and parsed as a response's body is (one size limit, strict
    JSON, `request_limits`); an empty body is an empty object."""
    from serve_app.server.routes.responses import read_request

    return await read_request(request, lambda body, limits: parse_body(body or b"{}", model, limits))


async def _existing(conversations: ConversationStore, conversation_id: str) -> Conversation:
    conversation = await conversations.get(conversation_id)
    if conversation is None:
        raise conversation_not_found(conversation_id)
    return conversation


def _item_list(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


@router.post("/v1/conversations", dependencies=COUNTED)
async def create_conversation(request: Request) -> Response:
    body = await _body(request, ConversationCreate)
    conversation = await _store(request).create(body.metadata, list(body.items or []))
    return _json(conversation.model_dump_json())


@router.get("/v1/conversations/{conversation_id}")
async def retrieve_conversation(conversation_id: str, request: Request) -> Response:
    return _json((await _existing(_store(request), conversation_id)).model_dump_json())


@router.post("/v1/conversations/{conversation_id}", dependencies=COUNTED)
async def update_conversation(conversation_id: str, request: Request) -> Response:
    body = await _body(request, ConversationUpdate)
    conversation = await _store(request).update(conversation_id, body.metadata)
    if conversation is None:
        raise conversation_not_found(conversation_id)
    return _json(conversation.model_dump_json())


@router.delete("/v1/conversations/{conversation_id}")
async def delete_conversation(conversation_id: str, request: Request) -> Response:
    if not await _store(request).delete(conversation_id):
        raise conversation_not_found(conversation_id)
    return _json({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


@router.get("/v1/conversations/{conversation_id}/items")
async def list_items(conversation_id: str, request: Request) -> Response:
    # `include` is accepted and needs nothing: stored items are whole.
    query = {k: v for k, v in request.query_params.items() if k in ("after", "limit", "order")}
    try:
        params = ItemsQuery.model_validate(query)
    except ValidationError as exc:
        raise from_validation_error(exc) from None
    conversations = _store(request)
    await _existing(conversations, conversation_id)
    page = await conversations.page(conversation_id, after=params.after, limit=params.limit, order=params.order)
    if page is None:
        raise invalid_request(f"No item with id '{params.after}' in conversation '{conversation_id}'.", param="after")
    return _json(_item_list(page.data, page.has_more))


@router.post("/v1/conversations/{conversation_id}/items", dependencies=COUNTED)
async def create_items(conversation_id: str, request: Request) -> Response:
    body = await _body(request, ItemsCreate)
    conversations = _store(request)
    await _existing(conversations, conversation_id)
    return _json(_item_list(await conversations.append(conversation_id, list(body.items)), has_more=False))


@router.get("/v1/conversations/{conversation_id}/items/{item_id}")
async def retrieve_item(conversation_id: str, item_id: str, request: Request) -> Response:
    conversations = _store(request)
    await _existing(conversations, conversation_id)
    item = await conversations.item(conversation_id, item_id)
    if item is None:
        raise _item_not_found(item_id)
    return _json(item)


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}")
async def delete_item(conversation_id: str, item_id: str, request: Request) -> Response:
    conversations = _store(request)
    conversation = await _existing(conversations, conversation_id)
    if not await conversations.delete_item(conversation_id, item_id):
        raise _item_not_found(item_id)
    return _json(conversation.model_dump_json())

"""A conversation's bound (`ConversationLimits`) on every backend (memory, the embedded
store deployment, Redis, Redis as Kubernetes runs it): appends that would pass it are
refused whole, concurrent appends are each counted (a compare-and-set on the size key), and
an item deleted gives its room back."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import TypeAdapter

from serve_app.api.errors import APIError
from serve_app.api.items import StoredInputItem
from serve_app.state.conversations import ConversationLimits, ConversationStore, item_record, size_key

ITEMS = TypeAdapter(list[StoredInputItem])
pytestmark = pytest.mark.anyio


def messages(n: int, text: str = "hello") -> list:
    return ITEMS.validate_python([{"type": "message", "role": "user", "content": f"{text} {i}"} for i in range(n)])


async def test_concurrent_appends_never_pass_the_bound(store):
    conversations = ConversationStore(store, "team-a", ttl_s=60, limits=ConversationLimits(max_items=25, max_bytes=1 << 20))
    conversation = await conversations.create(None, messages(1))

    results = await asyncio.gather(*(conversations.append(conversation.id, messages(3)) for _ in range(12)), return_exceptions=True)
    refused = [result for result in results if isinstance(result, BaseException)]
    assert len(refused) == 4  # 1 + 8 * 3 = 25
    assert {(error.status_code, error.code) for error in refused if isinstance(error, APIError)} == {(400, "conversation_too_large")}
    assert all(isinstance(error, APIError) for error in refused)
    assert await conversations.length(conversation.id) == 25
    items, size = await conversations.size(conversation.id)
    assert items == 25
    assert size == sum(len(record) for record in await conversations.records(conversation.id))


async def test_a_turn_let_in_lands_past_the_bound_and_the_next_is_refused(store):
    conversations = ConversationStore(store, "team-a", ttl_s=60, limits=ConversationLimits(max_items=5, max_bytes=1 << 20))
    conversation = await conversations.create(None, messages(4))
    await conversations.check_room(conversation.id, messages(1))
    await conversations.append(conversation.id, messages(3), enforce=False)  # its input and output
    with pytest.raises(APIError) as refused:
        await conversations.check_room(conversation.id, messages(1))
    assert (refused.value.code, refused.value.param) == ("conversation_too_large", "conversation")
    assert "would hold 8 items" in refused.value.message  # 7 held, and one more


async def test_deleting_items_and_the_conversation_gives_the_room_back(store):
    conversations = ConversationStore(store, "team-a", ttl_s=60, limits=ConversationLimits(max_items=1000, max_bytes=2300))
    conversation = await conversations.create(None, [])
    added = await conversations.append(conversation.id, messages(4, "x" * 400))
    with pytest.raises(APIError):
        await conversations.append(conversation.id, messages(1, "x" * 400))
    assert await conversations.delete_item(conversation.id, added[0]["id"])
    assert await conversations.size(conversation.id) == (3, sum(len(item_record(i)) for i in messages(3, "x" * 400)))
    await conversations.append(conversation.id, messages(1, "x" * 400))
    assert await conversations.delete(conversation.id)
    assert await store.get(f"t:team-a:{size_key(conversation.id)}") is None

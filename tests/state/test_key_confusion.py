"""Ids a client chooses against the keys of its own state, on every store backend: an id
spelled like the rest of another object's key names nothing (it once named a conversation's
items: `DELETE /v1/conversations/{id}:items` emptied conversation `{id}` and said it deleted
a conversation that never existed)."""

from __future__ import annotations

import pytest

from serve_app.api.items import MessageItem
from serve_app.state.conversations import ConversationStore

pytestmark = pytest.mark.anyio


async def test_a_conversation_id_cannot_name_another_conversations_items(store):
    conversations = ConversationStore(store, "team-a", ttl_s=60)
    kept = await conversations.create({}, [MessageItem(role="user", content="keep me")])
    for suffix in (":items", ":items:items", ""):
        forged = kept.id + suffix if suffix else "items:" + kept.id
        assert await conversations.get(forged) is None
        assert await conversations.items(forged) == []
        assert await conversations.update(forged, {"a": "b"}) is None
        assert await conversations.delete(forged) is False
    assert [item["content"][0]["text"] for item in await conversations.items(kept.id)] == ["keep me"]
    assert (await conversations.get(kept.id)) == kept

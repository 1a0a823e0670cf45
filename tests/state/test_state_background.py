"""Background-run records and event logs, and conversations, on every store backend
(in-process memory, the embedded store deployment, a real redis-server): the primitives background responses and the
Conversations API are built from."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.api.items import MessageItem
from serve_app.state.conversations import ConversationStore
from serve_app.state.runs import RunStore

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_run_lease_cancel_close(store):
    clock = Clock()
    runs = RunStore(store, "t", ttl_s=60, lease_s=10, clock=clock)
    record = await runs.create("resp_1", "replica-a")
    assert (record.owner, record.lease_until, record.cancel, record.closed) == ("replica-a", 1010.0, False, False)
    with pytest.raises(RuntimeError):
        await runs.create("resp_1", "replica-b")  # one owner per run
    clock.now = 1005
    assert (await runs.renew("resp_1", "replica-a")).lease_until == 1015
    assert (await runs.renew("resp_1", "replica-b")).lease_until == 1015  # not the owner: unchanged
    clock.now = 1016
    assert (await runs.get("resp_1")).expired(clock()) is True
    assert (await runs.request_cancel("resp_1")).cancel is True
    renewed = await runs.renew("resp_1", "replica-a")  # the owner learns of the cancel by renewing
    assert renewed.cancel
    assert renewed.lease_until == 1026
    assert not renewed.expired(clock())
    closed = await runs.close("resp_1", 7, "cancelled")
    assert (closed.closed, closed.length, closed.status) == (True, 7, "cancelled")
    assert await runs.close("resp_1", 9, "failed") == closed  # the first close stands
    assert (await runs.renew("resp_1", "replica-a")).closed
    assert await runs.get("resp_unknown") is None
    assert await runs.request_cancel("resp_unknown") is None


async def test_concurrent_updates_are_not_lost(store):
    runs = RunStore(store, "t", ttl_s=60)
    await runs.create("resp_2", "a")
    # The owner renews while another replica cancels: both changes stick.
    await asyncio.gather(*[runs.renew("resp_2", "a") for _ in range(10)], runs.request_cancel("resp_2"))
    record = await runs.get("resp_2")
    assert record.cancel
    assert record.owner == "a"


async def test_event_log_has_one_writer_per_position(store):
    runs = RunStore(store, "t", ttl_s=60)
    assert await runs.append("resp_3", [b"e0", b"e1"], at=0)
    assert not await runs.append("resp_3", [b"x"], at=1)  # position 1 is taken
    assert await runs.append("resp_3", [b"e2"], at=2)
    assert await runs.events("resp_3", 0) == [b"e0", b"e1", b"e2"]
    assert await runs.events("resp_3", 2) == [b"e2"]
    assert await runs.events("resp_3", 3) == []
    assert await runs.length("resp_3") == 3
    await runs.delete("resp_3")
    assert await runs.length("resp_3") == 0


async def test_conversation_lifecycle(store):
    conversations = ConversationStore(store, "t", ttl_s=60)
    created = await conversations.create({"topic": "demo"}, [MessageItem(role="user", content="hello")])
    assert created.id.startswith("conv_")
    assert created.metadata == {"topic": "demo"}
    assert (await conversations.get(created.id)) == created
    items = await conversations.items(created.id)
    assert len(items) == 1
    assert items[0]["id"].startswith("msg_")
    assert items[0]["content"] == [{"type": "input_text", "text": "hello"}]
    assert items[0]["role"] == "user"
    history = await conversations.history(created.id)
    assert history[0].text == "hello"
    assert history[0].id == items[0]["id"]
    updated = await conversations.update(created.id, {"topic": "other"})
    assert updated.metadata == {"topic": "other"}
    assert (await conversations.get(created.id)).metadata == {"topic": "other"}
    assert await conversations.delete(created.id) is True
    assert await conversations.get(created.id) is None
    assert await conversations.items(created.id) == []
    assert await conversations.update(created.id, {}) is None
    assert await conversations.delete(created.id) is False


async def test_conversation_pages_and_item_deletion(store):
    conversations = ConversationStore(store, "t", ttl_s=60)
    conversation = await conversations.create(None, [])
    added = await conversations.append(conversation.id, [MessageItem(role="user", content=f"m{i}") for i in range(5)])
    ids = [item["id"] for item in added]
    page = await conversations.page(conversation.id, after=None, limit=2, order="asc")
    assert [i["id"] for i in page.data] == ids[:2]
    assert page.has_more
    page = await conversations.page(conversation.id, after=ids[1], limit=10, order="asc")
    assert [i["id"] for i in page.data] == ids[2:]
    assert not page.has_more
    page = await conversations.page(conversation.id, after=ids[3], limit=10, order="desc")
    assert [i["id"] for i in page.data] == ids[:3][::-1]
    assert await conversations.page(conversation.id, after="msg_nope", limit=10, order="asc") is None
    assert (await conversations.item(conversation.id, ids[2]))["content"][0]["text"] == "m2"
    assert await conversations.delete_item(conversation.id, ids[2]) is True
    assert await conversations.delete_item(conversation.id, ids[2]) is False
    assert await conversations.item(conversation.id, ids[2]) is None
    assert [i["id"] for i in await conversations.items(conversation.id)] == ids[:2] + ids[3:]


async def test_concurrent_turns_lose_no_item(store):
    conversations = ConversationStore(store, "t", ttl_s=60)
    conversation = await conversations.create(None, [])

    async def turn(n: int) -> None:
        await conversations.append(
            conversation.id, [MessageItem(role="user", content=f"q{n}"), MessageItem(role="assistant", content=f"a{n}")]
        )

    await asyncio.gather(*[turn(n) for n in range(20)])
    texts = [item["content"][0]["text"] for item in await conversations.items(conversation.id)]
    assert len(texts) == 40
    # Each turn's items are adjacent and in order: a turn is appended whole.
    pairs = [(texts[i], texts[i + 1]) for i in range(0, 40, 2)]
    assert sorted(pairs) == sorted((f"q{n}", f"a{n}") for n in range(20))

"""Tenancy in the state layer, on every store backend: a tenant's responses, background runs
and their event logs, and conversations are invisible to every other tenant, whatever id it
names, and a replica's cache of finished turns does not leak them either."""

from __future__ import annotations

import pytest

from serve_app.api.errors import APIError
from serve_app.api.items import MessageItem
from serve_app.state.conversations import ConversationStore
from serve_app.state.responses import ResponseStore, TurnCache
from serve_app.state.runs import RunStore
from serve_app.state.tenancy import TenantStore, tenant_prefix
from tests.state.test_state_responses import _response

pytestmark = pytest.mark.anyio


async def test_responses_are_the_tenants_own(store):
    cache = TurnCache(1 << 20)  # one replica's, shared by its tenants
    a, b = ResponseStore(store, "team-a", cache=cache), ResponseStore(store, "team-b", cache=cache)
    first = _response("A's")
    await a.save(first, [MessageItem(role="user", content="A's")])
    second = _response("more", first.id)
    await a.save(second, [MessageItem(role="user", content="more")])
    assert (await a.get(first.id)) is not None
    assert len(await a.history(second.id)) == 4
    assert await b.get(first.id) is None
    assert await b.chain(second.id) is None
    assert await b.input_items(second.id) is None
    with pytest.raises(APIError) as error:
        await b.history(second.id)
    assert error.value.code == "previous_response_not_found"
    assert await b.delete(first.id) is False
    assert (await a.get(first.id)) is not None  # untouched


async def test_background_runs_and_their_logs_are_the_tenants_own(store):
    a, b = RunStore(store, "team-a", ttl_s=60), RunStore(store, "team-b", ttl_s=60)
    await a.create("resp_1", owner="replica")
    assert await a.append("resp_1", [b"event 0"], at=0)
    assert await b.get("resp_1") is None
    assert await b.events("resp_1", 0) == []
    assert await b.length("resp_1") == 0
    assert await b.request_cancel("resp_1") is None
    assert await b.open_runs() == []
    assert await a.open_runs() == ["resp_1"]
    await b.create("resp_1", owner="elsewhere")  # the same id is another run in another tenant
    assert not await b.append("resp_1", [b"forged"], at=1)
    await b.delete("resp_1")
    record = await a.get("resp_1")
    assert record is not None
    assert not record.cancel
    assert await a.events("resp_1", 0) == [b"event 0"]


async def test_conversations_are_the_tenants_own(store):
    a, b = ConversationStore(store, "team-a", ttl_s=60), ConversationStore(store, "team-b", ttl_s=60)
    conversation = await a.create({"k": "v"}, [MessageItem(role="user", content="A's")])
    assert await b.get(conversation.id) is None
    assert await b.items(conversation.id) == []
    assert await b.update(conversation.id, {"owner": "b"}) is None
    assert await b.delete(conversation.id) is False
    (item,) = await a.items(conversation.id)
    assert await b.delete_item(conversation.id, item["id"]) is False
    assert await a.get(conversation.id) == conversation
    assert await a.items(conversation.id) == [item]


@pytest.mark.parametrize("crafted", ["../team-a:response:x", "t:team-a:response:x", "x\nt:team-a:", ":" * 10, ""])
async def test_no_key_a_client_writes_leaves_its_tenants_namespace(crafted):
    from serve_app.state import MemoryStore

    inner = MemoryStore()
    b = TenantStore(inner, "team-b")
    await b.put(crafted, b"x", ttl_s=60)
    assert all(key.startswith(tenant_prefix("team-b")) for key in inner._entries)
    with pytest.raises(ValueError, match="not a tenant name: 'team-a:evil'"):
        tenant_prefix("team-a:evil")

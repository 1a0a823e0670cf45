"""The Responses service over a store (serve_app/state/responses.py) and MemoryStore's bounds."""

from __future__ import annotations

import pytest
from openai.types.responses import Response, ResponseItem
from pydantic import TypeAdapter

from serve_app.protocol.errors import APIError
from serve_app.protocol.request import MessageItem, ResponsesRequest
from serve_app.protocol.stream import ResponseStream
from serve_app.protocol.harmony import HarmonyModel
from serve_app.protocol.tokens import TokenBatch
from serve_app.state import MemoryStore, ResponseStore
from serve_app.state.responses import response_key

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _response(text: str, previous: str | None = None) -> Response:
    """A finished response from the real stream state machine (the replay's echo of `text`)."""
    from openai_harmony import Message, Role

    from serve_app.protocol.harmony import render_completion

    request = ResponsesRequest(model="m", input=text, previous_response_id=previous)
    model = HarmonyModel()
    stream = ResponseStream(request, parser_factory=lambda sink: model.parser(sink, []))
    stream.start()
    completion = render_completion([Message.from_role_and_content(Role.ASSISTANT, f"echo {text}").with_channel("final")])
    stream.feed(TokenBatch(completion, finish_reason="stop"))
    assert stream.finished and stream.response.status == "completed"
    return stream.response


async def _chain(responses: ResponseStore, n: int) -> list[Response]:
    chain: list[Response] = []
    for i in range(n):
        response = _response(f"turn {i}", chain[-1].id if chain else None)
        await responses.save(response, [MessageItem(role="user", content=f"turn {i}")])
        chain.append(response)
    return chain


async def test_history_walks_the_chain_in_order():
    responses = ResponseStore(MemoryStore())
    chain = await _chain(responses, 3)
    history = await responses.history(chain[-1].id)
    texts = [(item.role, item.text) for item in history]
    assert texts == [
        ("user", "turn 0"), ("assistant", "echo turn 0"),
        ("user", "turn 1"), ("assistant", "echo turn 1"),
        ("user", "turn 2"), ("assistant", "echo turn 2"),
    ]


async def test_each_turn_is_stored_once():
    """A turn's record holds its own input, not the history: constant size along a chain."""
    store = MemoryStore()
    responses = ResponseStore(store)
    chain = await _chain(responses, 12)
    sizes = [len(await store.get(response_key(r.id))) for r in chain]
    assert max(sizes) - min(sizes) < 200  # ids and texts differ by a few characters only


async def test_a_hole_in_the_chain_is_not_a_shorter_history():
    responses = ResponseStore(MemoryStore())
    chain = await _chain(responses, 3)
    assert await responses.delete(chain[1].id)
    with pytest.raises(APIError) as error:
        await responses.history(chain[2].id)
    assert error.value.status_code == 400 and error.value.code == "previous_response_not_found"
    assert await responses.input_items(chain[2].id) is None
    assert (await responses.get(chain[2].id)).response == chain[2]


async def test_unknown_previous_response_is_a_400():
    responses = ResponseStore(MemoryStore())
    with pytest.raises(APIError) as error:
        await responses.history("resp_missing")
    assert error.value.param == "previous_response_id"


async def test_input_items_are_the_sdk_items_the_model_saw():
    responses = ResponseStore(MemoryStore())
    chain = await _chain(responses, 2)
    items = await responses.input_items(chain[1].id)
    adapter = TypeAdapter(ResponseItem)
    for item in items:  # each validates as the SDK's ResponseItem, with an id
        assert adapter.validate_python(item.model_dump()).id
    assert [item.type for item in items] == ["message", "message", "message"]
    assert [item.role for item in items] == ["user", "assistant", "user"]
    assert items[1].id == chain[0].output[0].id
    assert items[2].content[0].text == "turn 1"
    assert len({item.id for item in items}) == 3


async def test_reading_a_chain_keeps_it_alive():
    now = [0.0]
    store = MemoryStore(clock=lambda: now[0])
    responses = ResponseStore(store, ttl_s=100)
    chain = await _chain(responses, 2)
    now[0] = 90
    await responses.history(chain[1].id)  # refreshes both records
    now[0] = 150
    assert len(await responses.history(chain[1].id)) == 4
    now[0] = 300
    assert await responses.get(chain[0].id) is None


# -- MemoryStore bounds (the embedded store's replica holds one) -------------------------------


async def test_memory_store_drops_the_oldest_past_max_entries():
    store = MemoryStore(max_entries=3)
    for key in "abcd":
        await store.put(key, b"x", ttl_s=60)
    assert [await store.get(k) for k in "abcd"] == [None, b"x", b"x", b"x"]
    await store.expire(["b"], 60)  # refreshed: now the newest
    await store.put("e", b"x", ttl_s=60)
    assert await store.get("b") == b"x" and await store.get("c") is None


async def test_memory_store_drops_the_oldest_past_max_bytes():
    store = MemoryStore(max_bytes=100)
    await store.put("a", b"x" * 40, ttl_s=60)
    await store.put("b", b"x" * 40, ttl_s=60)
    await store.append("c", [b"x" * 10, b"x" * 10], ttl_s=60)
    assert await store.get("a") is None and await store.get("b") is not None
    assert store.stats()["bytes"] <= 100
    await store.put("huge", b"x" * 500, ttl_s=60)  # larger than the budget: not kept
    assert await store.get("huge") is None and store.stats()["bytes"] <= 100


async def test_memory_store_expiry_frees_space():
    now = [0.0]
    store = MemoryStore(clock=lambda: now[0])
    await store.put("a", b"x" * 10, ttl_s=5)
    await store.append("l", [b"y"], ttl_s=5)
    now[0] = 6
    await store.put("b", b"z", ttl_s=5)
    assert store.stats()["entries"] == 1

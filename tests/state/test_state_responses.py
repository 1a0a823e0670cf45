"""The Responses service over a store (serve_app/state/responses.py) and MemoryStore's bounds."""

from __future__ import annotations

import pytest
from openai.types.responses import Response, ResponseItem
from pydantic import TypeAdapter

from serve_app.api.errors import APIError
from serve_app.api.items import MessageItem
from serve_app.api.request import ResponsesRequest
from serve_app.core.stream import ResponseStream
from serve_app.core.tokens import TokenBatch
from serve_app.families.harmony import HarmonyModel
from serve_app.state import MemoryStore, ResponseStore
from serve_app.state.responses import TurnCache, response_key

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _response(text: str, previous: str | None = None) -> Response:
    """A finished response from the real stream state machine (the replay's echo of `text`)."""
    from openai_harmony import Message, Role

    from serve_app.families.harmony import render_completion

    request = ResponsesRequest(model="m", input=text, previous_response_id=previous)
    model = HarmonyModel()
    stream = ResponseStream(request, parser_factory=lambda sink: model.parser(sink, []))
    stream.start()
    completion = render_completion([Message.from_role_and_content(Role.ASSISTANT, f"echo {text}").with_channel("final")])
    stream.feed(TokenBatch(completion, finish_reason="stop"))
    assert stream.finished
    assert stream.response.status == "completed"
    return stream.response


async def _chain(responses: ResponseStore, n: int) -> list[Response]:
    chain: list[Response] = []
    for i in range(n):
        response = _response(f"turn {i}", chain[-1].id if chain else None)
        await responses.save(response, [MessageItem(role="user", content=f"turn {i}")])
        chain.append(response)
    return chain


async def test_history_walks_the_chain_in_order():
    responses = ResponseStore(MemoryStore(), "t")
    chain = await _chain(responses, 3)
    history = await responses.history(chain[-1].id)
    texts = [(item.role, item.text) for item in history]
    assert texts == [
        ("user", "turn 0"),
        ("assistant", "echo turn 0"),
        ("user", "turn 1"),
        ("assistant", "echo turn 1"),
        ("user", "turn 2"),
        ("assistant", "echo turn 2"),
    ]


async def test_each_turn_is_stored_once():
    """A turn's record holds its own input, not the history: constant size along a chain."""
    store = MemoryStore()
    responses = ResponseStore(store, "t")
    chain = await _chain(responses, 12)
    sizes = [len(await responses.store.get(response_key(r.id))) for r in chain]
    assert max(sizes) - min(sizes) < 200  # ids and texts differ by a few characters only


async def test_a_hole_in_the_chain_is_not_a_shorter_history():
    responses = ResponseStore(MemoryStore(), "t")
    chain = await _chain(responses, 3)
    assert await responses.delete(chain[1].id)
    with pytest.raises(APIError) as error:
        await responses.history(chain[2].id)
    assert error.value.status_code == 400
    assert error.value.code == "previous_response_not_found"
    assert await responses.input_items(chain[2].id) is None
    assert (await responses.get(chain[2].id)).response == chain[2]


async def test_unknown_previous_response_is_a_400():
    responses = ResponseStore(MemoryStore(), "t")
    with pytest.raises(APIError) as error:
        await responses.history("resp_missing")
    assert error.value.param == "previous_response_id"


async def test_input_items_are_the_sdk_items_the_model_saw():
    responses = ResponseStore(MemoryStore(), "t")
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
    responses = ResponseStore(store, "t", ttl_s=100)
    chain = await _chain(responses, 2)
    now[0] = 90
    await responses.history(chain[1].id)  # refreshes both records
    now[0] = 150
    assert len(await responses.history(chain[1].id)) == 4
    now[0] = 300
    assert await responses.get(chain[0].id) is None


# -- TurnCache: a replica's finished turns ---------------------------------------------------


class CountingStore(MemoryStore):
    """The in-memory store, counting the reads that reach it."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.gets = 0

    async def get(self, key: str) -> bytes | None:
        self.gets += 1
        return await super().get(key)


async def test_a_cached_chain_costs_a_store_read_per_new_turn_not_per_turn():
    store = CountingStore()
    writer = ResponseStore(store, "t", cache=TurnCache(1 << 20))  # the replica that made the turns
    reader = ResponseStore(store, "t", cache=TurnCache(1 << 20))  # another one
    uncached = ResponseStore(store, "t")
    chain = await _chain(writer, 10)
    for responses, reads in ((writer, 0), (reader, 10), (reader, 0), (uncached, 10)):
        store.gets = 0
        assert len(await responses.history(chain[-1].id)) == 20
        assert store.gets == reads
    # The next turn, made elsewhere: one read for it, the rest from the cache.
    await uncached.save(nxt := _response("turn 10", chain[-1].id), [MessageItem(role="user", content="turn 10")])
    store.gets = 0
    assert len(await reader.history(nxt.id)) == 22
    assert store.gets == 1


async def test_a_turn_deleted_or_expired_elsewhere_breaks_a_cached_chain():
    now = [0.0]
    store = MemoryStore(clock=lambda: now[0])
    other, mine = ResponseStore(store, "t", ttl_s=100), ResponseStore(store, "t", ttl_s=100, cache=TurnCache(1 << 20))
    chain = await _chain(other, 3)
    assert len(await mine.history(chain[2].id)) == 6  # all three cached here now
    assert await other.delete(chain[1].id)
    with pytest.raises(APIError) as error:
        await mine.history(chain[2].id)
    assert error.value.code == "previous_response_not_found"
    assert await mine.get(chain[1].id) is None  # a GET reads the store
    fresh = await _chain(other, 2)
    assert len(await mine.history(fresh[1].id)) == 4
    now[0] = 500  # both expired in the store, still in the cache
    with pytest.raises(APIError):
        await mine.history(fresh[1].id)


async def test_only_finished_turns_are_cached():
    """A background response is stored while it runs and again when it ends."""
    responses = ResponseStore(MemoryStore(), "t", cache=TurnCache(1 << 20))
    done = _response("done")
    running = done.model_copy(update={"status": "in_progress"})
    await responses.save(running, [MessageItem(role="user", content="run")])
    with pytest.raises(APIError, match="has not finished yet"):
        await responses.history(running.id)
    await responses.save(done, [MessageItem(role="user", content="run")])
    assert len(await responses.history(done.id)) == 2


async def test_the_cache_is_bounded_by_the_records_bytes():
    store = MemoryStore()
    record = len((await ResponseStore(store, "t").save(_response("x"), [MessageItem(role="user", content="x")])).encode())
    cache = TurnCache(3 * record + record // 2)
    responses = ResponseStore(store, "t", cache=cache)
    chain = await _chain(responses, 8)
    assert len(cache) == 3
    assert len(await responses.history(chain[-1].id)) == 16  # the rest read from the store


# -- MemoryStore bounds (the embedded store's replica holds one) -------------------------------


async def test_memory_store_drops_the_oldest_past_max_entries():
    store = MemoryStore(max_entries=3)
    for key in "abcd":
        await store.put(key, b"x", ttl_s=60)
    assert [await store.get(k) for k in "abcd"] == [None, b"x", b"x", b"x"]
    await store.expire(["b"], 60)  # refreshed: now the newest
    await store.put("e", b"x", ttl_s=60)
    assert await store.get("b") == b"x"
    assert await store.get("c") is None


async def test_memory_store_drops_the_oldest_past_max_bytes():
    store = MemoryStore(max_bytes=100)
    await store.put("a", b"x" * 40, ttl_s=60)
    await store.put("b", b"x" * 40, ttl_s=60)
    await store.append("c", [b"x" * 10, b"x" * 10], ttl_s=60)
    assert await store.get("a") is None
    assert await store.get("b") is not None
    assert store.stats()["bytes"] <= 100
    await store.put("huge", b"x" * 500, ttl_s=60)  # larger than the budget: not kept
    assert await store.get("huge") is None
    assert store.stats()["bytes"] <= 100


async def test_memory_store_expiry_frees_space():
    now = [0.0]
    store = MemoryStore(clock=lambda: now[0])
    await store.put("a", b"x" * 10, ttl_s=5)
    await store.append("l", [b"y"], ttl_s=5)
    now[0] = 6
    await store.put("b", b"z", ttl_s=5)
    assert store.stats()["entries"] == 1

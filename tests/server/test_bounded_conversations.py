"""Bounded conversations (issue 40, item 4). With `truncation: "auto"` a conversation could
grow without end while each turn was charged only its truncated prompt, and every turn,
`input_tokens` call and `items?limit=1` page decoded every stored item on the event loop
(10,000 items a turn: turns of 8-23 s, loop pauses of 5-11 s). Now a conversation holds at
most `store.conversation_max_items` items and `..._max_bytes` bytes (a 400 past them, by
the items endpoint and by a turn), a page decodes its page, and a truncated turn reads its
newest items until they pass the context. Decodes are counted, not timed: every JSON decode
of the conversations module is."""

from __future__ import annotations

import json
import threading
import types
import uuid
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter

from serve_app.api.conversations import ItemsCreate
from serve_app.api.items import StoredInputItem
from serve_app.api.request import ResponsesRequest
from serve_app.engines.replay import ReplayBackend
from serve_app.families.truncation import fit_to_context, output_reserve
from serve_app.runtime.compaction import KEEP_USER_CHARS, open_compactions, sealed_item
from serve_app.runtime.run import FIRST_SLICE, render_turn
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.server.auth import ANONYMOUS
from serve_app.server.context import app_context
from serve_app.state import MemoryStore, Store
from serve_app.state import conversations as conversation_state
from serve_app.state.conversations import ConversationLimits, ConversationStore
from serve_app.state.redis import RedisStore

pytestmark = pytest.mark.slow  # seconds each (slow uploads, large conversations): make test runs them, test-fast not

MODEL = "gpt-oss-replay"
CONTEXT = 4096
LARGE = 4001  # items of the large conversation (a developer message, 1000 turns): ~10x what fits in CONTEXT


ITEMS = TypeAdapter(list[StoredInputItem])


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(params=["memory", "redis"])
async def store(request) -> Store:
    if request.param == "memory":
        backend: Store = MemoryStore(max_entries=100_000, max_bytes=1 << 30)
    else:
        server = request.getfixturevalue("redis_server")
        backend = RedisStore(server.url, password=server.password, key_prefix=f"test-{uuid.uuid4().hex}:")
    yield backend
    await backend.close()


class DecodeCounter:
    """The conversations module's `json`, counting `loads`: every decode of a stored item
    (and of a tool text) there goes through it, on this branch as before it."""

    def __init__(self) -> None:
        self.loads = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> DecodeCounter:
        counting = types.SimpleNamespace(**{name: getattr(json, name) for name in ("dumps", "JSONDecodeError")})

        def loads(data: Any, **kwargs: Any) -> Any:
            self.loads += 1
            return json.loads(data, **kwargs)

        counting.loads = loads
        monkeypatch.setattr(conversation_state, "json", counting)
        return self


def make_app(store: Store, limits: ConversationLimits | None = None):
    settings = ServerSettings(conversation_limits=limits or ConversationLimits())
    return create_app([ServedModel(MODEL, ReplayBackend(), max_model_len=CONTEXT)], settings, store=store)


def client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60)


def turn_items(turn: int) -> list[dict[str, Any]]:
    """Four items of an agent's turn: a request, a function call and its output, the answer."""
    call_id = f"call_{turn}"
    return [
        {"type": "message", "role": "user", "content": f"question {turn}"},
        {"type": "function_call", "call_id": call_id, "name": "lookup", "arguments": json.dumps({"n": turn})},
        {"type": "function_call_output", "call_id": call_id, "output": f"result {turn}"},
        {"type": "message", "role": "assistant", "content": f"answer {turn}"},
    ]


async def large_conversation(app, items: int = LARGE) -> tuple[ConversationStore, str]:
    """A conversation of `items` items: a developer message, agent turns, and assistant
    messages to make up the count; seeded in the store directly (the items endpoint takes
    20 a call)."""
    conversations = app_context(app).tenants[ANONYMOUS].conversations
    opening = ItemsCreate.model_validate({"items": [{"type": "message", "role": "developer", "content": "Be brief."}]}).items
    conversation = await conversations.create(None, list(opening))
    batch: list[dict[str, Any]] = []
    for turn in range((items - 1) // 4):
        batch += turn_items(turn)
    batch += [{"type": "message", "role": "assistant", "content": f"more {n}"} for n in range(items - 1 - len(batch))]
    for start in range(0, len(batch), 500):
        await conversations.append(conversation.id, ITEMS.validate_python(batch[start : start + 500]))
    assert await conversations.length(conversation.id) == items
    return conversations, conversation.id


# -- the bound --


@pytest.mark.anyio
async def test_the_items_endpoint_refuses_items_past_the_bound(store):
    app = make_app(store, ConversationLimits(max_items=50, max_bytes=1 << 20))
    async with client(app) as http:
        conversation = (await http.post("/v1/conversations", json={})).json()["id"]
        twenty = {"items": [{"type": "message", "role": "user", "content": f"m{i}"} for i in range(20)]}
        for _ in range(2):
            assert (await http.post(f"/v1/conversations/{conversation}/items", json=twenty)).status_code == 200
        refused = await http.post(f"/v1/conversations/{conversation}/items", json=twenty)
        error = refused.json()["error"]
        assert (refused.status_code, error["code"], error["param"], error["type"]) == (
            400,
            "conversation_too_large",
            "items",
            "invalid_request_error",
        )
        assert "50 items" in error["message"]
        assert "new conversation" in error["message"]
        assert "/v1/responses/compact" in error["message"]
        listed = (await http.get(f"/v1/conversations/{conversation}/items", params={"limit": 100})).json()["data"]
        assert len(listed) == 40  # nothing of the refused call was appended
        ten = {"items": twenty["items"][:10]}
        assert (await http.post(f"/v1/conversations/{conversation}/items", json=ten)).status_code == 200  # up to the bound
        assert (await http.post(f"/v1/conversations/{conversation}/items", json={"items": ten["items"][:1]})).status_code == 400
        # Deleting an item gives its room back.
        first = listed[-1]["id"]
        assert (await http.delete(f"/v1/conversations/{conversation}/items/{first}")).status_code == 200
        assert (await http.post(f"/v1/conversations/{conversation}/items", json={"items": ten["items"][:1]})).status_code == 200


@pytest.mark.anyio
async def test_the_byte_bound_holds_too(store):
    app = make_app(store, ConversationLimits(max_items=1000, max_bytes=64 * 1024))
    async with client(app) as http:
        conversation = (await http.post("/v1/conversations", json={})).json()["id"]
        big = {"items": [{"type": "message", "role": "user", "content": "x" * 20_000}]}
        codes = [(await http.post(f"/v1/conversations/{conversation}/items", json=big)).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 400]
        created = await http.post("/v1/conversations", json={"items": [big["items"][0]] * 4})
        assert (created.status_code, created.json()["error"]["code"]) == (400, "conversation_too_large")


@pytest.mark.anyio
async def test_a_turn_on_a_conversation_at_its_bound_is_a_400_before_it_generates(store):
    app = make_app(store, ConversationLimits(max_items=6, max_bytes=1 << 20))
    async with client(app) as http:
        conversation = (await http.post("/v1/conversations", json={})).json()["id"]
        body = {"model": MODEL, "input": "hello", "conversation": conversation, "truncation": "auto"}
        first = await http.post("/v1/responses", json=body)  # 1 input + reasoning + message
        assert first.status_code == 200
        second = await http.post("/v1/responses", json=body)  # let in at 3: lands at 6
        assert second.status_code == 200
        refused = await http.post("/v1/responses", json=body)
        error = refused.json()["error"]
        assert (refused.status_code, error["code"], error["param"]) == (400, "conversation_too_large", "conversation")
        items = (await http.get(f"/v1/conversations/{conversation}/items", params={"limit": 100})).json()["data"]
        assert len(items) == 6  # the refused turn appended nothing
        streamed = await http.post("/v1/responses", json={**body, "stream": True})
        assert (streamed.status_code, streamed.json()["error"]["code"]) == (400, "conversation_too_large")


@pytest.mark.anyio
async def test_a_conversation_stored_before_its_size_was_kept_is_measured_once(store):
    """Compatibility: items without a size key (stored by an older version) are counted from
    their records' lengths, none decoded, and then the bound holds."""
    app = make_app(store, ConversationLimits(max_items=30, max_bytes=1 << 20))
    conversations = app_context(app).tenants[ANONYMOUS].conversations
    conversation = await conversations.create(None, [])
    items = list(ItemsCreate.model_validate({"items": [{"type": "message", "role": "user", "content": "old"}] * 20}).items)
    await conversations.append(conversation.id, items)
    await conversations.store.delete(conversation_state.size_key(conversation.id))  # as an older version left it
    assert await conversations.size(conversation.id) == (20, sum(len(conversation_state.item_record(i)) for i in items))
    async with client(app) as http:
        twenty = {"items": [{"type": "message", "role": "user", "content": "new"}] * 20}
        assert (await http.post(f"/v1/conversations/{conversation.id}/items", json=twenty)).status_code == 400
        assert (await http.post(f"/v1/conversations/{conversation.id}/items", json={"items": twenty["items"][:10]})).status_code == 200


# -- reads that decode what they return --


@pytest.mark.anyio
async def test_a_page_of_a_large_conversation_decodes_its_page(store, monkeypatch):
    app = make_app(store)
    _, conversation = await large_conversation(app)
    decodes = DecodeCounter().install(monkeypatch)
    async with client(app) as http:
        newest = (await http.get(f"/v1/conversations/{conversation}/items", params={"limit": 1})).json()
        assert (len(newest["data"]), newest["has_more"], newest["data"][0]["content"][0]["text"]) == (1, True, "answer 999")
        assert decodes.loads <= 2
        oldest = (await http.get(f"/v1/conversations/{conversation}/items", params={"limit": 1, "order": "asc"})).json()
        assert oldest["data"][0]["content"][0]["text"] == "Be brief."
        assert decodes.loads <= 4
        # `after` finds its item by its id in the raw records: the page and that item are decoded.
        after = newest["data"][0]["id"]
        page = (await http.get(f"/v1/conversations/{conversation}/items", params={"limit": 5, "after": after})).json()
        assert [item["type"] for item in page["data"]] == [
            "function_call_output",
            "function_call",
            "message",
            "message",
            "function_call_output",
        ]
        assert decodes.loads <= 4 + 1 + 5
        retrieved = await http.get(f"/v1/conversations/{conversation}/items/{page['data'][-1]['id']}")
        assert retrieved.json()["output"] == "result 998"
        assert decodes.loads <= 10 + 1


@pytest.mark.anyio
async def test_pages_walk_the_conversation_as_before(store):
    """The paged reads agree with a read of every item, both orders, with `after`."""
    app = make_app(store)
    conversations, conversation = await large_conversation(app, items=301)
    every = await conversations.items(conversation)
    for order, expected in (("asc", every), ("desc", every[::-1])):
        seen: list[dict[str, Any]] = []
        after = None
        while True:
            page = await conversations.page(conversation, after=after, limit=100, order=order)
            assert page is not None
            seen += page.data
            if not page.has_more:
                break
            after = page.data[-1]["id"]
        assert seen == expected
    assert await conversations.page(conversation, after="msg_nowhere", limit=10, order="asc") is None


@pytest.mark.anyio
@pytest.mark.parametrize("size", [LARGE, LARGE + 2], ids=["window-starts-at-a-message", "window-starts-at-an-output"])
async def test_a_truncated_turn_on_a_large_conversation_decodes_what_fits_and_renders_as_if_it_read_all(store, monkeypatch, size):
    """The window read starts at a user message, or (two items more) at a function call's
    output whose call was not read: neither it nor what follows up to the next item that
    may start a prompt is kept, as when every item is read."""
    app = make_app(store)
    conversations, conversation = await large_conversation(app, size)
    model = app_context(app).served[MODEL]
    everything = await conversations.history(conversation)  # before counting: the reference reads all
    body = {"model": MODEL, "input": "what now?", "conversation": conversation, "truncation": "auto", "max_output_tokens": 512}
    request = ResponsesRequest.model_validate(body)
    tenant = app_context(app).tenants[ANONYMOUS]
    rendered = await render_turn(request, model, tenant.responses, conversations, tenant.cipher)
    decodes = DecodeCounter().install(monkeypatch)
    async with client(app) as http:
        counted = await http.post("/v1/responses/input_tokens", json=body)
        assert counted.status_code == 200, counted.text
        read_for_count = decodes.loads
        response = (await http.post("/v1/responses", json=body)).json()
    assert response["status"] == "completed", response
    # The same prompt as truncating the whole conversation.
    history = everything + list(request.input_items())
    budget = CONTEXT - output_reserve(512, CONTEXT)
    reference, dropped = fit_to_context(lambda items: model.family.render_prompt(request, items), history, budget)
    assert counted.json()["input_tokens"] == len(reference)
    assert response["usage"]["input_tokens"] == len(reference)
    assert (rendered.prompt, rendered.truncated_items) == (reference, dropped)  # the items not read count as left out
    # Each item renders as several tokens: what fits in 4096 is a few hundred of the 4001
    # items. Read in doubling slices, newest first: at most twice what fits and the first
    # slice (and the opening instructions, decoded twice), for counting and for the turn.
    kept = len(history) - dropped
    assert kept < size / 8
    assert read_for_count <= 2 * kept + FIRST_SLICE + 3
    assert decodes.loads <= 2 * read_for_count + 8  # and the turn's append returns its 4 items


@pytest.mark.anyio
async def test_a_compaction_in_the_window_ends_the_read(store, monkeypatch):
    """A compaction item stands for everything before it but the user messages it keeps
    (`KEEP_USER_CHARS` of them): once those are read, nothing older is, however short the
    compacted prompt is. The prompt is the one of the whole conversation."""
    app = make_app(store)
    conversations, conversation = await large_conversation(app)
    cipher = app_context(app).tenants[ANONYMOUS].cipher
    long_messages = [{"type": "message", "role": "user", "content": f"{n} " + "word " * 200} for n in range(12)]  # 12,000 characters
    await conversations.append(conversation, ITEMS.validate_python(long_messages))
    await conversations.append(conversation, [sealed_item("Remember: the code is 4417.", KEEP_USER_CHARS, cipher)])
    await conversations.append(conversation, ITEMS.validate_python(turn_items(1000)))
    model = app_context(app).served[MODEL]
    everything = await conversations.history(conversation)
    decodes = DecodeCounter().install(monkeypatch)
    body = {"model": MODEL, "input": "what now?", "conversation": conversation, "truncation": "auto"}
    async with client(app) as http:
        counted = await http.post("/v1/responses/input_tokens", json=body)
    assert counted.status_code == 200, counted.text
    request = ResponsesRequest.model_validate(body)
    history = open_compactions(everything + list(request.input_items()), cipher, 1)
    budget = CONTEXT - output_reserve(None, CONTEXT)
    reference, dropped = fit_to_context(lambda items: model.family.render_prompt(request, items), history, budget)
    assert (counted.json()["input_tokens"], dropped) == (len(reference), 0)  # compacted, it fits
    tenant = app_context(app).tenants[ANONYMOUS]
    monkeypatch.undo()
    rendered = await render_turn(request, model, tenant.responses, conversations, cipher)
    assert (rendered.prompt, rendered.truncated_items) == (reference, 0)
    assert decodes.loads <= FIRST_SLICE + 3  # the newest slice holds the compaction and the messages it keeps


@pytest.mark.anyio
async def test_a_turn_without_truncation_reads_every_item_off_the_event_loop(store, monkeypatch):
    """Without `truncation: "auto"` every item counts (a prompt over the context is a 400):
    read whole, bounded by the conversation's bound, and decoded in a worker thread."""
    app = make_app(store)
    _, conversation = await large_conversation(app)
    threads: list[str] = []
    counter = DecodeCounter().install(monkeypatch)
    counting = conversation_state.json.loads

    def loads(data: Any, **kwargs: Any) -> Any:
        if not data.startswith(b"["):  # an item, not the conversation's size
            threads.append(threading.current_thread().name)
        return counting(data, **kwargs)

    conversation_state.json.loads = loads
    body = {"model": MODEL, "input": "what now?", "conversation": conversation}
    async with client(app) as http:
        counted = await http.post("/v1/responses/input_tokens", json=body)
        assert counted.json()["input_tokens"] > CONTEXT  # counted whole
        assert counter.loads == LARGE
        refused = await http.post("/v1/responses", json=body)
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "context_length_exceeded")
    assert counter.loads == 2 * LARGE + 1  # and the turn read the conversation's size
    assert len(threads) == 2 * LARGE
    assert all(name.startswith("responses-serve-request") for name in threads)

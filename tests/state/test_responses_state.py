"""Stateful Responses endpoints in-process (no Ray), on every store backend; and what a
client sees while Redis is down (a real redis-server, stopped and started again)."""

from __future__ import annotations

import os
import signal
import uuid

import anyio
import httpx
import openai
import pytest
from openai import OpenAI

from serve_app.state import MemoryStore, StoreUnavailable
from serve_app.state.redis import RedisStore
from tests.support import stateful_scenarios
from tests.support.contract import parse_sse
from tests.support.redis_server import RedisServer
from tests.support.servers import uvicorn_server


def _app(replay_backend, store=None, timeout_s: float = 2.0):
    from serve_app.server.app import ServedModel, ServerSettings, create_app

    return create_app([ServedModel("gpt-oss-replay", replay_backend)], ServerSettings(store_timeout_s=timeout_s), store=store)


@pytest.fixture(scope="module", params=["memory", "redis"])
def stateful_url(request, replay_backend):
    store = None
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        store = RedisStore(server.url, password=server.password, key_prefix=f"test-{uuid.uuid4().hex}:")
    with uvicorn_server(_app(replay_backend, store)) as url:
        yield url


@pytest.mark.slow
@pytest.mark.parametrize("scenario", stateful_scenarios.SCENARIOS, ids=lambda f: f.__name__)
def test_stateful_scenario(stateful_url, scenario):
    scenario(stateful_url)


@pytest.mark.slow
def test_redis_down_then_back(tmp_path, replay_backend):
    """Redis stops: stateless requests still work, stateful ones get 503 store_unavailable
    (never a hang, never a half-stored response); Redis returns: everything works again."""
    server = RedisServer(tmp_path, password="pw")
    server.start()
    store = RedisStore(server.url, password="pw", key_prefix="down:", timeout_s=1.0)
    try:
        with uvicorn_server(_app(replay_backend, store, timeout_s=1.0)) as url:
            sdk = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30)
            kept = sdk.responses.create(model="gpt-oss-replay", input="before")
            server.stop()

            assert sdk.responses.create(model="gpt-oss-replay", input="stateless", store=False).output_text == "stateless"
            for call in (
                lambda: sdk.responses.retrieve(kept.id),
                lambda: sdk.responses.create(model="gpt-oss-replay", input="more", previous_response_id=kept.id),
                lambda: sdk.responses.create(model="gpt-oss-replay", input="store me"),
                lambda: sdk.responses.delete(kept.id),
                lambda: sdk.responses.input_items.list(kept.id),
            ):
                with pytest.raises(openai.InternalServerError) as error:
                    call()
                assert error.value.status_code == 503
                assert error.value.body["code"] == "store_unavailable"
            # A stream that cannot be stored ends failed, not completed: its id would lead nowhere.
            with httpx.Client(timeout=30) as http:
                wire = parse_sse(http.post(f"{url}/responses", json={"model": "gpt-oss-replay", "input": "s", "stream": True}).content)
            assert wire[-1]["type"] == "response.failed"
            assert "could not be stored" in wire[-1]["response"]["error"]["message"]
            assert [e["sequence_number"] for e in wire] == list(range(len(wire)))
            failed_id = wire[-1]["response"]["id"]

            server.start()  # same port, empty: the old data is gone, the client reconnects
            with pytest.raises(openai.NotFoundError):
                sdk.responses.retrieve(failed_id)
            first = sdk.responses.create(model="gpt-oss-replay", input="after")
            second = sdk.responses.create(model="gpt-oss-replay", input="again", previous_response_id=first.id)
            assert sdk.responses.retrieve(second.id) == second
    finally:
        server.stop()


class ConversationAppendsFail(MemoryStore):
    """The in-memory store, except that appends to a conversation's items fail while `failing`
    (the store going away between a turn's two writes)."""

    failing = False

    async def append(self, key, values, *, ttl_s, expected_length=None):
        if self.failing and ":conversation:" in key:  # a tenant's conversation key: t:<tenant>:conversation:...
            raise StoreUnavailable()
        return await super().append(key, values, ttl_s=ttl_s, expected_length=expected_length)


def test_a_turn_its_conversation_missed_is_failed_and_not_kept(replay_backend):
    """The response is stored, then the append to its conversation fails: the client is told
    `response.failed`, so the response is not kept either: a GET is a 404 and it cannot be
    continued (neither from the store nor from the replica's cache of finished turns)."""
    store = ConversationAppendsFail()
    with uvicorn_server(_app(replay_backend, store)) as url:
        sdk = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30)
        conversation = sdk.conversations.create()
        kept = sdk.responses.create(model="gpt-oss-replay", input="first", conversation=conversation.id)
        store.failing = True
        with httpx.Client(timeout=30) as http:
            body = {"model": "gpt-oss-replay", "input": "second", "stream": True, "conversation": conversation.id}
            wire = parse_sse(http.post(f"{url}/responses", json=body).content)
        assert wire[-1]["type"] == "response.failed"
        assert "could not be stored" in wire[-1]["response"]["error"]["message"]
        store.failing = False
        missed = wire[-1]["response"]["id"]
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(missed)
        with pytest.raises(openai.BadRequestError):  # nothing to continue from
            sdk.responses.create(model="gpt-oss-replay", input="on", previous_response_id=missed)
        assert [item.id for item in sdk.conversations.items.list(conversation.id, order="asc")][-1] == kept.output[-1].id
        assert sdk.responses.retrieve(kept.id).status == "completed"


@pytest.mark.slow
def test_a_stalled_store_is_unavailable_not_a_hang(tmp_path):
    """A Redis that accepts connections but never answers (SIGSTOP): every call ends with
    StoreUnavailable within the timeout; after SIGCONT the same store object works."""
    from serve_app.state import BoundedStore, StoreUnavailable

    server = RedisServer(tmp_path)
    server.start()

    async def scenario() -> None:
        store = BoundedStore(RedisStore(server.url, key_prefix="stall:"), timeout_s=0.5)
        await store.put("k", b"v", ttl_s=60)
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            for call in (store.get("k"), store.put("k", b"w", ttl_s=60), store.append("l", [b"x"], ttl_s=60)):
                with pytest.raises(StoreUnavailable):
                    await call
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        await anyio.sleep(0.2)
        # The writes that were cut off may or may not have happened; each is whole either way.
        assert await store.get("k") in (b"v", b"w")
        assert await store.range("l") in ([], [b"x"])
        await store.put("k", b"z", ttl_s=60)
        assert await store.get("k") == b"z"
        await store.close()

    try:
        anyio.run(scenario)
    finally:
        server.stop()

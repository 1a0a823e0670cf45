"""Background responses and conversations with the official `openai` SDK (and raw HTTP where
the wire matters), shared by the in-process suite and the Serve suite with 2 ingress
replicas: the same assertions whichever stack serves the app."""

from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest

from tests.support import servers
from tests.support.contract import check_stream, parse_sse
from tests.support.sdk_scenarios import client

REPLICA_HEADER = "x-responses-serve-replica"
LONG_TEXT = "A long answer to generate slowly, token after token. " * 20
GUARD_S = 120  # a hang guard for polling loops, not a timing assertion


def wait_until(predicate, what: str):
    """`servers.wait_until` within the hang guard; not getting there fails the test."""
    value = servers.wait_until(predicate, GUARD_S)
    assert value, f"gave up waiting for {what}"
    return value


def status_code(call) -> int:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    return info.value.status_code


# -- background ---------------------------------------------------------------------------------


def background_poll(base_url: str, model: str) -> None:
    sdk = client(base_url)
    created = sdk.responses.create(model=model, input="in the background", background=True)
    assert created.background is True
    assert created.status in ("queued", "in_progress")
    assert created.output == []
    done = wait_until(lambda: (r := sdk.responses.retrieve(created.id)).status not in ("queued", "in_progress") and r, "completion")
    assert done.status == "completed"
    assert done.output_text == "in the background"
    assert done.background is True
    assert [item.content[0].text for item in sdk.responses.input_items.list(created.id)] == ["in the background"]
    # Cancelling a finished background response changes nothing and says so (idempotent).
    assert sdk.responses.cancel(created.id).status == "completed"
    # The whole event log replays, with the SDK's own stream reader, from any sequence number.
    events = list(sdk.responses.retrieve(created.id, stream=True))
    terminal = check_stream(events)
    assert terminal.output_text == "in the background"
    tail = list(sdk.responses.retrieve(created.id, stream=True, starting_after=3))
    assert [e.sequence_number for e in tail] == list(range(4, len(events)))
    with sdk.responses.stream(response_id=created.id, starting_after=len(events) - 2) as stream:
        assert [e.type for e in stream] == ["response.completed"]
        assert stream.get_final_response().output_text == "in the background"


def background_cancel(base_url: str, slow_model: str) -> str:
    """Cancel while it runs; returns the response id."""
    sdk = client(base_url)
    created = sdk.responses.create(model=slow_model, input=LONG_TEXT, background=True)
    # wait for the first text delta: generation is under way
    with (
        httpx.Client(timeout=60) as http,
        http.stream("GET", f"{base_url}/responses/{created.id}", params={"stream": "true"}) as stream,
    ):
        for line in stream.iter_lines():
            if line == "event: response.output_text.delta":
                break
    cancelled = sdk.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    assert cancelled.id == created.id
    assert len(cancelled.output_text) < len(LONG_TEXT)  # stopped part-way
    assert sdk.responses.cancel(created.id).status == "cancelled"  # idempotent
    assert sdk.responses.retrieve(created.id).status == "cancelled"
    # Its event log ends where the run stopped: no terminal event (the API has none for a
    # cancellation), an unbroken sequence up to there.
    events = parse_sse(httpx.get(f"{base_url}/responses/{created.id}", params={"stream": "true"}, timeout=60).content)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    assert not {"response.completed", "response.failed", "response.incomplete"} & {e["type"] for e in events}
    return created.id


def background_cancel_at_once(base_url: str, slow_model: str) -> None:
    """Cancel before any output exists (the run has no event to add): `cancelled` at once,
    not `failed` when the lease runs out."""
    sdk = client(base_url)
    created = sdk.responses.create(model=slow_model, input=LONG_TEXT, background=True)
    cancelled = sdk.responses.cancel(created.id)
    assert (cancelled.status, cancelled.error) == ("cancelled", None)
    assert sdk.responses.retrieve(created.id).status == "cancelled"


def background_delete_while_running(base_url: str, slow_model: str) -> str:
    """DELETE a running background response: its generation stops (the caller checks the
    engine), it is gone for GET, cancel and its event stream; returns its id."""
    sdk = client(base_url)
    created = sdk.responses.create(model=slow_model, input=LONG_TEXT, background=True)
    with httpx.Client(timeout=60) as http:
        with http.stream("GET", f"{base_url}/responses/{created.id}", params={"stream": "true"}) as stream:
            for line in stream.iter_lines():  # generation is under way
                if line == "event: response.output_text.delta":
                    break
        deleted = http.delete(f"{base_url}/responses/{created.id}")
        assert deleted.status_code == 200, deleted.text
        assert deleted.json() == {"id": created.id, "object": "response", "deleted": True}
        for call in (
            lambda: sdk.responses.retrieve(created.id),
            lambda: sdk.responses.cancel(created.id),
            lambda: sdk.responses.delete(created.id),
        ):
            with pytest.raises(openai.NotFoundError):
                call()
        events = http.get(f"{base_url}/responses/{created.id}", params={"stream": "true"})
        assert events.status_code == 404, events.text
    return created.id


def background_stream_resume(base_url: str, slow_model: str, cut_after: int = 12, other_replica: bool = False) -> None:
    """Start a background stream, cut it after `cut_after` events, resume with `starting_after`:
    every event once, in order, nothing missing. With `other_replica`, retry until the
    resumed stream was served by another replica than the one running the response."""
    body = {"model": slow_model, "input": LONG_TEXT, "background": True, "stream": True}
    for _ in range(40):
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", f"{base_url}/responses", json=body) as response:
                assert response.status_code == 200, response.read()
                owner = response.headers[REPLICA_HEADER]
                buffer, blocks = b"", []
                for chunk in response.iter_bytes():  # the client goes away after `cut_after` events
                    buffer += chunk
                    # Whole events only; keep-alive comments are not events.
                    blocks = [block for block in buffer.split(b"\n\n")[:-1] if not block.startswith(b":")]
                    if len(blocks) >= cut_after:
                        break
            head = parse_sse(b"\n\n".join(blocks[:cut_after]) + b"\n\n")
            assert [e["sequence_number"] for e in head] == list(range(cut_after))
            response_id = head[0]["response"]["id"]
            resumed = http.get(f"{base_url}/responses/{response_id}", params={"stream": "true", "starting_after": cut_after - 1})
            assert resumed.status_code == 200, resumed.text
        if other_replica and resumed.headers[REPLICA_HEADER] == owner:
            continue
        tail = parse_sse(resumed.content)
        assert tail[0]["sequence_number"] == cut_after
        events = head + tail
        terminal = check_stream(events)  # 0..n without a gap or a repeat, one terminal event
        assert terminal.output_text == LONG_TEXT
        assert terminal.status == "completed"
        return
    pytest.fail("the resumed stream never landed on another replica")


def background_followed_live_on_the_other_replica(base_url: str, slow_model: str) -> None:
    """Start a background response, then follow it from its first event while it runs, on
    another replica than the one running it (followers that land on the runner are dropped
    and asked again): the follower, woken by the store's notification, gets every event once,
    in order, up to the terminal one, whose text is whole."""
    with httpx.Client(timeout=60) as http:
        created = http.post(f"{base_url}/responses", json={"model": slow_model, "input": LONG_TEXT, "background": True})
        assert created.status_code == 200, created.text
        owner, response_id = created.headers[REPLICA_HEADER], created.json()["id"]
        for _ in range(40):
            with http.stream("GET", f"{base_url}/responses/{response_id}", params={"stream": "true"}) as followed:
                assert followed.status_code == 200, followed.read()
                if followed.headers[REPLICA_HEADER] == owner:
                    continue  # the runner's own follower reads its memory: ask again
                events = parse_sse(followed.read())
            assert events[0]["sequence_number"] == 0
            terminal = check_stream(events)  # 0..n without a gap or a repeat, one terminal event
            assert terminal.status == "completed"
            assert terminal.output_text == LONG_TEXT
            return
    pytest.fail("the follower never landed on another replica")


def background_errors(base_url: str, model: str) -> None:
    sdk = client(base_url)
    foreground = sdk.responses.create(model=model, input="not in the background")
    assert status_code(lambda: sdk.responses.cancel(foreground.id)) == 400
    assert status_code(lambda: sdk.responses.cancel("resp_unknown")) == 404
    assert status_code(lambda: sdk.responses.retrieve(foreground.id, stream=True)) == 400
    assert status_code(lambda: sdk.responses.retrieve("resp_unknown", stream=True)) == 404
    assert status_code(lambda: sdk.responses.create(model=model, input="x", background=True, store=False)) == 400
    with httpx.Client(timeout=30) as http:
        bad = http.get(f"{base_url}/responses/{foreground.id}", params={"stream": "true", "starting_after": "x"})
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "starting_after"


# -- conversations ------------------------------------------------------------------------------


def conversations_crud(base_url: str) -> None:
    sdk = client(base_url)
    conversation = sdk.conversations.create(metadata={"topic": "demo"}, items=[{"role": "user", "content": "hello"}])
    assert conversation.id.startswith("conv_")
    assert conversation.metadata == {"topic": "demo"}
    assert sdk.conversations.retrieve(conversation.id) == conversation
    updated = sdk.conversations.update(conversation.id, metadata={"topic": "changed"})
    assert updated.metadata == {"topic": "changed"}
    assert sdk.conversations.retrieve(conversation.id).metadata == {"topic": "changed"}
    deleted = sdk.conversations.delete(conversation.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (conversation.id, True, "conversation.deleted")
    assert status_code(lambda: sdk.conversations.retrieve(conversation.id)) == 404
    assert status_code(lambda: sdk.conversations.delete(conversation.id)) == 404
    assert status_code(lambda: sdk.conversations.update("conv_unknown", metadata={})) == 404
    assert status_code(lambda: sdk.conversations.create(metadata={str(i): "v" for i in range(17)})) == 400


def conversation_items(base_url: str) -> None:
    sdk = client(base_url)
    conversation = sdk.conversations.create()
    added = sdk.conversations.items.create(conversation.id, items=[{"role": "user", "content": f"m{i}"} for i in range(5)])
    ids = [item.id for item in added.data]
    assert len(set(ids)) == 5
    assert added.first_id == ids[0]
    assert added.last_id == ids[-1]
    assert not added.has_more
    # The SDK follows `has_more`/`last_id` page after page.
    assert [item.id for item in sdk.conversations.items.list(conversation.id, limit=2, order="asc")] == ids
    assert [item.id for item in sdk.conversations.items.list(conversation.id, limit=2)] == ids[::-1]  # desc by default
    page = sdk.conversations.items.list(conversation.id, limit=2, order="asc", after=ids[1])
    assert [item.id for item in page.data] == ids[2:4]
    assert page.has_more
    item = sdk.conversations.items.retrieve(ids[2], conversation_id=conversation.id)
    assert (item.type, item.role, item.content[0].text) == ("message", "user", "m2")
    assert sdk.conversations.items.delete(ids[2], conversation_id=conversation.id).id == conversation.id
    assert [i.id for i in sdk.conversations.items.list(conversation.id, order="asc")] == ids[:2] + ids[3:]
    assert status_code(lambda: sdk.conversations.items.retrieve(ids[2], conversation_id=conversation.id)) == 404
    assert status_code(lambda: sdk.conversations.items.delete(ids[2], conversation_id=conversation.id)) == 404
    assert status_code(lambda: sdk.conversations.items.list("conv_unknown")) == 404
    assert status_code(lambda: sdk.conversations.items.create("conv_unknown", items=[{"role": "user", "content": "x"}])) == 404
    assert status_code(lambda: sdk.conversations.items.list(conversation.id, limit=101)) == 400
    assert status_code(lambda: sdk.conversations.items.list(conversation.id, after="msg_unknown")) == 400
    assert status_code(lambda: sdk.conversations.items.create(conversation.id, items=[{"role": "user", "content": "x"}] * 21)) == 400
    assert status_code(lambda: sdk.conversations.items.create(conversation.id, items=[{"role": "robot", "content": "x"}])) == 400


def responses_in_a_conversation(base_url: str, model: str) -> None:
    sdk = client(base_url)
    conversation = sdk.conversations.create()
    first = sdk.responses.create(model=model, input="first turn", conversation=conversation.id)
    assert first.conversation.id == conversation.id
    assert first.output_text == "first turn"
    second = sdk.responses.create(model=model, input="second turn", conversation={"id": conversation.id})
    assert second.output_text == "second turn"
    alone = sdk.responses.create(model=model, input="second turn")
    assert second.usage.input_tokens > alone.usage.input_tokens  # the model saw the first turn
    items = list(sdk.conversations.items.list(conversation.id, order="asc"))
    assert [item.type for item in items] == ["message", "reasoning", "message"] * 2
    assert [items[0].content[0].text, items[2].content[0].text, items[3].content[0].text] == ["first turn", "first turn", "second turn"]
    assert items[1].id == first.output[0].id
    assert items[5].id == second.output[-1].id
    assert status_code(lambda: sdk.responses.create(model=model, input="x", conversation="conv_unknown")) == 404


def concurrent_turns(base_url: str, model: str, turns: int = 8) -> None:
    """Concurrent turns on one conversation: every turn's items are kept, each turn's together."""
    sdk = client(base_url)
    conversation = sdk.conversations.create()

    def turn(n: int) -> str:
        return sdk.responses.create(model=model, input=f"turn {n}", conversation=conversation.id).output_text

    with concurrent.futures.ThreadPoolExecutor(turns) as pool:
        assert sorted(pool.map(turn, range(turns))) == sorted(f"turn {n}" for n in range(turns))
    items = list(sdk.conversations.items.list(conversation.id, order="asc", limit=100))
    assert len(items) == 3 * turns
    for start in range(0, 3 * turns, 3):  # user message, reasoning, answer: adjacent
        user, reasoning, answer = items[start : start + 3]
        assert (user.role, reasoning.type, answer.role) == ("user", "reasoning", "assistant")
        assert answer.content[0].text == user.content[0].text


def agents_session(base_url: str, model: str) -> None:
    """The Agents SDK's `OpenAIConversationsSession`, unmodified, keeps a Runner's history here."""
    import asyncio

    from agents import Agent, OpenAIConversationsSession, OpenAIResponsesModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    async def main() -> None:
        async_client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        agent = Agent(name="echo", instructions="Answer.", model=OpenAIResponsesModel(model=model, openai_client=async_client))
        session = OpenAIConversationsSession(openai_client=async_client)
        first = await Runner.run(agent, "hello from the agent", session=session)
        assert first.final_output == "hello from the agent"
        second = await Runner.run(agent, "and again", session=session)
        assert second.final_output == "and again"
        items = await session.get_items()
        users = [item["content"] for item in items if item.get("role") == "user"]
        assert [u if isinstance(u, str) else u[0]["text"] for u in users] == ["hello from the agent", "and again"]
        assert len(await session.get_items(limit=2)) == 2
        popped = await session.pop_item()
        assert popped["role"] == "assistant"
        assert len(await session.get_items()) == len(items) - 1
        # The server-managed variant: the Runner passes `conversation` to responses.create.
        conversation = await async_client.conversations.create()
        third = await Runner.run(agent, "server side", conversation_id=conversation.id)
        assert third.final_output == "server side"
        stored = [item async for item in async_client.conversations.items.list(conversation.id, order="asc")]
        assert stored[0].content[0].text == "server side"
        assert stored[-1].content[0].text == "server side"
        await session.clear_session()
        await async_client.close()

    asyncio.run(main())

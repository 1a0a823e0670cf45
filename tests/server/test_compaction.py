"""Compaction: `POST /v1/responses/compact` (the openai SDK's `responses.compact`) and
`context_management` on create. The model writes the summary; it is sealed for the tenant,
opened when sent back, and read in place of what it stands for. The replay models'
summary rule (the conversation's `Remember:` lines) makes the facts a summary kept
checkable: a fact from the first turn is still known after every compaction."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai import OpenAI

from serve_app.config import AuthConfig, ModelConfig
from serve_app.engines import make_backend
from serve_app.engines.replay import ReplayBackend
from serve_app.runtime.models import served_model
from serve_app.server.app import ServedModel, ServerSettings, create_app
from tests.conftest import QWEN3_REPLAY
from tests.support.contract import check_stream, parse_sse
from tests.support.servers import uvicorn_server

FAMILIES = ["gpt-oss-replay", "qwen3-replay"]
KEYS = {"team-a": "sk-compaction-team-a-0123456789", "team-b": "sk-compaction-team-b-0123456789"}
FACT = "Remember: the launch code is 4417-PLUM."
RECALL = "What should you remember?"
CONTEXT = 4096  # the models' context here: a long conversation overflows it without compaction
THRESHOLD = 1500


@pytest.fixture(scope="module")
def base():
    qwen3 = ModelConfig.model_validate({**QWEN3_REPLAY, "max_model_len": CONTEXT})
    models = [ServedModel("gpt-oss-replay", ReplayBackend(), max_model_len=CONTEXT), served_model(qwen3, make_backend(qwen3.backend))]
    auth = AuthConfig.model_validate({"keys": [{"tenant": t, "key_env": f"KEY_{t.upper().replace('-', '_')}"} for t in KEYS]})
    environ = {f"KEY_{t.upper().replace('-', '_')}": key for t, key in KEYS.items()}
    with uvicorn_server(create_app(models, ServerSettings(auth=auth), environ=environ)) as url:
        yield url


def sdk(base: str, tenant: str = "team-a") -> OpenAI:
    return OpenAI(base_url=base, api_key=KEYS[tenant], max_retries=0, timeout=60)


def sent_back(items) -> list[dict]:
    return [item.model_dump(mode="json", exclude_none=True, warnings=False) for item in items]


@pytest.mark.parametrize("model", FAMILIES)
def test_compact_keeps_the_user_messages_and_seals_a_summary_that_carries_the_facts(base, model):
    client = sdk(base)
    first = client.responses.create(model=model, input=f"{FACT}\nAnd some chatter.")
    second = client.responses.create(model=model, input="More chatter, nothing to keep.", previous_response_id=first.id)
    compacted = client.responses.compact(model=model, previous_response_id=second.id)
    assert compacted.object == "response.compaction"
    *messages, item = compacted.output
    assert [m.content[0].text for m in messages] == [f"{FACT}\nAnd some chatter.", "More chatter, nothing to keep."]
    assert (item.type, item.id[:4]) == ("compaction", "cmp_")
    assert "PLUM" not in item.encrypted_content  # sealed, not plaintext
    assert compacted.usage.output_tokens > 0
    assert compacted.usage.total_tokens == compacted.usage.input_tokens + compacted.usage.output_tokens
    recalled = client.responses.create(model=model, input=[*sent_back(compacted.output), {"role": "user", "content": RECALL}])
    assert recalled.output_text == FACT


@pytest.mark.parametrize("model", FAMILIES)
def test_the_summary_stands_for_what_it_summarised(base, model):
    """Sent back with the items it replaced, those items are not read again: the prompt is
    the instructions, the summary, the latest user messages and what follows."""
    client = sdk(base)
    long_answer = "filler " * 400
    history = [{"role": "user", "content": FACT}, {"role": "assistant", "content": long_answer}, {"role": "user", "content": "ok"}]
    compacted = client.responses.compact(model=model, input=history)
    full = client.responses.input_tokens.count(model=model, input=[*history, {"role": "user", "content": "next"}]).input_tokens
    replaced = client.responses.input_tokens.count(
        model=model, input=[*history, *sent_back(compacted.output[-1:]), {"role": "user", "content": "next"}]
    )
    assert replaced.input_tokens < full - 300  # the long answer is gone


def test_a_forged_a_foreign_or_a_reasoning_blob_is_a_400(base):
    model = "gpt-oss-replay"
    mine = sdk(base).responses.compact(model=model, input=FACT).output[-1]
    tampered = {"type": "compaction", "encrypted_content": mine.encrypted_content[:-8] + "AAAAAAA="}
    foreign = {"type": "compaction", "encrypted_content": mine.encrypted_content}
    reasoning = sdk(base).responses.create(model=model, input="hi", include=["reasoning.encrypted_content"], store=False).output[0]
    as_compaction = {"type": "compaction", "encrypted_content": reasoning.encrypted_content}
    for client, item in [(sdk(base), tampered), (sdk(base, "team-b"), foreign), (sdk(base), as_compaction)]:
        with pytest.raises(openai.BadRequestError) as error:
            client.responses.create(model=model, input=[item, {"role": "user", "content": RECALL}])
        assert error.value.body["code"] == "invalid_encrypted_content"
        assert error.value.body["param"] == "input[0].encrypted_content"
        assert "PLUM" not in str(error.value.body)


def test_compact_needs_something_to_compact_and_a_served_model(base):
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {KEYS['team-a']}"}) as http:
        empty = http.post(f"{base}/responses/compact", json={"model": "gpt-oss-replay"})
        assert empty.status_code == 400
        assert "nothing to compact" in empty.json()["error"]["message"]
        unknown = http.post(f"{base}/responses/compact", json={"model": "nope", "input": "hi"})
        assert unknown.status_code == 404
        missing = http.post(f"{base}/responses/compact", json={"model": "gpt-oss-replay", "previous_response_id": "resp_nowhere"})
        assert (missing.status_code, missing.json()["error"]["code"]) == (400, "previous_response_not_found")  # as on create


@pytest.mark.parametrize("model", FAMILIES)
def test_context_management_compacts_inside_the_response_and_streams_it(base, model):
    client = sdk(base)
    first = client.responses.create(model=model, input=f"{FACT}\n" + "a long first turn " * 250)
    management = [{"type": "compaction", "compact_threshold": THRESHOLD}]
    body = {"model": model, "input": "next", "previous_response_id": first.id, "context_management": management, "stream": True}
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {KEYS['team-a']}"}) as http:
        events = parse_sse(http.post(f"{base}/responses", json=body).content)
    terminal = check_stream(events)
    assert [e["type"] for e in events[2:5]] == ["response.output_item.added", "response.compaction.compacting", "response.output_item.done"]
    assert terminal.output[0].type == "compaction"
    assert terminal.output_text == "next"
    assert terminal.usage.input_tokens < THRESHOLD  # the compacted prompt
    recalled = client.responses.create(model=model, input=RECALL, previous_response_id=terminal.id)
    assert recalled.output_text == FACT
    below = client.responses.create(model=model, input="short", context_management=management)
    assert [item.type for item in below.output] == ["reasoning", "message"] if model == "gpt-oss-replay" else ["message"]


@pytest.mark.slow
@pytest.mark.parametrize("model", FAMILIES)
def test_two_hundred_turns_never_fill_the_context_and_keep_the_first_turns_fact(base, model):
    """Each turn adds ~150 tokens to a 4096-token context: without compaction the chain
    overflows it after ~25 turns. With `context_management` every turn succeeds, the prompt
    stays bounded, and turn 1's fact is known at the end."""
    client = sdk(base)
    management = [{"type": "compaction", "compact_threshold": THRESHOLD}]
    previous, compactions, longest = None, 0, 0
    for turn in range(200):
        text = FACT if turn == 0 else f"Turn {turn}: " + "some words that do not matter " * 15
        response = client.responses.create(model=model, input=text, previous_response_id=previous, context_management=management)
        assert response.status == "completed", (turn, response.error)
        compactions += response.output[0].type == "compaction"
        longest = max(longest, response.usage.input_tokens)
        previous = response.id
    assert compactions >= 10
    assert longest < CONTEXT
    assert client.responses.create(model=model, input=RECALL, previous_response_id=previous).output_text == FACT
    codes = []  # the same chain without compaction overflows
    for _ in range(40):
        try:
            previous = client.responses.create(model=model, input="x " * 300, previous_response_id=previous).id
        except openai.BadRequestError as error:
            codes.append(error.body["code"])
            break
    assert codes == ["context_length_exceeded"]


def test_the_agents_sdk_compaction_session_runs_unmodified(base, tmp_path):
    """`OpenAIResponsesCompactionSession` over a SQLite session: after each run it calls
    `responses.compact` (told to every time here) and keeps what it returns; the agent's
    later runs send that back, and the fact of the first run survives. (The session takes
    model names of OpenAI's shape only, `gpt-*` or `o*`: `gpt-oss-replay` is one.)"""
    model = "gpt-oss-replay"
    import asyncio

    from agents import Agent, OpenAIResponsesModel, Runner, SQLiteSession, set_tracing_disabled
    from agents.memory import OpenAIResponsesCompactionSession
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    async def main() -> tuple[str, list]:
        client = AsyncOpenAI(base_url=base, api_key=KEYS["team-a"], max_retries=0)
        agent = Agent(name="keeper", instructions="Answer.", model=OpenAIResponsesModel(model=model, openai_client=client))
        session = OpenAIResponsesCompactionSession(
            "compacted",
            SQLiteSession("compacted", str(tmp_path / "session.db")),
            client=client,
            model=model,
            should_trigger_compaction=lambda context: True,
        )
        await Runner.run(agent, FACT, session=session)
        await Runner.run(agent, "Some chatter in between.", session=session)
        recalled = await Runner.run(agent, RECALL, session=session)
        return recalled.final_output, await session.get_items()

    answer, items = asyncio.run(main())
    assert answer == FACT
    assert any(isinstance(item, dict) and item.get("type") == "compaction" for item in items)

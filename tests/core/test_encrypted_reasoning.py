"""Encrypted reasoning for stateless clients (`store: false`, `include: ["reasoning.encrypted_content"]`).

The apps here record the prompt each request renders, so the tests look at what the model
is given: the reasoning sealed in turn 1 must reach turn 2's prompt (between tool calls of
a turn), and drop out once a final answer came (harmony's rule; the Qwen3 template's own).
"""

from __future__ import annotations

import copy

import pytest
from cryptography.fernet import Fernet, InvalidToken
from fastapi.testclient import TestClient
from openai import OpenAI

from serve_app.core.tokens import GenerationRequest
from serve_app.families.vocab import harmony_encoding
from serve_app.server.app import ServedModel, ServerSettings, create_app
from tests.api.test_bad_input import assert_openai_error
from tests.support import sdk_scenarios

KEY_1, KEY_2 = Fernet.generate_key().decode(), Fernet.generate_key().decode()
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Run a command",
    "strict": False,
    "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}, "required": ["command"]},
}


class Recording:
    """A token source that keeps every engine request it is given (by response id)."""

    def __init__(self, source) -> None:
        self._source = source
        self.requests: dict[str, GenerationRequest] = {}

    def generate(self, request: GenerationRequest):
        self.requests[request.request_id] = request
        return self._source.generate(request)


class App:
    def __init__(self, keys: list[str], models: list[ServedModel]) -> None:
        self.models = {m.name: ServedModel(m.name, Recording(m.source), m.max_model_len, m.family) for m in models}
        self.http = TestClient(create_app(list(self.models.values()), ServerSettings(reasoning_keys=keys)))
        self.sdk = OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=self.http, max_retries=0)

    def prompt(self, model: str, response_id: str) -> str:
        tokens = self.models[model].source.requests[response_id].prompt_token_ids
        family = self.models[model].family
        if hasattr(family, "tokenizer"):
            return family.tokenizer.decode(tokens)
        return harmony_encoding().decode(tokens)


@pytest.fixture(scope="module")
def replay_models():
    from serve_app.server.local import replay_models

    return replay_models()


@pytest.fixture(scope="module")
def app(replay_models) -> App:
    return App([KEY_1], replay_models)


def codex_turn(app: App, model: str, items: list[dict]):
    return app.sdk.responses.create(
        model=model,
        input=items,
        tools=[SHELL],
        store=False,
        include=["reasoning.encrypted_content"],
        reasoning={"effort": "medium", "summary": "auto"},
        parallel_tool_calls=False,
    )


def resent(response) -> list[dict]:
    """A response's output as Codex sends it back: reasoning without its text, sealed only."""
    items = []
    for item in response.output:
        data = item.model_dump(exclude_none=True)
        if item.type == "reasoning":
            data = {"type": "reasoning", "id": item.id, "summary": [], "content": None, "encrypted_content": item.encrypted_content}
        items.append(data)
    return items


@pytest.mark.parametrize("model", sdk_scenarios.REPLAY_MODELS)
def test_codex_turns_keep_the_reasoning_between_tool_calls_and_drop_it_after_the_answer(app, model):
    developer = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]}
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": 'call shell {"command": ["ls"]}'}]}
    turn1 = codex_turn(app, model, [developer, user])
    reasoning, call = turn1.output[0], turn1.output[1]
    assert reasoning.type == "reasoning"
    assert call.type == "function_call"
    thought = reasoning.content[0].text
    assert thought == "Calling shell."
    assert Fernet(KEY_1).decrypt(reasoning.encrypted_content.encode())  # sealed with the configured key
    assert thought not in reasoning.encrypted_content

    output = {"type": "function_call_output", "call_id": call.call_id, "output": "README.md"}
    turn2_input = [developer, user, *resent(turn1), output]
    turn2 = codex_turn(app, model, turn2_input)
    assert turn2.output_text == "Tool shell returned: README.md"
    assert thought in app.prompt(model, turn2.id)  # turn 1's reasoning reached turn 2's prompt

    # Without the sealed reasoning the model would not have seen it: the blob carried it.
    blind = copy.deepcopy(turn2_input)
    blind[2]["encrypted_content"] = None
    assert thought not in app.prompt(model, codex_turn(app, model, blind).id)

    # After a final answer, a new user turn: the earlier reasoning is no longer rendered.
    second_thought = turn2.output[0].content[0].text
    turn3 = codex_turn(app, model, [*turn2_input, *resent(turn2), {"role": "user", "content": "thanks"}])
    assert turn3.output_text == "thanks"
    prompt = app.prompt(model, turn3.id)
    assert thought not in prompt
    assert second_thought not in prompt
    assert "README.md" in prompt  # the conversation itself is all there


def test_keys_rotate_first_encrypts_all_decrypt(replay_models):
    gpt_oss = [m for m in replay_models if m.name == "gpt-oss-replay"]
    old, rotating, new = App([KEY_1], gpt_oss), App([KEY_2, KEY_1], gpt_oss), App([KEY_2], gpt_oss)
    user = {"role": "user", "content": 'call shell {"command": ["pwd"]}'}
    turn1 = codex_turn(old, "gpt-oss-replay", [user])
    call = turn1.output[1]
    turn2_input = [user, *resent(turn1), {"type": "function_call_output", "call_id": call.call_id, "output": "/"}]

    turn2 = codex_turn(rotating, "gpt-oss-replay", turn2_input)  # an old blob still opens
    assert "Calling shell." in rotating.prompt("gpt-oss-replay", turn2.id)
    fresh = turn2.output[0].encrypted_content  # new blobs are sealed with the new key
    assert Fernet(KEY_2).decrypt(fresh.encode())
    with pytest.raises(InvalidToken):
        Fernet(KEY_1).decrypt(fresh.encode())

    response = new.http.post("/v1/responses", json={"model": "gpt-oss-replay", "input": turn2_input, "tools": [SHELL], "store": False})
    error = assert_openai_error(response, 400)  # the old key is gone: its blobs are foreign
    assert (error["param"], error["code"]) == ("input[1].encrypted_content", "invalid_encrypted_content")
    assert "input[1]" in error["message"]
    turn2_input[1]["encrypted_content"] = fresh
    assert codex_turn(new, "gpt-oss-replay", turn2_input).status == "completed"


@pytest.mark.parametrize("stream", [False, True])
def test_tampered_truncated_and_foreign_blobs_are_400(app, stream):
    user = {"role": "user", "content": 'call shell {"command": ["ls"]}'}
    turn1 = codex_turn(app, "gpt-oss-replay", [user])
    blob = turn1.output[0].encrypted_content
    middle = len(blob) // 2
    tampered = blob[:middle] + ("A" if blob[middle] != "A" else "B") + blob[middle + 1 :]
    forged = Fernet(KEY_1).encrypt(b'{"v": 2, "reasoning": "injected"}').decode()  # right key, unknown payload
    for bad in (tampered, blob[:-10], blob[: len(blob) // 3], Fernet(KEY_2).encrypt(b"x").decode(), "", forged, "💥"):
        item = {"type": "reasoning", "id": "rs_1", "summary": [], "content": None, "encrypted_content": bad}
        response = app.http.post("/v1/responses", json={"model": "gpt-oss-replay", "input": [user, item], "stream": stream})
        if bad == "":  # empty is "no blob", like null
            assert response.status_code == 200
            continue
        error = assert_openai_error(response, 400)
        assert (error["param"], error["code"]) == ("input[1].encrypted_content", "invalid_encrypted_content"), bad
        count = app.http.post("/v1/responses/input_tokens", json={"model": "gpt-oss-replay", "input": [user, item]})
        assert assert_openai_error(count, 400)["param"] == "input[1].encrypted_content"


def test_no_blob_unless_included_and_the_store_still_works(app):
    plain = app.sdk.responses.create(model="gpt-oss-replay", input="hello")
    assert plain.output[0].encrypted_content is None
    sealed = app.sdk.responses.create(model="gpt-oss-replay", input="hello", include=["reasoning.encrypted_content"])
    follow = app.sdk.responses.create(model="gpt-oss-replay", input="again", previous_response_id=sealed.id)
    assert follow.output_text == "again"


def test_keys_from_the_environment(monkeypatch):
    from serve_app.core.encrypted_reasoning import ReasoningCipher
    from serve_app.runtime import reasoning_keys as module
    from serve_app.runtime.reasoning_keys import ENV_VAR, reasoning_keys

    warnings: list[str] = []
    monkeypatch.setattr(module.logger, "warning", lambda message, *args: warnings.append(message % args))

    monkeypatch.setenv(ENV_VAR, f" {KEY_2} ,{KEY_1},")
    assert reasoning_keys(fallback="unused") == [KEY_2, KEY_1]  # the first encrypts
    monkeypatch.delenv(ENV_VAR)
    assert reasoning_keys(fallback=KEY_1) == [KEY_1]  # the application's own key, with a warning
    assert ENV_VAR in warnings[0]
    assert "application deployment" in warnings[0]
    assert len(reasoning_keys()) == 1  # in-process: a key of this process
    with pytest.raises(ValueError, match="reasoning key #2 is not a Fernet key"):
        ReasoningCipher([KEY_1, "not-a-key"])  # a bad key fails at start-up, not per request


def test_a_blob_opens_for_the_tenant_it_was_sealed_for_only():
    from serve_app.core.encrypted_reasoning import ReasoningCipher

    cipher = ReasoningCipher([ReasoningCipher.generate_key()])
    a, b, untenanted = cipher.for_tenant("team-a"), cipher.for_tenant("team-b"), cipher.for_tenant(None)
    blob = a.encrypt("A's thoughts")
    assert a.decrypt(blob) == "A's thoughts"
    for other in (b, untenanted):
        with pytest.raises(ValueError, match="not sealed by this server's keys"):
            other.decrypt(blob)
    with pytest.raises(ValueError, match="not sealed by this server's keys"):
        a.decrypt(untenanted.encrypt("no tenant's"))

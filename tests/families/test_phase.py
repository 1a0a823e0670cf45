"""`phase` on assistant messages (Codex carries it and sends it back): accepted on assistant
input messages only, kept with the stored turn, and rendered for harmony on the channel it
names: `commentary` on the commentary channel (a preamble), `final_answer` (or none) on the
final channel, the way gpt-oss wrote them; the output side is the same mapping backwards
(docs/models.md)."""

from __future__ import annotations

import httpx
import pytest

from serve_app.api.items import MessageItem
from serve_app.api.request import ResponsesRequest
from serve_app.families.harmony import HarmonyModel
from serve_app.families.vocab import harmony_encoding


def rendered(items: list[dict]) -> str:
    request = ResponsesRequest.model_validate({"model": "gpt-oss-replay", "input": items})
    tokens = HarmonyModel().render_prompt(request, [item for item in request.input_items() if isinstance(item, MessageItem)])
    return harmony_encoding().decode_utf8(tokens)


def test_each_phase_is_rendered_on_its_channel():
    text = rendered(
        [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "phase": "commentary", "content": "Let me look that up."},
            {"role": "assistant", "phase": "final_answer", "content": "Sunny."},
            {"role": "assistant", "content": "No phase: an answer."},
            {"role": "user", "content": "thanks"},
        ]
    )
    assert "<|start|>assistant<|channel|>commentary<|message|>Let me look that up.<|end|>" in text
    assert "<|start|>assistant<|channel|>final<|message|>Sunny.<|end|>" in text
    assert "<|start|>assistant<|channel|>final<|message|>No phase: an answer.<|end|>" in text


@pytest.mark.parametrize("role", ["user", "system", "developer"])
def test_phase_is_only_for_assistant_messages(inprocess_url, role):
    body = {"model": "gpt-oss-replay", "input": [{"role": role, "content": "x", "phase": "commentary"}]}
    answer = httpx.post(f"{inprocess_url}/responses", json=body, timeout=60)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"].startswith("input[0]")


def test_phase_is_kept_with_the_stored_turn(inprocess_url):
    preamble = {"type": "message", "role": "assistant", "phase": "commentary", "content": "Looking."}
    with httpx.Client(timeout=60) as http:
        first = http.post(
            f"{inprocess_url}/responses", json={"model": "gpt-oss-replay", "input": [{"role": "user", "content": "q"}, preamble]}
        )
        assert first.status_code == 200, first.text
        listed = http.get(f"{inprocess_url}/responses/{first.json()['id']}/input_items", params={"order": "asc"}).json()["data"]
        assert [item.get("phase") for item in listed] == [None, "commentary"]
        (answer,) = [item for item in first.json()["output"] if item["type"] == "message"]
        assert answer["phase"] == "final_answer"
        # Sent back by reference, the answer keeps its phase: rendered on the final channel again.
        again = http.post(
            f"{inprocess_url}/responses",
            json={"model": "gpt-oss-replay", "input": [{"id": answer["id"]}, {"role": "user", "content": "next"}]},
        )
        assert again.status_code == 200, again.text

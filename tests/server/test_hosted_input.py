"""A client that keeps its own history (`store: false`, the Agents SDK) sends server-side
tools' items back: the models read them as the calls and outputs they were, and the
server stores and lists them as the SDK types them."""

from __future__ import annotations

import pytest

from tests.families.test_hosted_items import CALL, LISTING, REQUEST_ITEM
from tests.support.sdk_scenarios import client

USER = {"role": "user", "content": 'call lab.echo {"text": "hi"}'}


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
def test_the_model_reads_an_mcp_calls_output_from_the_history(inprocess_url, model):
    sdk = client(inprocess_url)
    response = sdk.responses.create(model=model, input=[USER, LISTING, CALL], store=False)
    assert response.output_text == "Tool lab.echo returned: hi"
    failed = {**CALL, "output": None, "error": {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": "boom"}]}}
    assert sdk.responses.create(model=model, input=[USER, failed], store=False).output_text == "Tool lab.echo returned: Error: boom"


@pytest.mark.parametrize("model", ["gpt-oss-replay", "qwen3-replay"])
def test_a_denied_approval_is_what_the_model_reads(inprocess_url, model):
    sdk = client(inprocess_url)
    denied = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": False}
    response = sdk.responses.create(model=model, input=[USER, REQUEST_ITEM, denied], store=False)
    assert response.output_text.startswith("Tool lab.echo returned: The user did not approve this call")


def test_stored_hosted_items_are_listed_and_continued(inprocess_url):
    sdk = client(inprocess_url)
    first = sdk.responses.create(model="gpt-oss-replay", input=[USER, LISTING, CALL])
    listed = sdk.responses.input_items.list(first.id, order="asc").data
    assert [item.type for item in listed] == ["message", "mcp_list_tools", "mcp_call"]
    assert listed[2].output == "hi"
    assert listed[1].tools[0].name == "echo"
    second = sdk.responses.create(model="gpt-oss-replay", input="again", previous_response_id=first.id)
    assert second.output_text == "again"
    conversation = sdk.conversations.create(items=[USER, LISTING, CALL])
    third = sdk.responses.create(model="gpt-oss-replay", input=[{**CALL, "id": "mcp_2", "output": "bye"}], conversation=conversation.id)
    assert third.output_text == "Tool lab.echo returned: bye"
    kinds = [item.type for item in sdk.conversations.items.list(conversation.id, order="asc").data]
    assert kinds == ["message", "mcp_list_tools", "mcp_call", "mcp_call", "reasoning", "message"]

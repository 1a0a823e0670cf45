"""The stateful Responses endpoints with the official `openai` SDK: `previous_response_id`,
retrieve, delete, `input_items`. Shared by the in-process suite (each store backend) and the
Serve suite (2 ingress replicas behind Serve's proxy, the embedded store)."""

from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest
from openai import OpenAI

MODEL = "gpt-oss-replay"


def two_turns(sdk: OpenAI, tag: str):
    """A first turn, then a follow-up that continues it through `previous_response_id`."""
    first = sdk.responses.create(model=MODEL, input=f"first {tag}")
    second = sdk.responses.create(model=MODEL, input=f"second {tag}", previous_response_id=first.id)
    assert first.status == second.status == "completed"
    assert second.previous_response_id == first.id
    assert second.output_text == f"second {tag}"
    # The follow-up's prompt is the whole conversation: exactly as long as the same
    # conversation resent by the client in full.
    resent = sdk.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": f"first {tag}"},
            *[item.model_dump() for item in first.output],
            {"role": "user", "content": f"second {tag}"},
        ],
        store=False,
    )
    assert second.usage.input_tokens == resent.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 10
    return first, second


def conversations_from_any_replica(base_url: str, n: int = 20) -> set[str]:
    """n two-turn conversations (4 at a time), each id read back, follow-ups never lost.
    Returns the ids of the responses it created."""
    sdk = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        pairs = list(pool.map(lambda i: two_turns(sdk, f"conversation {i}"), range(n)))
    for first, second in pairs:
        for created in (first, second):
            assert sdk.responses.retrieve(created.id) == created
    return {created.id for pair in pairs for created in pair}


def delete_then_404(base_url: str) -> None:
    sdk = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    first, second = two_turns(sdk, "to delete")
    with httpx.Client(timeout=60) as http:
        deleted = http.delete(f"{base_url}/responses/{first.id}")
    assert deleted.status_code == 200
    assert deleted.json() == {"id": first.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError) as error:
        sdk.responses.retrieve(first.id)
    assert error.value.body["code"] == "not_found"
    with pytest.raises(openai.NotFoundError):
        sdk.responses.delete(first.id)
    # The follow-up is still there, but its history has a hole: no continuing from it.
    assert sdk.responses.retrieve(second.id) == second
    with pytest.raises(openai.BadRequestError) as error:
        sdk.responses.create(model=MODEL, input="third", previous_response_id=second.id)
    assert error.value.body["code"] == "previous_response_not_found"
    sdk.responses.delete(second.id)  # the SDK's call returns None on success
    with pytest.raises(openai.NotFoundError):
        sdk.responses.input_items.list(second.id)


def input_items_paging(base_url: str) -> None:
    sdk = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    first, second = two_turns(sdk, "paging")
    third = sdk.responses.create(
        model=MODEL,
        input=[{"role": "developer", "content": "be brief"}, {"role": "user", "content": "third"}],
        previous_response_id=second.id,
    )
    everything = list(sdk.responses.input_items.list(third.id, order="asc", limit=100))
    texts = [(item.type, getattr(item, "role", None)) for item in everything]
    turn_output = [(item.type, getattr(item, "role", None)) for item in first.output]
    assert texts == [("message", "user"), *turn_output, ("message", "user"), *turn_output, ("message", "developer"), ("message", "user")]
    assert everything[0].content[0].text == "first paging"
    assert everything[-1].content[0].text == "third"
    assert [item.id for item in everything[1 : 1 + len(first.output)]] == [item.id for item in first.output]
    assert len({item.id for item in everything}) == len(everything)
    # Pages of 2, both orders, through the SDK's cursor (`after` = the last id of a page).
    asc_pages = sdk.responses.input_items.list(third.id, order="asc", limit=2)
    assert len(asc_pages.data) == 2
    assert asc_pages.has_more
    assert [item.id for item in asc_pages] == [item.id for item in everything]
    desc = sdk.responses.input_items.list(third.id, limit=3)  # default order: desc
    assert [item.id for item in desc] == [item.id for item in reversed(everything)]
    last_page = sdk.responses.input_items.list(third.id, order="asc", after=everything[-3].id, limit=5)
    assert [item.id for item in last_page.data] == [item.id for item in everything[-2:]]
    assert not last_page.has_more
    with httpx.Client(timeout=60) as http:
        for query, param in [
            ("limit=0", "limit"),
            ("limit=101", "limit"),
            ("limit=x", "limit"),
            ("order=up", "order"),
            ("after=nope", "after"),
        ]:
            bad = http.get(f"{base_url}/responses/{third.id}/input_items?{query}")
            assert bad.status_code == 400, (query, bad.text)
            assert bad.json()["error"]["param"] == param, (query, bad.text)


def not_stored(base_url: str) -> None:
    sdk = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    response = sdk.responses.create(model=MODEL, input="forget me", store=False)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError) as error:
        sdk.responses.create(model=MODEL, input="again", previous_response_id=response.id)
    assert error.value.body["param"] == "previous_response_id"


def streamed_then_continued(base_url: str) -> None:
    """A streamed response is stored before its terminal event: continue from it at once."""
    sdk = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    with sdk.responses.stream(model=MODEL, input="streamed") as stream:
        final = stream.get_final_response()
    stored = sdk.responses.retrieve(final.id)
    assert (stored.status, stored.output_text, stored.usage) == ("completed", "streamed", final.usage)
    assert [item.id for item in stored.output] == [item.id for item in final.output]
    follow = sdk.responses.create(model=MODEL, input="next", previous_response_id=final.id)
    assert follow.status == "completed"


def chain_longer_than_the_context(base_url: str) -> None:
    """A `previous_response_id` chain past the model's 131,072 tokens (o200k: " a" is one
    token): "disabled" refuses it, "auto" drops the oldest turn the store gave back, and the
    stored history stays whole, so later turns keep working."""
    sdk = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    first = sdk.responses.create(model=MODEL, input="first" + " a" * 70_000, max_output_tokens=8)
    second_input = "second" + " b" * 70_000
    with pytest.raises(openai.BadRequestError) as error:
        sdk.responses.create(model=MODEL, input=second_input, previous_response_id=first.id, max_output_tokens=8)
    assert error.value.body["code"] == "context_length_exceeded"
    second = sdk.responses.create(model=MODEL, input=second_input, previous_response_id=first.id, max_output_tokens=8, truncation="auto")
    assert (first.status, second.status, second.truncation) == ("incomplete", "incomplete", "auto")
    assert first.usage.input_tokens - 100 < second.usage.input_tokens < first.usage.input_tokens + 100  # the first turn went
    third = sdk.responses.create(model=MODEL, input="third", previous_response_id=second.id, truncation="auto")
    assert third.output_text == "third"
    assert second.usage.input_tokens < third.usage.input_tokens < second.usage.input_tokens + 100
    kept = list(sdk.responses.input_items.list(third.id, order="asc", limit=100))
    assert kept[0].content[0].text.startswith("first")
    assert kept[-1].content[0].text == "third"


SCENARIOS = [
    conversations_from_any_replica,
    delete_then_404,
    input_items_paging,
    not_stored,
    streamed_then_continued,
    chain_longer_than_the_context,
]

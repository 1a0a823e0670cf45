"""Engine-side streaming: coalescing (fewer, fuller batches; never a token lost, reordered or
delayed past the end) and the acknowledgement of a request whose first token is slow."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deployments.engine import acknowledged, coalesce
from serve_app.core.tokens import EngineRejected, TokenBatch


async def _source(sizes: list[int], delays_ms: list[float], finish: str = "stop"):
    token = 0
    for index, size in enumerate(sizes):
        await asyncio.sleep(delays_ms[index % len(delays_ms)] / 1000)
        last = index == len(sizes) - 1
        yield TokenBatch(
            list(range(token, token + size)),
            finish_reason=finish if last else None,
            num_prompt_tokens=5 if index == 0 else None,
            num_draft_tokens=1,
        )
        token += size


async def _collect(iterator) -> list[TokenBatch]:
    return [batch async for batch in iterator]


@pytest.mark.slow
@settings(max_examples=60)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=40),
    delays_ms=st.lists(st.sampled_from([0.0, 0.0, 1.0, 3.0]), min_size=1, max_size=5),
    window_ms=st.sampled_from([0.0, 2.0, 10.0]),
    max_tokens=st.integers(1, 30),
)
def test_coalescing_keeps_every_token_in_order(sizes, delays_ms, window_ms, max_tokens):
    out = asyncio.run(_collect(coalesce(_source(sizes, delays_ms), window_ms / 1000, max_tokens)))
    tokens = [t for batch in out for t in batch.token_ids]
    assert tokens == list(range(sum(sizes)))
    assert out[0].token_ids == list(range(sizes[0]))  # the first batch goes out alone, at once
    assert out[0].num_prompt_tokens == 5
    assert [b.finish_reason for b in out] == [None] * (len(out) - 1) + ["stop"]
    assert sum(b.num_draft_tokens for b in out) == len(sizes)
    assert len(out) <= len(sizes)


def test_fast_engine_is_merged_into_few_objects():
    out = asyncio.run(_collect(coalesce(_source([2] * 100, [0.0]), 0.05, 1000)))
    assert len(out) <= 3
    assert sum(len(b.token_ids) for b in out) == 200


def test_slow_engine_is_not_held_back():
    """Steps slower than the window go out one by one, each when its window ends."""
    out = asyncio.run(_collect(coalesce(_source([1] * 6, [20.0]), 0.002, 1000)))
    assert len(out) == 6


def test_cancelling_the_consumer_closes_the_engine_stream():
    closed = asyncio.Event()

    async def endless():
        try:
            while True:
                await asyncio.sleep(0.001)
                yield TokenBatch([1])
        finally:
            closed.set()

    async def consume_then_cancel():
        async def reader():
            async for _ in coalesce(endless(), 0.005, 1000):
                pass

        task = asyncio.create_task(reader())
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.wait_for(closed.wait(), 1)

    asyncio.run(consume_then_cancel())


@pytest.mark.slow
@settings(max_examples=40)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=20),
    delays_ms=st.lists(st.sampled_from([0.0, 1.0, 8.0]), min_size=1, max_size=4),
    after_ms=st.sampled_from([0.0, 2.0, 5.0]),
)
def test_an_acknowledgement_leads_the_batches_and_changes_none(sizes, delays_ms, after_ms):
    out = asyncio.run(_collect(acknowledged(_source(sizes, delays_ms), after_ms / 1000)))
    batches = [batch for batch in out if not batch.is_acknowledgement]
    assert [index for index, batch in enumerate(out) if batch.is_acknowledgement] in ([], [0])  # at most one, first
    assert [batch.token_ids for batch in batches] == [batch.token_ids for batch in asyncio.run(_collect(_source(sizes, [0.0])))]
    assert batches[0].num_prompt_tokens == 5


def test_a_slow_first_token_is_acknowledged_before_it():
    async def run() -> list[TokenBatch]:
        prefilled = asyncio.Event()

        async def prefilling():
            await prefilled.wait()
            yield TokenBatch([0], num_prompt_tokens=5)
            yield TokenBatch([1, 2], finish_reason="stop")

        stream = acknowledged(prefilling(), 0.005)
        first = await asyncio.wait_for(anext(stream), 10)  # while the engine still prefills
        prefilled.set()
        return [first] + [batch async for batch in stream]

    out = asyncio.run(run())
    assert out[0] == TokenBatch.acknowledgement()
    assert [batch.token_ids for batch in out[1:]] == [[0], [1, 2]]
    assert out[1].num_prompt_tokens == 5


def test_a_fast_first_token_needs_no_acknowledgement():
    out = asyncio.run(_collect(acknowledged(_source([1, 2], [0.0]), 0.05)))
    assert [batch.token_ids for batch in out] == [[0], [1, 2]]


def test_a_refusal_comes_before_any_acknowledgement():
    """vLLM refuses in `add_request`, well within the wait: the ingress sees the refusal first
    (a 503 before the response starts), never an acknowledged request that then fails."""
    seen: list[TokenBatch] = []

    async def refusing():
        await asyncio.sleep(0.001)
        raise EngineRejected("too many requests waiting", client_error=False)
        yield TokenBatch([1])  # an async generator

    async def run() -> None:
        async for batch in acknowledged(refusing(), 0.05):
            seen.append(batch)  # noqa: PERF401 (kept one by one: what came before the error counts)

    with pytest.raises(EngineRejected):
        asyncio.run(run())
    assert seen == []


def test_closing_an_acknowledged_request_aborts_its_engine_stream():
    """The client goes away during the prefill: the pending wait for the first token is
    cancelled and the engine's stream closed (its `finally` aborts the request)."""
    closed = asyncio.Event()

    async def slow():
        try:
            await asyncio.sleep(60)
            yield TokenBatch([1])
        finally:
            closed.set()

    async def run() -> None:
        stream = acknowledged(slow(), 0.001)
        assert (await anext(stream)).is_acknowledgement
        await asyncio.wait_for(stream.aclose(), 1)
        assert closed.is_set()

    asyncio.run(run())


def test_a_token_batch_pickles_every_field_and_stays_a_token_batch():
    """Ray pickles one `TokenBatch` per object (`__reduce__`: constructor and fields)."""
    import pickle

    import ray.cloudpickle

    batch = TokenBatch(
        [5, 6], "length", 7, 3, 4, 2, [(-0.1, [(5, -0.1)]), (-0.2, [(6, -0.2), (9, -1.5)])], prompt_logprobs=[None, (-0.3, [(8, -0.3)])]
    )
    for dumps in (pickle.dumps, ray.cloudpickle.dumps):
        for original in (batch, TokenBatch.acknowledgement()):
            copy = pickle.loads(dumps(original, protocol=5))
            assert type(copy) is TokenBatch
            assert copy == original
            assert copy is not original
            assert copy.is_acknowledgement == (original is not batch)


def test_a_merged_batch_keeps_the_first_batchs_prompt_logprobs():
    first = TokenBatch([1], num_prompt_tokens=2, prompt_logprobs=[None, (-0.5, [])])
    first.merge(TokenBatch([2]))
    first.merge(TokenBatch([3], finish_reason="stop"))
    assert (first.token_ids, first.prompt_logprobs, first.finish_reason) == ([1, 2, 3], [None, (-0.5, [])], "stop")

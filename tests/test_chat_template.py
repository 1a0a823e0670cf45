"""The minimal chat-template path: SmolLM2's tokenizer renders the prompt; completion tokens
become one message item, whatever the batching, never a split UTF-8 character."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serve_app.protocol.errors import APIError
from serve_app.protocol.request import ResponsesRequest
from serve_app.protocol.sse import encode_events
from serve_app.protocol.stream import ResponseStream
from serve_app.protocol.tokens import TokenBatch
from tests.contract import check_stream, parse_sse
from tests.test_stream_properties import PIECES, partition

pytest.importorskip("transformers")
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def smollm2():
    from serve_app.protocol.chat_template import ChatTemplateModel
    from serve_app.smollm2 import ensure_smollm2_checkpoint

    return ChatTemplateModel(str(ensure_smollm2_checkpoint()))


def test_prompt_is_the_models_chatml(smollm2):
    request = ResponsesRequest(
        model="smollm2",
        instructions="Be brief.",
        input=[{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}],
    )
    text = smollm2.tokenizer.decode(smollm2.render_prompt(request, request.input_items()))
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text
    assert "<|im_start|>system\nAnswer in French.<|im_end|>" in text
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert smollm2.stop_token_ids == [smollm2.tokenizer.eos_token_id]


def test_function_call_history_is_a_clear_400(smollm2):
    request = ResponsesRequest(
        model="smollm2",
        input=[{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}],
    )
    with pytest.raises(APIError) as info:
        smollm2.render_prompt(request, request.input_items())
    assert info.value.status_code == 400 and info.value.param == "input[0]"


texts = st.lists(st.sampled_from(PIECES), min_size=1, max_size=40).map("".join)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts, sizes=st.lists(st.integers(1, 6), max_size=80))
def test_any_batching_gives_the_same_text(smollm2, text, sizes):
    tokens = smollm2.tokenizer.encode(text, add_special_tokens=False) + [smollm2.tokenizer.eos_token_id]
    request = ResponsesRequest(model="smollm2", input="x")
    for batches in ([tokens], [[t] for t in tokens], partition(tokens, sizes)):
        stream = ResponseStream(request, parser_factory=smollm2.parser)
        wire = encode_events(stream.start())
        for index, batch in enumerate(batches):
            wire += encode_events(stream.feed(TokenBatch(batch, finish_reason="stop" if index == len(batches) - 1 else None)))
        terminal = check_stream(parse_sse(wire))
        assert [item.type for item in terminal.output] == ["message"]
        assert terminal.output[0].content[0].text == text

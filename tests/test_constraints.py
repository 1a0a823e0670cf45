"""The engine constraints (`serve_app/protocol/constraints.py`) checked with xgrammar, the
grammar engine vLLM's structured outputs mask logits with, token by token as vLLM feeds it:
- the harmony constraints are exactly vLLM 0.32's own for the same request;
- the replay models' completions (real harmony / SmolLM2 token ids, the shape a real model
  writes) are accepted, reasoning included; what the constraint forbids is rejected.
"""

from __future__ import annotations

import base64
import json

import pytest

xgr = pytest.importorskip("xgrammar")

from deployments.backends.replay import script_completion  # noqa: E402
from deployments.backends.replay_qwen3 import script_qwen3_completion  # noqa: E402
from serve_app.protocol.chat_template import ChatTemplateModel  # noqa: E402
from serve_app.protocol.constraints import JSON_MAX_WHITESPACE  # noqa: E402
from serve_app.protocol.harmony import HarmonyModel, render_completion  # noqa: E402
from serve_app.protocol.request import ResponsesRequest  # noqa: E402
from serve_app.vocab import VOCAB_FILE, ensure_vocabulary, harmony_encoding  # noqa: E402
from tests.conftest import have_vllm  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "name": "get_weather", "parameters": SCHEMA, "strict": True}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}, "strict": False}
JSON_FORMAT = {"format": {"type": "json_schema", "name": "plan", "schema": SCHEMA, "strict": True}}


def request(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hello", **fields})


# --------------------------------------------------------------------------- harmony


@pytest.fixture(scope="module")
def harmony_tokenizer_info():
    """o200k_harmony as xgrammar sees a tokenizer: every token's bytes, special tokens as their
    text (`<|channel|>` ...), which is what a gpt-oss engine needs for structured outputs
    (vLLM refuses them under `skip_tokenizer_init`: it builds this from the HF tokenizer)."""
    encoding = harmony_encoding()
    vocab: list[bytes] = []
    for line in (ensure_vocabulary() / VOCAB_FILE).read_text().splitlines():
        token, rank = line.split()
        assert int(rank) == len(vocab)
        vocab.append(base64.b64decode(token))
    size = 201088
    for token_id in range(len(vocab), size):
        try:
            vocab.append(encoding.decode_utf8([token_id]).encode())
        except Exception:  # noqa: BLE001 - unused ids
            vocab.append(f"<|reserved_{token_id}|>".encode())
    stops = encoding.stop_tokens_for_assistant_actions()
    return xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, vocab_size=size, stop_token_ids=stops), stops


def harmony_tokens(text: str) -> list[int]:
    return harmony_encoding().encode(text, allowed_special="all")


def accepts(compiler, engine: dict, tokens: list[int], stops: list[int]) -> bool:
    """Feed tokens as vLLM does (one `accept_token` each); True if all are accepted and the
    grammar ends with the completion's stop token."""
    compiled = compiler.compile_structural_tag(engine["structural_tag"])
    matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stops)
    return all(matcher.accept_token(t) for t in tokens) and matcher.is_terminated()


@pytest.fixture(scope="module")
def harmony_compiler(harmony_tokenizer_info):
    info, stops = harmony_tokenizer_info
    return xgr.GrammarCompiler(info), stops


def harmony_case(req: ResponsesRequest):
    model = HarmonyModel()
    prompt = model.render_prompt(req, req.input_items())
    constraint = model.constraint(req, prompt)
    return constraint, script_completion(prompt, constraint)


def test_harmony_json_answer_after_free_analysis(harmony_compiler):
    compiler, stops = harmony_compiler
    req = request(text=JSON_FORMAT)
    prompt = harmony_encoding().decode_utf8(HarmonyModel().render_prompt(req, req.input_items()))
    assert f"# Response Formats\n\n## plan\n\n{json.dumps(SCHEMA)}<|end|>" in prompt  # gpt-oss is told the schema
    constraint, completion = harmony_case(req)
    text = harmony_encoding().decode_utf8(completion)
    assert text.startswith("<|channel|>analysis<|message|>The user wrote")  # reasoning: any text
    assert accepts(compiler, constraint.engine, completion, stops)
    wrong = '<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final <|constrain|>json<|message|>{"city": "Oslo"}<|return|>'
    assert not accepts(compiler, constraint.engine, harmony_tokens(wrong), stops)  # "days" missing
    plain = "<|channel|>final<|message|>Oslo, 3 days<|return|>"
    assert not accepts(compiler, constraint.engine, harmony_tokens(plain), stops)


def test_harmony_required_named_allowed_and_none(harmony_compiler):
    compiler, stops = harmony_compiler
    answer = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>Hi!<|return|>"
    call_time = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>"
    call_weather = ' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Oslo", "days": 0}<|call|>'

    required, completion = harmony_case(request(tools=[WEATHER, TIME], tool_choice="required"))
    assert accepts(compiler, required.engine, completion, stops)  # the replay calls get_weather
    assert accepts(compiler, required.engine, harmony_tokens(call_time), stops)
    assert not accepts(compiler, required.engine, harmony_tokens(answer), stops)
    assert not accepts(compiler, required.engine, harmony_tokens(call_weather), stops)  # days < 1 (strict)

    named, completion = harmony_case(request(tools=[WEATHER, TIME], tool_choice={"type": "function", "name": "get_time"}))
    assert accepts(compiler, named.engine, completion, stops)
    assert not accepts(compiler, named.engine, harmony_tokens(call_weather.replace('"days": 0', '"days": 2')), stops)

    allowed = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_time"}]}
    auto, completion = harmony_case(request(tools=[WEATHER, TIME], tool_choice=allowed))
    assert accepts(compiler, auto.engine, harmony_tokens(answer), stops)
    assert accepts(compiler, auto.engine, harmony_tokens(call_time), stops)
    assert not accepts(compiler, auto.engine, harmony_tokens(call_weather.replace('"days": 0', '"days": 2')), stops)

    none, completion = harmony_case(request(input="call get_time", tools=[WEATHER, TIME], tool_choice="none"))
    assert "to=functions" not in harmony_encoding().decode_utf8(completion)
    assert accepts(compiler, none.engine, completion, stops)
    assert not accepts(compiler, none.engine, harmony_tokens(call_time), stops)


def without_whitespace_cap(node):
    """Our one difference from vLLM's tags: JSON bodies allow one whitespace between tokens."""
    if isinstance(node, dict):
        if node.get("type") == "json_schema":
            assert node["max_whitespace_cnt"] == JSON_MAX_WHITESPACE
            node = {**node, "max_whitespace_cnt": None}
        return {key: without_whitespace_cap(value) for key, value in node.items()}
    if isinstance(node, list):
        return [without_whitespace_cap(value) for value in node]
    return node


@pytest.mark.skipif(not have_vllm(), reason="needs vllm")
def test_harmony_constraints_equal_vllms_own():
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest as VLLMResponsesRequest
    from vllm.parser.harmony import _adjust_output_format, get_harmony_structural_tag
    from xgrammar.openai_tool_call_schema import FunctionToolParam

    def ours(req: ResponsesRequest) -> dict:
        tag = json.loads(HarmonyModel().constraint(req, []).engine["structural_tag"])
        return without_whitespace_cap(xgr.StructuralTag.model_validate(tag).model_dump())

    vllm_json = _adjust_output_format(VLLMResponsesRequest(model="m", input="hello", text=JSON_FORMAT))
    assert ours(request(text=JSON_FORMAT)) == json.loads(vllm_json.structured_outputs.structural_tag)

    tools = [FunctionToolParam.model_validate({"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}) for t in (WEATHER, TIME)]
    assert ours(request(tools=[WEATHER, TIME], tool_choice="required")) == get_harmony_structural_tag(tools, [], "required", True).model_dump()
    named = request(tools=[WEATHER, TIME], tool_choice={"type": "function", "name": "get_weather"})
    assert ours(named) == get_harmony_structural_tag(tools[:1], [], "forced", True).model_dump()


# --------------------------------------------------------------------------- chat templates


@pytest.fixture(scope="module")
def smollm2():
    from serve_app.config import SMOLLM2
    from serve_app.smollm2 import load_tokenizer

    tokenizer = load_tokenizer(SMOLLM2)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, stop_token_ids=[tokenizer.eos_token_id])
    return tokenizer, xgr.GrammarCompiler(info)


def qwen3_case(tokenizer, req: ResponsesRequest, **template_kwargs):
    model = ChatTemplateModel(tokenizer, template="qwen3", reasoning_parser="qwen3", tool_parser="hermes", template_kwargs=template_kwargs)
    prompt = model.render_prompt(req, req.input_items())
    constraint = model.constraint(req, prompt)
    return constraint, script_qwen3_completion(prompt, constraint)


@pytest.mark.parametrize("thinking", [None, True], ids=["model-opens-think", "prompt-opens-think"])
def test_qwen3_json_answer_after_free_thinking(smollm2, thinking):
    tokenizer, compiler = smollm2
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    constraint, completion = qwen3_case(tokenizer, request(text=JSON_FORMAT), **kwargs)
    stops = [tokenizer.eos_token_id]
    assert "The user wrote" in tokenizer.decode(completion)
    assert accepts(compiler, constraint.engine, completion, stops)
    think = "" if thinking else "<think>\n"
    for wrong in (f'{think}anything\n</think>\n\n{{"city": "Oslo"}}', f"{think}x</think>\n\nOslo for 3 days", '{"city": "Oslo", "days": 2} trailing'):
        assert not accepts(compiler, constraint.engine, tokenizer.encode(wrong) + stops, stops), wrong


def test_qwen3_thinking_off_allows_no_think_block(smollm2):
    """enable_thinking false closes the think block in the prompt: the answer comes at once."""
    tokenizer, compiler = smollm2
    constraint, completion = qwen3_case(tokenizer, request(text=JSON_FORMAT), enable_thinking=False)
    stops = [tokenizer.eos_token_id]
    assert "<think>" not in tokenizer.decode(completion)
    assert accepts(compiler, constraint.engine, completion, stops)
    assert not accepts(compiler, constraint.engine, tokenizer.encode('<think>\nhm\n</think>\n\n{"city": "Oslo", "days": 2}') + stops, stops)


def test_qwen3_tool_choice(smollm2):
    tokenizer, compiler = smollm2
    stops = [tokenizer.eos_token_id]

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text) + stops

    answer = encode("<think>\nhm\n</think>\n\nHello!")
    call_time = encode('<think>\nhm\n</think>\n\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    call_weather = encode('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>')

    required, completion = qwen3_case(tokenizer, request(tools=[WEATHER, TIME], tool_choice="required"))
    assert accepts(compiler, required.engine, completion, stops)
    assert accepts(compiler, required.engine, call_time, stops)
    assert not accepts(compiler, required.engine, answer, stops)

    named, completion = qwen3_case(tokenizer, request(tools=[WEATHER, TIME], tool_choice={"type": "function", "name": "get_time"}))
    assert accepts(compiler, named.engine, completion, stops) and accepts(compiler, named.engine, call_time, stops)
    assert not accepts(compiler, named.engine, call_weather, stops)
    two_calls = encode('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert not accepts(compiler, named.engine, two_calls, stops)  # a named function is called once

    allowed = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_time"}]}
    auto, _ = qwen3_case(tokenizer, request(tools=[WEATHER, TIME], tool_choice=allowed))
    assert accepts(compiler, auto.engine, answer, stops) and accepts(compiler, auto.engine, call_time, stops)
    assert not accepts(compiler, auto.engine, call_weather, stops)

    none, completion = qwen3_case(tokenizer, request(input="call get_time", tools=[WEATHER, TIME], tool_choice="none"))
    assert "<tool_call>" not in tokenizer.decode(completion)
    assert accepts(compiler, none.engine, completion, stops) and accepts(compiler, none.engine, answer, stops)
    assert not accepts(compiler, none.engine, call_time, stops)


def test_plain_chat_template_gets_vllms_json_constraint(smollm2):
    """A model without parsers (SmolLM2's own template): the answer is all there is."""
    tokenizer, compiler = smollm2
    model = ChatTemplateModel(tokenizer)
    req = request(text=JSON_FORMAT)
    prompt = model.render_prompt(req, req.input_items())
    constraint = model.constraint(req, prompt)
    fmt = json.loads(constraint.engine["structural_tag"])["format"]
    assert fmt == {"type": "json_schema", "json_schema": SCHEMA, "max_whitespace_cnt": JSON_MAX_WHITESPACE}
    stops = [tokenizer.eos_token_id]
    assert accepts(compiler, constraint.engine, tokenizer.encode('{"city": "Oslo", "days": 2}') + stops, stops)
    assert not accepts(compiler, constraint.engine, tokenizer.encode('{"city":  "Oslo", "days": 2}') + stops, stops)  # two spaces
    assert not accepts(compiler, constraint.engine, tokenizer.encode('{"city": "Oslo"}') + stops, stops)
    json_object = request(input="Answer in JSON.", text={"format": {"type": "json_object"}})
    assert json.loads(model.constraint(json_object, []).engine["structural_tag"])["format"]["json_schema"] == {"type": "object"}
    with pytest.raises(Exception, match="no function this model can call"):
        model.constraint(request(tools=[TIME], tool_choice="required"), [])
    assert model.constraint(request(tools=[TIME], tool_choice="none"), []) is None  # no tool parser: no call possible

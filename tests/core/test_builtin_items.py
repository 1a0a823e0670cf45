"""The built-in tools' items in the event stream (`web_search_call`, `code_interpreter_call`)
and the answer's citations: for any completion, any batching, any outcome of the tools, the
stream keeps the contract, the code streams exactly, and the annotations are exact."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import Message, Role

from serve_app.api.request import ResponsesRequest
from serve_app.api.sse import encode_events
from serve_app.core.citations import CitedFile, CitedPage, annotate
from serve_app.core.stream import ResponseStream
from serve_app.core.tokens import TokenBatch
from serve_app.core.tool_items import (
    FILE_SEARCH_CALL,
    WEB_SEARCH_CALL,
    CodeInterpreterCallKind,
    ServerTools,
    StringArgument,
    ToolError,
    ToolOutcome,
)
from serve_app.families.harmony import HarmonyParser, render_completion
from serve_app.families.vocab import harmony_encoding
from tests.core.test_stream_properties import partition, texts
from tests.core.test_stream_tools import ScriptParser
from tests.support.contract import check_stream, parse_sse

REQUEST = ResponsesRequest(model="gpt-oss-replay", input="hi")
CONTAINER = "cntr_" + "ab" * 16
# Python code, with what JSON must escape and what UTF-8 splits: quotes, backslashes, control
# characters, astral characters (a surrogate pair when escaped).
code_texts = st.one_of(
    texts,
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80),
    st.lists(st.sampled_from(['print("x")\n', "\\", '"', "\t", "😀", "é", "\\u0041", "{", "}"]), max_size=20).map("".join),
)


def _no_lone_surrogates(text: str) -> str:
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


@pytest.mark.slow
@settings(max_examples=300)
@given(code_texts, st.sampled_from([(",", ":"), (", ", ": "), (",\n", " : ")]), st.booleans(), st.lists(st.integers(1, 7), max_size=60))
def test_the_code_of_a_json_call_streams_as_json_decodes_it(code, separators, ensure_ascii, sizes):
    arguments = json.dumps({"code": code}, separators=separators, ensure_ascii=ensure_ascii)
    if separators[0] == ",\n":
        arguments = "\n " + arguments  # whitespace before the object too
    decoded = StringArgument(json_arguments=True)
    streamed = "".join(decoded.feed(arguments[a:b]) for a, b in _spans(len(arguments), sizes)) + decoded.finish(arguments)
    assert streamed == decoded.text == _no_lone_surrogates(code)
    assert decoded.error is None


@given(st.text(max_size=40).map(lambda t: json.dumps(t)[1:-1]), st.lists(st.integers(1, 5), max_size=20))
def test_escapes_decode_as_json_does_whatever_the_split(escaped, sizes):
    arguments = '{"code": "' + escaped + '"}'
    decoded = StringArgument(json_arguments=True)
    streamed = "".join(decoded.feed(arguments[a:b]) for a, b in _spans(len(arguments), sizes)) + decoded.finish(arguments)
    assert streamed == _no_lone_surrogates(json.loads(arguments)["code"])


def test_lone_surrogate_escapes_become_replacement_characters():
    for escaped, expected in [("\\ud83d", "\ufffd"), ("\\ud83dx", "\ufffdx"), ("\\ude00", "\ufffd"), ("\\ud83d\\ud83d", "\ufffd\ufffd")]:
        decoded = StringArgument(json_arguments=True)
        arguments = '{"code": "' + escaped + '"}'
        assert decoded.feed(arguments) + decoded.finish(arguments) == expected


def test_calls_of_another_shape_are_decoded_at_their_end_or_refused():
    cases = [
        ('{"timeout": 3, "code": "print(1)"}', "print(1)", None),  # another key first: decoded at the end
        ('{"code": 5}', "", "JSON object"),
        ('["print(1)"]', "", "JSON object"),
        ("print(1)", "", "JSON object"),  # a chat model writing code where JSON belongs
        ('{"code": "x = 1', "x = 1", None),  # cut off by the token limit: what came
    ]
    for arguments, code, error in cases:
        decoded = StringArgument(json_arguments=True)
        streamed = decoded.feed(arguments) + decoded.finish(arguments)
        assert (streamed, decoded.text) == (code, code)
        assert (decoded.error is None) if error is None else (error in (decoded.error or ""))
    raw = StringArgument(json_arguments=False)  # harmony: the message is the code, JSON-looking or not
    assert raw.feed('{"code": 1}') + raw.finish('{"code": 1}') == '{"code": 1}'
    assert raw.error is None


def _spans(length: int, sizes: list[int]) -> list[tuple[int, int]]:
    spans, position = [], 0
    for size in sizes:
        if position >= length:
            break
        spans.append((position, min(length, position + size)))
        position += size
    if position < length:
        spans.append((position, length))
    return spans


# -- the items, from harmony completions as gpt-oss writes them -----------------------------


def _builtin_call(recipient: str, arguments: str) -> list[int]:
    """`<|start|>assistant<|channel|>analysis to=RECIPIENT code<|message|>...<|call|>` (gpt-oss's spelling)."""
    encoding = harmony_encoding()
    header = encoding.encode(f"<|start|>assistant<|channel|>analysis to={recipient} code<|message|>", allowed_special="all")
    return header + encoding.encode(arguments, disallowed_special=()) + encoding.encode("<|call|>", allowed_special="all")


@st.composite
def builtin_completions(draw) -> tuple[list[int], list[tuple[str, str]]]:
    """Reasoning, then one to three built-in calls: the tokens (after `<|start|>assistant`) and
    (item type, code or browser function) of each call."""
    tokens = render_completion([Message.from_role_and_content(Role.ASSISTANT, draw(texts)).with_channel("analysis")])
    calls = []
    for _ in range(draw(st.integers(1, 3))):
        choice = draw(st.integers(0, 2))
        if choice == 2:
            query = draw(texts)
            tokens += _builtin_call("file_search", json.dumps({"query": query}))
            calls.append(("file_search_call", query))
        elif choice == 1:
            code = draw(code_texts)
            tokens += _builtin_call("python", code)
            calls.append(("code_interpreter_call", code))
        else:
            function = draw(st.sampled_from(["search", "open", "find"]))
            arguments = {"search": {"query": draw(texts)}, "open": {"id": draw(texts)}, "find": {"pattern": draw(texts)}}[function]
            tokens += _builtin_call(f"browser.{function}", json.dumps(arguments))
            calls.append(("web_search_call", function))
    return tokens, calls


outcomes = st.sampled_from(["ok", "failed", "unfinished"])


@pytest.mark.slow
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(builtin_completions(), st.lists(st.integers(1, 6), max_size=80), st.lists(outcomes, min_size=1, max_size=3), texts)
def test_builtin_calls_keep_the_contract_in_any_batching_with_any_outcome(completion, sizes, results, answer):
    tokens, calls = completion
    kind = CodeInterpreterCallKind(CONTAINER)
    stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
    stream.server_tools = ServerTools(namespaces={"browser": WEB_SEARCH_CALL}, names={"python": kind, "file_search": FILE_SEARCH_CALL})
    wire = encode_events(stream.start())
    batches = partition(tokens, sizes)
    for index, batch in enumerate(batches):
        wire += encode_events(stream.feed(TokenBatch(batch, finish_reason="stop" if index == len(batches) - 1 else None)))
    waiting = stream.unfinished_calls
    assert [call.kind.item_type for call in waiting] == [item for item, _ in calls]
    ended = False
    for index, call in enumerate(waiting):
        result = results[index % len(results)]
        if result == "unfinished":  # the response ends while this call runs
            wire += encode_events(stream.run_call(call) + stream.fail("the engine broke"))
            ended = True
            break
        action = {"type": "search", "query": "q", "sources": [{"type": "url", "url": "https://a.example/"}]}
        item = (
            {"action": action}
            if call.kind is WEB_SEARCH_CALL
            else {"results": [{"file_id": "file-1", "filename": "a.txt", "score": 0.5, "text": "out"}]}
            if call.kind is FILE_SEARCH_CALL
            else {"outputs": [{"type": "logs", "logs": "out"}]}
        )
        outcome = (
            ToolOutcome(output="out", model_text="out", item=item)
            if result == "ok"
            else ToolOutcome(error=ToolError("mcp_tool_execution_error", "refused"), model_text="refused")
        )
        wire += encode_events(stream.run_call(call) + stream.finish_call(call, outcome))
    if not ended:
        stream.next_round(HarmonyParser)
        final = render_completion([Message.from_role_and_content(Role.ASSISTANT, answer).with_channel("final")])
        wire += encode_events(stream.feed(TokenBatch(final, finish_reason="stop")))
    terminal = check_stream(parse_sse(wire))
    made = [item for item in terminal.output if item.type in ("web_search_call", "code_interpreter_call", "file_search_call")]
    assert [item.type for item in made] == [item for item, _ in calls]
    for item, (_, expected) in zip(made, calls, strict=True):
        if item.type == "code_interpreter_call":  # the code exactly as the model wrote it, in the container named at the start
            assert item.code == expected
            assert item.container_id == CONTAINER
        elif item.type == "file_search_call":  # the query exactly as the model wrote it; results only of a completed search
            assert item.queries == [expected]
            assert item.id.startswith("fs_")
            assert (item.results is not None) == (item.status == "completed")
        else:
            assert (
                item.action.type == {"search": "search", "open": "open_page", "find": "find_in_page"}[expected]
                or item.status == "completed"
            )
    # What the model read of each finished call is kept for the next round's prompt.
    assert set(stream.tool_texts) == {item.id for item in made if item.status in ("completed", "failed")}


def test_a_python_call_written_as_json_streams_its_code():
    code = 'print("a\\tb")\nx = "😀"'
    arguments = json.dumps({"code": code})
    script = [("open_function_call", "python", None, True)] + [("add_text", arguments[i : i + 3]) for i in range(0, len(arguments), 3)]
    script.append(("close_item",))
    stream = ResponseStream(REQUEST, parser_factory=lambda sink: ScriptParser(sink, script))
    stream.server_tools = ServerTools(names={"python": CodeInterpreterCallKind(CONTAINER)})
    events = stream.start() + stream.feed(TokenBatch(list(range(len(script))), finish_reason="stop"))
    deltas = "".join(e.delta for e in events if e.type == "response.code_interpreter_call_code.delta")
    (call,) = stream.unfinished_calls
    assert deltas == code
    assert call.code is not None
    assert call.code.text == code
    events += stream.run_call(call) + stream.finish_call(call, ToolOutcome(output="a\tb\n", model_text="a\tb\n")) + stream.complete()
    terminal = check_stream(parse_sse(encode_events(events)))
    assert terminal.output[0].code == code
    assert terminal.output[0].outputs is None  # outputs only when included


# -- citations --------------------------------------------------------------------------------

PAGES = {1: CitedPage(url="https://a.example/harmony", title="Harmony"), 4: CitedPage(url="https://b.example/", title="B")}
markers = st.sampled_from(["【1†L2-L3】", "【4†L0】", "【9†L1】", "【1†", "】", "【x†y】", "【1†L2\n】", "【1†L1†a.example】"])
answers = st.lists(st.one_of(texts, markers, st.sampled_from([". ", "\n", " "])), min_size=1, max_size=12).map("".join)


@pytest.mark.slow
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(answers, st.lists(st.integers(1, 5), max_size=80))
def test_citation_markers_become_exact_annotations_in_any_batching(answer, sizes):
    completion = render_completion([Message.from_role_and_content(Role.ASSISTANT, answer).with_channel("final")])
    expected_text, expected_annotations = annotate(answer, PAGES)
    for batching in (sizes, [len(completion)]):
        stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
        stream.server_tools = ServerTools(citations=PAGES)
        wire = encode_events(stream.start())
        batches = partition(completion, batching)
        for index, batch in enumerate(batches):
            wire += encode_events(stream.feed(TokenBatch(batch, finish_reason="stop" if index == len(batches) - 1 else None)))
        events = parse_sse(wire)
        terminal = check_stream(events)  # annotation events after their text, numbered, equal to the item's
        (message,) = terminal.output
        part = message.content[0]
        assert part.text == expected_text
        assert "【1†L2-L3】" not in part.text
        assert [a.model_dump() for a in part.annotations] == [a.model_dump() for a in expected_annotations]
        for annotation in part.annotations:  # exact in the final text, to pages the browser showed
            assert 0 <= annotation.start_index <= annotation.end_index <= len(part.text)
            assert annotation.url in {page.url for page in PAGES.values()}


def test_pages_the_browser_showed_during_the_response_are_citable_in_its_answer():
    pages: dict[int, CitedPage] = {}
    stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
    stream.server_tools = ServerTools(namespaces={"browser": WEB_SEARCH_CALL}, citations=pages)
    call_tokens = _builtin_call("browser.open", '{"id": "https://a.example/"}')[2:]  # the prompt ends with <|start|>assistant
    events = stream.start() + stream.feed(TokenBatch(call_tokens, finish_reason="stop"))
    (call,) = stream.unfinished_calls
    pages[0] = CitedPage(url="https://a.example/", title="A")  # what the call's result listed
    action = {"type": "open_page", "url": "https://a.example/"}
    events += stream.run_call(call) + stream.finish_call(call, ToolOutcome(output="page", model_text="page", item={"action": action}))
    stream.next_round(HarmonyParser)
    answer = render_completion([Message.from_role_and_content(Role.ASSISTANT, "A says so【0†L1】.").with_channel("final")])
    events += stream.feed(TokenBatch(answer, finish_reason="stop"))
    terminal = check_stream(parse_sse(encode_events(events)))
    part = terminal.output[-1].content[0]
    assert part.text == "A says so."
    assert [(a.url, part.text[a.start_index : a.end_index]) for a in part.annotations] == [("https://a.example/", "A says so")]
    assert terminal.output[0].action.url == "https://a.example/"
    assert terminal.output[0].status == "completed"


FILES = {0: CitedFile(file_id="file-a", filename="a.txt"), 1000: CitedFile(file_id="file-b", filename="b.pdf")}
file_markers = st.sampled_from(["【0†a.txt】", "【1000†b.pdf】", "【7†c.txt】", "【0†", "】"])
file_answers = st.lists(st.one_of(texts, file_markers, st.sampled_from([". ", "\n"])), min_size=1, max_size=12).map("".join)


@pytest.mark.slow
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(file_answers, st.lists(st.integers(1, 5), max_size=80))
def test_file_markers_become_file_citations_in_any_batching(answer, sizes):
    completion = render_completion([Message.from_role_and_content(Role.ASSISTANT, answer).with_channel("final")])
    expected_text, expected_annotations = annotate(answer, FILES)
    stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
    stream.server_tools = ServerTools(citations=FILES)
    wire = encode_events(stream.start())
    batches = partition(completion, sizes)
    for index, batch in enumerate(batches):
        wire += encode_events(stream.feed(TokenBatch(batch, finish_reason="stop" if index == len(batches) - 1 else None)))
    terminal = check_stream(parse_sse(wire))
    part = terminal.output[0].content[0]
    assert part.text == expected_text
    assert [a.model_dump() for a in part.annotations] == [a.model_dump() for a in expected_annotations]
    for annotation in part.annotations:
        assert annotation.type == "file_citation"
        assert 0 <= annotation.index <= len(part.text)
        assert FILES[{"file-a": 0, "file-b": 1000}[annotation.file_id]].filename == annotation.filename

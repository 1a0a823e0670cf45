"""Server-side calls in the event stream: for any completion, any batching, any order in which
the tools return and whatever they return, the stream keeps the contract — items one after
another, `*.completed` only after the tool returned — and the same items come out."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses.response_output_item import McpListToolsTool
from openai_harmony import Message, Role

from serve_app.api.request import ResponsesRequest
from serve_app.api.sse import encode_events
from serve_app.core.stream import ResponseStream
from serve_app.core.tokens import TokenBatch
from serve_app.core.tool_items import MCP_APPROVAL_REQUEST, MCP_CALL, NOT_FINISHED, ServerTools, ToolOutcome
from serve_app.families.harmony import HarmonyParser, render_completion
from tests.core.test_stream_properties import arguments, partition, texts
from tests.support.contract import check_stream, parse_sse

REQUEST = ResponsesRequest(model="gpt-oss-replay", input="hi")

outcomes = st.one_of(
    texts.map(lambda text: ToolOutcome(output=text)),
    st.just(ToolOutcome(output="")),
    texts.map(ToolOutcome.failed),
    # Any JSON-RPC code but -1, which the contract checker reads as a placeholder left on the wire.
    st.builds(
        lambda message, code: ToolOutcome.failed(message, "mcp_protocol_error", code),
        texts,
        st.integers(-32768, 600).filter(lambda c: c != -1),
    ),
    st.builds(lambda message, code: ToolOutcome.failed(message, "http_error", code), texts, st.integers(400, 599)),
)


class ScriptParser:
    """A completion parser whose every token is one item operation of a script: what a
    family's parser does to the stream, without a tokenizer (chat templates make several
    calls in one completion, with text between and after them)."""

    reasoning_tokens = 0
    held_text = ""

    def __init__(self, sink, script: list[tuple]) -> None:
        self._sink, self._script = sink, script

    def feed(self, token_ids: list[int]) -> None:
        for token in token_ids:
            operation, *arguments = self._script[token]
            getattr(self._sink, operation)(*arguments)

    def end(self, truncated: bool = False) -> None:
        pass


@st.composite
def scripts(draw) -> tuple[list[tuple], list[tuple[str, str]]]:
    """Item operations of one completion, and the (item type, text) it makes."""
    script: list[tuple] = []
    expected: list[tuple[str, str]] = []
    for _ in range(draw(st.integers(1, 5))):
        what = draw(st.sampled_from(["reasoning", "message", "mcp", "mcp", "approval", "function"]))
        text = draw(arguments if what in ("mcp", "approval", "function") else texts)
        pieces = draw(st.lists(st.integers(1, max(1, len(text))), max_size=4))
        if what == "reasoning":
            script.append(("open_reasoning",))
        elif what == "message":
            script.append(("open_message", "final_answer"))
        elif what == "function":
            script.append(("open_function_call", "lookup", None))
        else:
            script.append(("open_function_call", "echo" if what == "mcp" else "delete", "lab"))
        position = 0
        for size in pieces:
            if position < len(text):
                script.append(("add_text", text[position : position + size]))
                position += size
        if position < len(text):
            script.append(("add_text", text[position:]))
        script.append(("close_item",))
        expected.append(({"mcp": "mcp_call", "approval": "mcp_approval_request", "function": "function_call"}.get(what, what), text))
    return script, expected


def tools() -> ServerTools:
    return ServerTools(namespaces={"lab": MCP_CALL}, needs_approval=lambda namespace, name: name == "delete")


def drive(script, sizes, order, results, answer, listings=()) -> tuple[list[dict], ResponseStream]:
    """One response: MCP servers' `listings` before it (each an error, or None: listed),
    finished in `order`; the script's completion in batches, the calls finished in `order`
    with `results`, then (if nothing hands the response back) a second turn answering `answer`."""
    stream = ResponseStream(REQUEST, parser_factory=lambda sink: ScriptParser(sink, script))
    stream.server_tools = tools()
    wire = encode_events(stream.start())
    if listings:  # as the tool loop prepares: the servers listed side by side, then the first generation
        opened = [stream.open_tool_listing(f"server{index}") for index in range(len(listings))]
        wire += encode_events(stream.events())
        for position in sorted(range(len(opened)), key=lambda i: order[i % len(order)] if order else 0):
            listed = [] if listings[position] is not None else [McpListToolsTool(name="echo", input_schema={"type": "object"})]
            wire += encode_events(stream.finish_tool_listing(opened[position], listed, listings[position]))
        stream.next_round(lambda sink: ScriptParser(sink, script))
    batches = partition(list(range(len(script))), sizes)
    for index, batch in enumerate(batches):
        last = index == len(batches) - 1
        wire += encode_events(
            stream.feed(TokenBatch(batch, finish_reason="stop" if last else None, num_prompt_tokens=5 if index == 0 else None))
        )
    calls = stream.unfinished_calls
    assert stream.awaiting_tools == bool(calls)
    assert stream.finished != bool(calls)
    for position in sorted(range(len(calls)), key=lambda i: order[i % len(order)] if order else 0):
        wire += encode_events(stream.run_call(calls[position]))
        wire += encode_events(stream.finish_call(calls[position], results[position % len(results)]))
    if not stream.finished:
        if stream.hands_back:
            wire += encode_events(stream.complete())
        else:
            final = render_completion([Message.from_role_and_content(Role.ASSISTANT, answer).with_channel("final")])
            stream.next_round(HarmonyParser)
            wire += encode_events(stream.feed(TokenBatch(final, finish_reason="stop", num_prompt_tokens=11, num_cached_tokens=4)))
    assert stream.finished
    return parse_sse(wire), stream


@pytest.mark.slow
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    scripts(),
    st.lists(st.integers(1, 6), max_size=60),
    st.lists(st.integers(0, 9), max_size=6),
    st.lists(outcomes, min_size=1, max_size=4),
    texts,
)
def test_server_calls_keep_the_contract_in_any_batching_and_finishing_order(script_and_expected, sizes, order, results, answer):
    script, expected = script_and_expected
    events, _ = drive(script, sizes, order, results, answer)
    terminal = check_stream(events)
    assert terminal.status == "completed"
    made = [(item.type, getattr(item, "arguments", None) or _text(item)) for item in terminal.output]
    calls = [item for item in terminal.output if item.type == "mcp_call"]
    # The script's items, then the answer of the second turn when nothing was handed back.
    assert made[: len(expected)] == expected
    hands_back = any(kind in ("function_call", "mcp_approval_request") for kind, _ in expected)
    assert made[len(expected) :] == ([] if hands_back or not calls else [("message", answer)])
    for call in calls:  # each call's end is exactly the outcome the loop handed in
        assert call.server_label == "lab"
        assert call.name == "echo"
        assert call.status in ("completed", "failed")
    # Usage: both turns' prompts; every event after the created one carries the same id.
    assert terminal.usage.input_tokens == (16 if calls and not hands_back else 5)
    assert terminal.usage.input_tokens_details.cached_tokens == (4 if calls and not hands_back else 0)


@pytest.mark.slow
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(
    scripts(),
    st.lists(st.one_of(st.none(), texts.filter(bool)), min_size=1, max_size=3),
    st.lists(st.integers(1, 6), max_size=60),
    st.lists(st.integers(0, 9), max_size=6),
    st.lists(outcomes, min_size=1, max_size=4),
)
def test_listings_before_the_generation_keep_the_contract(script_and_expected, listings, sizes, order, results):
    script, expected = script_and_expected
    events, _ = drive(script, sizes, order, results, "done", listings)
    terminal = check_stream(events)
    made = terminal.output[: len(listings)]
    assert [(item.type, item.server_label, item.error) for item in made] == [
        ("mcp_list_tools", f"server{index}", error) for index, error in enumerate(listings)
    ]
    assert [[tool.name for tool in item.tools] for item in made] == [[] if error else ["echo"] for error in listings]
    assert [item.type for item in terminal.output[len(listings) : len(listings) + len(expected)]] == [kind for kind, _ in expected]
    # Each listing's own events, in the SDK's order, whatever order the servers answered in.
    for item in made:
        own = [e["type"] for e in events if e.get("item_id") == item.id or e.get("item", {}).get("id") == item.id]
        end = "response.mcp_list_tools.failed" if item.error else "response.mcp_list_tools.completed"
        assert own == ["response.output_item.added", "response.mcp_list_tools.in_progress", end, "response.output_item.done"]


@pytest.mark.slow
@settings(max_examples=100)
@given(scripts(), st.lists(st.integers(1, 6), max_size=60))
def test_every_batching_gives_the_same_events_up_to_delta_boundaries(script_and_expected, sizes):
    script, _ = script_and_expected
    shapes = []
    for batching in ([], sizes):
        events, _ = drive(script, batching or [len(script)], [], [ToolOutcome(output="ok")], "done")
        shapes.append([(e["type"], e.get("output_index")) for e in events if not e["type"].endswith(".delta")])
    assert shapes[0] == shapes[1]


def _text(item) -> str:
    if item.type == "message":
        return item.content[0].text
    if item.type == "reasoning":
        return "".join(part.text for part in item.content or [])
    return ""


@given(arguments, st.sampled_from(["fail", "cancel"]))
@settings(max_examples=30)
def test_a_response_ended_while_a_call_waits_ends_the_call_incomplete(args, how):
    completion = render_completion(
        [
            Message.from_role_and_content(Role.ASSISTANT, args)
            .with_channel("commentary")
            .with_recipient("lab.echo")
            .with_content_type("<|constrain|>json")
        ]
    )
    stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
    stream.server_tools = tools()
    wire = encode_events(stream.start() + stream.feed(TokenBatch(completion, finish_reason="stop", num_prompt_tokens=3)))
    (call,) = stream.unfinished_calls
    assert call.arguments == args
    assert call.namespace == "lab"
    assert call.name == "echo"
    wire += encode_events(stream.run_call(call))
    wire += encode_events(stream.fail("the engine broke") if how == "fail" else stream.cancel())
    events = parse_sse(wire)
    if how == "fail":
        terminal = check_stream(events)
        (item,) = terminal.output
        assert item.type == "mcp_call"
        assert item.status == "incomplete"
        assert item.output is None
    else:  # a cancelled background response has no terminal event: its call ends incomplete all the same
        assert events[-1]["type"] == "response.output_item.done"
        assert events[-1]["item"]["status"] == "incomplete"
        assert "response.mcp_call.completed" not in {e["type"] for e in events}


def test_completed_comes_only_after_the_outcome():
    completion = render_completion(
        [
            Message.from_role_and_content(Role.ASSISTANT, '{"text": "hi"}')
            .with_channel("commentary")
            .with_recipient("lab.echo")
            .with_content_type("<|constrain|>json")
        ]
    )
    stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
    stream.server_tools = tools()
    before = stream.start() + stream.feed(TokenBatch(completion, finish_reason="stop"))
    assert [e.type for e in before][-2:] == ["response.mcp_call_arguments.delta", "response.mcp_call_arguments.done"]
    assert not any(e.type in ("response.mcp_call.completed", "response.output_item.done") for e in before)
    (call,) = stream.unfinished_calls
    after = stream.finish_call(call, ToolOutcome(output="hi"))
    assert [e.type for e in after] == ["response.mcp_call.completed", "response.output_item.done"]
    assert after[-1].item.output == "hi"
    assert json.loads(after[-1].item.arguments) == {"text": "hi"}


def test_an_approval_request_is_done_at_once_and_hands_the_response_back():
    completion = render_completion(
        [
            Message.from_role_and_content(Role.ASSISTANT, "{}")
            .with_channel("commentary")
            .with_recipient("lab.delete")
            .with_content_type("<|constrain|>json")
        ]
    )
    stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
    stream.server_tools = tools()
    events = stream.start() + stream.feed(TokenBatch(completion, finish_reason="stop"))
    terminal = check_stream(parse_sse(encode_events(events)))
    (item,) = terminal.output
    assert item.type == "mcp_approval_request"
    assert item.name == "delete"
    assert item.arguments == "{}"
    assert stream.server_tools.kind_of("lab", "delete") is MCP_APPROVAL_REQUEST


def test_a_listing_and_a_call_run_before_generation():
    stream = ResponseStream(REQUEST, parser_factory=HarmonyParser)
    stream.server_tools = tools()
    wire = encode_events(stream.start())
    listing = stream.open_tool_listing("lab")
    call = stream.add_server_call(MCP_CALL, "lab", "echo", '{"a": 1}', approval_request_id="mcpr_1")
    wire += encode_events(stream.finish_call(call, ToolOutcome(output="1")))  # held behind the listing
    wire += encode_events(stream.finish_tool_listing(listing, [], "unreachable"))
    final = render_completion([Message.from_role_and_content(Role.ASSISTANT, "ok").with_channel("final")])
    stream.next_round(HarmonyParser)
    wire += encode_events(stream.feed(TokenBatch(final, finish_reason="stop")))
    terminal = check_stream(parse_sse(wire))
    assert [i.type for i in terminal.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert terminal.output[0].error == "unreachable"
    assert terminal.output[1].approval_request_id == "mcpr_1"
    assert NOT_FINISHED.output is None
    assert NOT_FINISHED.error is None

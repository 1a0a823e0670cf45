"""The agent frameworks' own clients, unmodified, against a server's `/v1` URL: LangChain's
`ChatOpenAI` and Pydantic AI, each on the Responses API (`use_responses_api=True`,
`OpenAIResponsesModel`) and on Chat Completions (`ChatOpenAI()`'s default,
`OpenAIChatModel`), and LiteLLM's Python client on both (`completion`, `responses`). Each
scenario asserts what the framework hands its user (the replay models echo, call a tool
when asked `call NAME {...}`, and answer `Tool NAME returned: ...` after its output)."""

from __future__ import annotations

import json
import os

from pydantic import BaseModel


class Trip(BaseModel):
    city: str
    days: int


def _text(message) -> str:
    text = message.text
    return text if isinstance(text, str) else text()


def langchain(base_url: str, model: str, use_responses_api: bool = True) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=model, base_url=base_url, api_key="unused", use_responses_api=use_responses_api, max_retries=0)
    assert _text(llm.invoke("hello there")) == "hello there"
    assert "".join(_text(chunk) for chunk in llm.stream("streamed words")) == "streamed words"

    @tool
    def lookup(city: str) -> str:
        """Look up the weather of a city."""
        return f"sunny in {city}"

    bound = llm.bind_tools([lookup])
    asked = HumanMessage('call lookup {"city": "Paris"}')
    called = bound.invoke([asked])
    (call,) = called.tool_calls
    assert (call["name"], call["args"]) == ("lookup", {"city": "Paris"})
    answer = bound.invoke([asked, called, ToolMessage(lookup.invoke(call["args"]), tool_call_id=call["id"])])
    assert _text(answer) == "Tool lookup returned: sunny in Paris"
    trip = llm.with_structured_output(Trip).invoke("Plan a trip")
    assert isinstance(trip, Trip)


def pydantic_ai(base_url: str, model: str, chat: bool = False) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=base_url, api_key="unused")
    responses = OpenAIChatModel(model, provider=provider) if chat else OpenAIResponsesModel(model, provider=provider)
    assert Agent(responses).run_sync("hello pydantic").output == "hello pydantic"
    tooled = Agent(responses)

    @tooled.tool_plain
    def lookup(city: str) -> str:
        """Look up the weather of a city."""
        return f"sunny in {city}"

    assert tooled.run_sync('call lookup {"city": "Paris"}').output == "Tool lookup returned: sunny in Paris"
    assert isinstance(Agent(responses, output_type=Trip).run_sync("Plan a trip").output, Trip)


def langchain_chat(base_url: str, model: str) -> None:
    """LangChain's `ChatOpenAI()` with its defaults: Chat Completions."""
    langchain(base_url, model, use_responses_api=False)


def pydantic_ai_chat(base_url: str, model: str) -> None:
    pydantic_ai(base_url, model, chat=True)


def litellm_chat(base_url: str, model: str) -> None:
    """LiteLLM's Python client with `openai/` and `api_base` (Chat Completions): an answer
    streamed and not, reasoning apart, a stop sequence, and a tool round trip."""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # read at import: its cost map is not fetched from the internet
    import litellm

    ask = {"model": f"openai/{model}", "api_base": base_url, "api_key": "unused", "num_retries": 0}
    answer = litellm.completion(messages=[{"role": "user", "content": "hello litellm"}], **ask)
    message = answer.choices[0].message
    assert (message.content, answer.choices[0].finish_reason) == ("hello litellm", "stop")
    if model == "gpt-oss-replay":
        assert message.reasoning_content == f"The user wrote {len('hello litellm')} characters."
    assert answer.usage.completion_tokens > 0
    chunks = list(litellm.completion(messages=[{"role": "user", "content": "streamed words"}], stream=True, **ask))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == "streamed words"
    rebuilt = litellm.stream_chunk_builder(chunks)
    assert rebuilt.choices[0].message.content == "streamed words"
    stopped = litellm.completion(messages=[{"role": "user", "content": "one two. three"}], stop=["."], **ask)
    assert (stopped.choices[0].message.content, stopped.choices[0].finish_reason) == ("one two", "stop")

    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look up the weather of a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    asked = [{"role": "user", "content": 'call lookup {"city": "Paris"}'}]
    for stream in (False, True):
        if stream:
            called = litellm.stream_chunk_builder(list(litellm.completion(messages=asked, tools=tools, stream=True, **ask)), messages=asked)
        else:
            called = litellm.completion(messages=asked, tools=tools, **ask)
        assert called.choices[0].finish_reason == "tool_calls"
        (call,) = called.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("lookup", {"city": "Paris"})
        back = [*asked, called.choices[0].message.model_dump(), {"role": "tool", "tool_call_id": call.id, "content": "sunny in Paris"}]
        assert litellm.completion(messages=back, tools=tools, **ask).choices[0].message.content == "Tool lookup returned: sunny in Paris"


def litellm_responses(base_url: str, model: str) -> None:
    """LiteLLM's `responses()` with `openai/` and `api_base`: it calls `/v1/responses` itself
    (no bridge through Chat Completions). An answer streamed and not, and a tool round trip
    by `previous_response_id` (LiteLLM wraps the id in one of its own and unwraps it)."""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm

    ask = {"model": f"openai/{model}", "api_base": base_url, "api_key": "unused", "num_retries": 0}
    answer = litellm.responses(input="hello responses", **ask)
    assert answer.output[-1].content[0].text == "hello responses"
    events = list(litellm.responses(input="streamed words", stream=True, **ask))
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == "streamed words"
    assert events[-1].type == "response.completed"
    tools = [
        {
            "type": "function",
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }
    ]
    called = litellm.responses(input='call lookup {"city": "Paris"}', tools=tools, **ask)
    call = called.output[-1]
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "lookup", {"city": "Paris"})
    output = [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny in Paris"}]
    answered = litellm.responses(input=output, previous_response_id=called.id, tools=tools, **ask)
    assert answered.output[-1].content[0].text == "Tool lookup returned: sunny in Paris"


SCENARIOS = [langchain, pydantic_ai, langchain_chat, pydantic_ai_chat, litellm_chat, litellm_responses]

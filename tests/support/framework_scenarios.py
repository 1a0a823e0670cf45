"""The agent frameworks' own clients, unmodified, against a server's `/v1` URL: LangChain's
`ChatOpenAI` and Pydantic AI, each on the Responses API (`use_responses_api=True`,
`OpenAIResponsesModel`) and on Chat Completions (`ChatOpenAI()`'s default,
`OpenAIChatModel`). Each scenario asserts what the framework hands its user (the replay
models echo, call a tool when asked `call NAME {...}`, and answer `Tool NAME returned: ...`
after its output)."""

from __future__ import annotations

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


SCENARIOS = [langchain, pydantic_ai, langchain_chat, pydantic_ai_chat]

"""The OpenAI Agents SDK, unmodified: an agent whose Runner calls a Python tool through the server.

python examples/agents_sdk.py     # against `make serve` at http://127.0.0.1:8000/v1
"""

import asyncio
import os

from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(True)  # traces would go to OpenAI's platform


@function_tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


async def main() -> None:
    client = AsyncOpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"), api_key=os.environ.get("OPENAI_API_KEY", "unused")
    )
    model = OpenAIResponsesModel(model=os.environ.get("MODEL", "gpt-oss-replay"), openai_client=client)
    agent = Agent(name="weather", instructions="Use the tool to answer.", model=model, tools=[get_weather])
    result = await Runner.run(agent, 'call get_weather {"city": "Paris"}')
    print(result.final_output)  # gpt-oss-replay: Tool get_weather returned: sunny in Paris


asyncio.run(main())

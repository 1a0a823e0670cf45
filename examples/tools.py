"""A function-tool round trip: the model calls a tool, the client runs it and sends its output back.

    python examples/tools.py          # against `make serve` at http://127.0.0.1:8000/v1

The replay models call a tool when the user writes `call NAME {json arguments}`; a real model
decides for itself.
"""

import json
import os

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"), api_key=os.environ.get("OPENAI_API_KEY", "unused"))
model = os.environ.get("MODEL", "gpt-oss-replay")

weather = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def get_weather(city: str) -> str:
    return f"sunny in {city}"


response = client.responses.create(model=model, input='call get_weather {"city": "Paris"}', tools=[weather])
for call in [item for item in response.output if item.type == "function_call"]:
    print(f"the model calls {call.name}({call.arguments})")
    output = get_weather(**json.loads(call.arguments))
    # Continue on the server: only the new item goes up, the history is the stored response's.
    response = client.responses.create(
        model=model,
        tools=[weather],
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": output}],
    )
print(response.output_text)  # gpt-oss-replay: Tool get_weather returned: sunny in Paris

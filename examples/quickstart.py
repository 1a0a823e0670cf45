"""A response, then a follow-up that continues it on the server (`previous_response_id`).

    python examples/quickstart.py     # against `make serve` at http://127.0.0.1:8000/v1

OPENAI_BASE_URL, OPENAI_API_KEY and MODEL change the server, the key and the model.
"""

import os

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"), api_key=os.environ.get("OPENAI_API_KEY", "unused"))
model = os.environ.get("MODEL", "gpt-oss-replay")

response = client.responses.create(model=model, input="Hello, 世界!")
print([item.type for item in response.output])  # gpt-oss-replay: ['reasoning', 'message']
print(response.output_text)  # the replay echoes the input: Hello, 世界!

follow_up = client.responses.create(model=model, input="And once more.", previous_response_id=response.id)
print(follow_up.output_text)
print(f"input tokens: {response.usage.input_tokens} -> {follow_up.usage.input_tokens}")  # the second prompt holds the first turn

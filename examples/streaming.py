"""Streaming: the SDK's event accumulator, and the raw server-sent events.

python examples/streaming.py      # against `make serve` at http://127.0.0.1:8000/v1
"""

import os

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"), api_key=os.environ.get("OPENAI_API_KEY", "unused"))
model = os.environ.get("MODEL", "gpt-oss-replay")

# client.responses.stream(): typed events, then the final response assembled from them.
with client.responses.stream(model=model, input="Stream me, please.") as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            print(event.delta, end="", flush=True)
    print()
    final = stream.get_final_response()
print(final.status, final.usage.output_tokens, "output tokens")

# stream=True: every event as it arrives, numbered from 0 without gaps.
for event in client.responses.create(model=model, input="Count my events.", stream=True):
    print(event.sequence_number, event.type)

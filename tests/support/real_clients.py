"""The real clients, unmodified, against a running server (`make serve`'s own config):

    make serve &   # then, once it is ready:
    .venv/bin/python -m tests.support.real_clients http://localhost:8000/v1

LangChain, Pydantic AI and LiteLLM (Responses and Chat Completions), the Vercel AI SDK, the
Agents SDK's compaction session, Codex `exec`, and the `openai` SDK for custom tools,
compaction, Chat Completions, files, images and file search, on both replay families. Prints
one line a check and `passed / all`; exits 1 when one failed. (The test suite runs the same
scenarios in-process and against its own Serve app; this runs them against the config users
start.) Codex needs a URL other than 127.0.0.1's `localhost` alias of its example config.
"""

from __future__ import annotations

import base64
import io
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from openai import OpenAI

from tests.support.vector_stores import ingested

MODELS = ["gpt-oss-replay", "qwen3-replay"]
VERCEL = ["generate-store", "stream-store", "generate-stateless", "structured", "previous-response", "chat-generate", "chat-stream"]


def run_all(url: str) -> list[tuple[str, str | None]]:
    from tests.server.test_codex_cli import codex_exec
    from tests.support import framework_scenarios
    from tests.support.bg_scenarios import agents_session
    from tests.support.clients import vercel_ai

    results: list[tuple[str, str | None]] = []

    def check(name: str, scenario: Callable[[], object]) -> None:
        try:
            scenario()
            results.append((name, None))
        except Exception as exc:  # every failure is reported, none stops the run
            results.append((name, f"{type(exc).__name__}: {str(exc)[:300]}"))
            traceback.print_exc(limit=3)

    client = OpenAI(base_url=url, api_key="sk-unused", max_retries=0)
    for model in MODELS:
        for framework in framework_scenarios.SCENARIOS:
            check(f"{framework.__name__} {model}", lambda f=framework, m=model: f(url, m))
        for name in VERCEL:
            check(f"vercel {name} {model}", lambda n=name, m=model: _ok(vercel_ai(url, m, n, "sk-unused")))
        check(f"agents sdk compaction session {model}", lambda m=model: agents_session(url, m))
        check(f"custom tool {model}", lambda m=model: _custom_tool(client, m))
        check(f"compact {model}", lambda m=model: _compact(client, m))
        check(f"chat {model}", lambda m=model: _chat(client, m))
        check(f"input_file {model}", lambda m=model: _input_file(client, m))
        check(f"file_search {model}", lambda m=model: _file_search(client, m))
    check("input_image qwen3-vl-replay", lambda: _input_image(client))
    check("input_file pages as images qwen3-vl-replay", lambda: _pdf_pages(client))

    def codex() -> None:
        with tempfile.TemporaryDirectory() as work:
            answer = codex_exec(url, Path(work), "Hello from codex")
            assert answer == "Hello from codex", answer

    check("codex exec", codex)
    return results


def _ok(run: dict) -> None:
    assert run["ok"], run


def _custom_tool(client: OpenAI, model: str) -> None:
    response = client.responses.create(model=model, input="call apply_patch *** patch", tools=[{"type": "custom", "name": "apply_patch"}])
    call = response.output[-1]
    assert call.type == "custom_tool_call", response.output
    assert call.input == "*** patch", call


def _compact(client: OpenAI, model: str) -> None:
    assert client.responses.compact(model=model, input="Remember: x is 1.").output[-1].type == "compaction"


def _chat(client: OpenAI, model: str) -> None:
    completion = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi there"}])
    assert completion.choices[0].message.content == "hi there", completion


def _input_file(client: OpenAI, model: str) -> None:
    from tests.support.pdfs import text_pdf

    file = client.files.create(file=("report.pdf", io.BytesIO(text_pdf(["Revenue was 42 million."]))), purpose="user_data")
    try:
        content = [{"type": "input_text", "text": "What does it say?"}, {"type": "input_file", "file_id": file.id}]
        response = client.responses.create(model=model, input=[{"role": "user", "content": content}])  # type: ignore[misc,list-item]
        assert "Revenue was 42 million." in response.output_text, response.output_text
    finally:
        client.files.delete(file.id)


def _file_search(client: OpenAI, model: str) -> None:
    file = client.files.create(file=("facts.txt", io.BytesIO(b"The capital of Atlantis is Poseidonia.")), purpose="assistants")
    store = client.vector_stores.create(name="facts", file_ids=[file.id])
    try:
        ingested(client, store.id)  # ingestion runs in the background
        found = client.vector_stores.search(store.id, query="capital of Atlantis")
        assert found.data, "the search found nothing"
        response = client.responses.create(
            model=model,
            input='call file_search {"query": "capital of Atlantis"}',
            tools=[{"type": "file_search", "vector_store_ids": [store.id]}],
        )
        assert any(item.type == "file_search_call" for item in response.output), response.output
        forced = client.responses.create(  # asked in words: tool_choice makes it search
            model=model,
            input="What is the capital of Atlantis?",
            tools=[{"type": "file_search", "vector_store_ids": [store.id]}],
            tool_choice={"type": "file_search"},
        )
        assert [item.type for item in forced.output if item.type != "reasoning"] == ["file_search_call", "message"], forced.output
    finally:
        client.vector_stores.delete(store.id)
        client.files.delete(file.id)


def _input_image(client: OpenAI) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), "red").save(buffer, format="PNG")
    data_url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    content = [{"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": data_url, "detail": "auto"}]
    response = client.responses.create(model="qwen3-vl-replay", input=[{"role": "user", "content": content}])  # type: ignore[misc,list-item]
    assert response.output_text == "I see 1 image: 64x48.", response.output_text


def _pdf_pages(client: OpenAI) -> None:
    """A vision model sees a PDF's pages as images too (drawn in the ingress replica's renderer process)."""
    from tests.support.pdfs import text_pdf

    content = [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_file", "filename": "two.pdf", "file_data": _pdf_data(text_pdf(["one", "two"]))},
    ]
    response = client.responses.create(model="qwen3-vl-replay", input=[{"role": "user", "content": content}])  # type: ignore[misc,list-item]
    assert response.output_text.startswith("I see 2 images"), response.output_text


def _pdf_data(pdf: bytes) -> str:
    return "data:application/pdf;base64," + base64.b64encode(pdf).decode()


def main() -> None:
    results = run_all(sys.argv[1] if len(sys.argv) > 1 else "http://localhost:8000/v1")
    for name, failure in results:
        print(f"{'ok  ' if failure is None else 'FAIL'} {name}{'' if failure is None else ': ' + failure}")
    passed = sum(failure is None for _, failure in results)
    print(f"{passed} / {len(results)}")
    sys.exit(0 if passed == len(results) else 1)


if __name__ == "__main__":
    main()

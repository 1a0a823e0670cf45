"""The schema-driven fuzzer: schemathesis generates requests from the app's own `/openapi.json`
and sends them to the app in-process (ASGI, no Ray), for every POST operation the schema
describes: (a) no generated request, valid or not, gets a 5xx; (b) every request the schema
allows is accepted, unless it breaks one of the operation's `x-unstated-rules` (a rule the
schema cannot state: its 4xx must name a parameter the rule names). The app's request limits
are small, so the fuzzer reaches them.

200 examples of each operation and mode: seconds each, so the test is marked slow.
"""

from __future__ import annotations

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core.errors import InvalidSchema

from serve_app.api.limits import RequestLimits
from serve_app.config import FilesConfig, ModelConfig, VectorStoresConfig
from serve_app.config.files import BlobConfig
from serve_app.engines import make_backend
from serve_app.engines.replay import ReplayBackend
from serve_app.runtime.models import served_model
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.server.openapi import OPERATIONS
from tests.conftest import QWEN3_REPLAY, QWEN3_VL_REPLAY

# Small, so that generated requests reach them (each at the least its setting allows).
LIMITS = RequestLimits(
    max_input_items=6,
    max_tools=5,
    max_array_items=6,
    max_text_chars=1024,
    max_id_chars=64,
    max_metadata_pairs=3,
    max_metadata_key_chars=8,
    max_metadata_value_chars=16,
    max_image_url_chars=2048,
)
POSTS = sorted(path for path, method in OPERATIONS if method == "post")
# Refused requests of an operation without a body: only its path, which is fixed here.
REFUSABLE = [path for path in POSTS if OPERATIONS[(path, "post")].body is not None]
EXAMPLES = 200


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """Both families (the qwen3 one from its config, as a Serve replica builds it), both
    taking raw prompts, one that does not, a vision model (images are read): an anonymous
    caller without quotas (no 429s); files and vector stores in directories of the test's."""
    root = tmp_path_factory.mktemp("fuzz")
    qwen3 = ModelConfig.model_validate({**QWEN3_REPLAY, "raw_prompts": True})
    vision = ModelConfig.model_validate(QWEN3_VL_REPLAY)
    models = [
        ServedModel("gpt-oss-replay", ReplayBackend(), raw_prompts=True),
        served_model(qwen3, make_backend(qwen3.backend)),
        ServedModel("templated-only", ReplayBackend()),
        served_model(vision, make_backend(vision.backend)),
    ]
    settings = ServerSettings(
        request_limits=LIMITS,
        max_request_bytes=256 * 1024,
        files=FilesConfig(blob=BlobConfig(path=str(root / "blobs"))),
        vector_stores=VectorStoresConfig(directory=str(root / "index")),
    )
    return create_app(models, settings)


@pytest.fixture(scope="module")
def schema(app):
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module")
def stored(app):
    """A conversation, a finished background response, a vector store with a file and a file
    batch, for the operations on one."""
    from fastapi.testclient import TestClient

    with TestClient(app) as http:
        conversation = http.post("/v1/conversations", json={}).json()["id"]
        response = http.post("/v1/responses", json={"model": "gpt-oss-replay", "input": "hi", "background": True}).json()["id"]
        upload = http.post("/v1/files", files={"file": ("notes.txt", b"Zebras migrate in July.")}, data={"purpose": "assistants"})
        file_id = upload.json()["id"]
        vector_store = http.post("/v1/vector_stores", json={"name": "notes", "file_ids": [file_id]}).json()["id"]
        batch = http.post(f"/v1/vector_stores/{vector_store}/file_batches", json={"file_ids": [file_id]}).json()["id"]
    return {
        "conversation_id": conversation,
        "response_id": response,
        "vector_store_id": vector_store,
        "file_id": file_id,
        "batch_id": batch,
    }


def _explain(case, response) -> str:
    body = json.dumps(case.body)[:2000] if isinstance(case.body, (dict, list, str, int, float, bool)) else ""
    return f"{case.method} {case.path} {body}\n-> {response.status_code} {response.text[:1000]}"


def fuzz(schema, stored, path: str, mode: GenerationMode, examples: int) -> None:
    operation = schema[path]["POST"]
    rules = OPERATIONS[(path, "post")].rules
    params = {name: value for name, value in stored.items() if "{" + name + "}" in path}

    cases = operation.as_strategy(generation_mode=mode, path_parameters=params)
    made: list[object] = []

    @given(data=st.data())
    @settings(max_examples=examples, suppress_health_check=list(HealthCheck), deadline=None)
    def run(data) -> None:
        try:
            case = data.draw(cases)
        except InvalidSchema as exc:  # schemathesis's own limit when it mutates a schema, not ours
            if "Cannot generate" not in str(exc):
                raise
            assume(False)
        made.append(case)
        response = case.call()
        assert response.status_code < 500, _explain(case, response)
        if response.status_code >= 400:
            error = response.json()["error"]  # OpenAI's shape, whatever went wrong
            assert set(error) >= {"message", "type", "param", "code"}, _explain(case, response)
            if mode == GenerationMode.POSITIVE:
                assert any(rule.matches(response.status_code, error["param"]) for rule in rules), _explain(case, response)

    run()
    assert made, "schemathesis generated no request"


CASES = [pytest.param(path, GenerationMode.POSITIVE, id=f"allowed-{path}") for path in POSTS]
CASES += [pytest.param(path, GenerationMode.NEGATIVE, id=f"refused-{path}") for path in REFUSABLE]


@pytest.mark.slow  # seconds per operation: make test runs it, make test-fast does not
@pytest.mark.parametrize(("path", "mode"), CASES)
def test_the_schema_and_the_server_agree(schema, stored, path, mode):
    fuzz(schema, stored, path, mode, EXAMPLES)

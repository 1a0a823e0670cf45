"""`/openapi.json`: every POST route's body, from the models the routes validate with,
within the app's `request_limits` and naming the models it serves; what the schema allows
and refuses, checked against the server's own answers (the fuzzer, test_openapi_fuzz.py,
does the same with generated requests)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from serve_app.api.limits import RequestLimits
from serve_app.config import FilesConfig, VectorStoresConfig
from serve_app.config.files import BlobConfig
from serve_app.engines.replay import ReplayBackend
from serve_app.server.app import ServedModel, ServerSettings, create_app
from serve_app.server.openapi import OPERATIONS

LIMITS = RequestLimits(
    max_input_items=7, max_tools=5, max_array_items=9, max_id_chars=80, max_metadata_pairs=3, max_text_chars=2000, max_image_url_chars=4096
)


@pytest.fixture(scope="module")
def http():
    models = [ServedModel("chat-only", ReplayBackend()), ServedModel("raw-too", ReplayBackend(), raw_prompts=True)]
    with TestClient(create_app(models, ServerSettings(request_limits=LIMITS))) as client:
        yield client


@pytest.fixture(scope="module")
def document(http):
    response = http.get("/openapi.json")
    assert response.status_code == 200
    return response.json()


def body_schema(document: dict, path: str) -> dict:
    return document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def validator(document: dict, path: str) -> jsonschema.Draft202012Validator:
    """The body schema of `path`, its references resolved in the document."""
    return jsonschema.Draft202012Validator({**document, **body_schema(document, path)})


def component(document: dict, path: str) -> dict:
    return document["components"]["schemas"][body_schema(document, path)["$ref"].rsplit("/", 1)[-1]]


def test_every_post_route_is_described(http, document):
    posts = {route.path for route in http.app.routes if isinstance(route, APIRoute) and "POST" in route.methods}
    assert posts == {path for path, method in OPERATIONS if method == "post"}
    for path in posts:
        operation = document["paths"][path]["post"]
        assert set(operation["responses"]) >= {"200", "400", "404", "429", "503"}
        if OPERATIONS[(path, "post")].body is not None:
            assert "$ref" in body_schema(document, path)


def test_the_limits_and_the_models_are_the_apps(document):
    responses = component(document, "/v1/responses")["properties"]
    assert responses["model"]["enum"] == ["chat-only", "raw-too"]
    assert component(document, "/v1/completions")["properties"]["model"]["enum"] == ["raw-too"]
    (items,) = [branch for branch in responses["input"]["anyOf"] if branch.get("type") == "array"]
    assert items["maxItems"] == LIMITS.max_input_items
    assert responses["tools"]["maxItems"] == LIMITS.max_tools
    (metadata,) = [branch for branch in responses["metadata"]["anyOf"] if branch.get("type") == "object"]
    assert metadata["maxProperties"] == LIMITS.max_metadata_pairs
    (user,) = [branch for branch in responses["user"]["anyOf"] if branch.get("type") == "string"]
    assert user["maxLength"] == LIMITS.max_id_chars
    (instructions,) = [branch for branch in responses["instructions"]["anyOf"] if branch.get("type") == "string"]
    assert instructions["maxLength"] == LIMITS.max_text_chars


OK = {"model": "chat-only", "input": "hi"}
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}
# Bodies the server refuses and the schema states why (each: the body, the server's param).
REFUSED = [
    ({"model": "nobody", "input": "hi"}, "model"),
    ({**OK, "input": ""}, "input"),
    ({**OK, "input": [{"role": "user", "content": "x"}] * 8}, "input"),
    ({**OK, "user": "u" * 81}, "user"),
    ({**OK, "instructions": "i" * 2001}, "instructions"),
    ({**OK, "metadata": {"a": "1", "b": "2", "c": "3", "d": "4"}}, "metadata"),
    ({**OK, "tools": [TOOL] * 6}, "tools"),
    ({**OK, "include": ["message.output_text.logprobs"] * 10}, "include"),
    ({**OK, "background": True, "store": False}, "background"),
    ({**OK, "conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation"),
    ({**OK, "tool_choice": {"type": "teleport"}}, "tool_choice.type"),
    ({**OK, "tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]}, "tools[0].parameters"),
    ({**OK, "input": [{"role": "user", "content": "x", "phase": "final_answer"}]}, "input[0]"),
    ({**OK, "input": [{"type": "function_call", "call_id": "c", "name": "f x", "arguments": "{}"}]}, "input[0].name"),
    ({**OK, "text": {"format": {}}}, "text.format"),
    ({**OK, "tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].vector_store_ids"),
    (
        {**OK, "tools": [{"type": "file_search", "vector_store_ids": ["vs_1"], "filters": {"type": "eq", "key": "", "value": 1}}]},
        "tools[0].filters.key",
    ),
    (
        {
            **OK,
            "tools": [
                {
                    "type": "file_search",
                    "vector_store_ids": ["vs_1"],
                    "ranking_options": {"hybrid_search": {"embedding_weight": 0, "text_weight": 0}},
                }
            ],
        },
        "tools[0].ranking_options",
    ),
    ({**OK, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u", "file_id": "f"}]}]}, "input[0].content[0]"),
    ({**OK, "input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input[0].content[0]"),
    ({**OK, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "d" * 4097}]}]}, "input[0].content[0]"),
]


def test_an_image_url_is_bounded_by_its_own_limit(document):
    """`max_image_url_chars`, not `max_text_chars`: a data URL holds the image."""
    image = {"type": "input_image", "image_url": "data:image/png;base64," + "A" * 3000}
    assert validator(document, "/v1/responses").is_valid({**OK, "input": [{"role": "user", "content": [image]}]})
    chat = {"type": "image_url", "image_url": {"url": image["image_url"]}}
    body = {"model": "chat-only", "messages": [{"role": "user", "content": [chat]}]}
    assert validator(document, "/v1/chat/completions").is_valid(body)
    chat["image_url"]["url"] = "d" * 4097
    assert not validator(document, "/v1/chat/completions").is_valid(body)


@pytest.mark.parametrize(("body", "param"), REFUSED, ids=[param for _, param in REFUSED])
def test_what_the_server_refuses_the_schema_refuses(http, document, body, param):
    response = http.post("/v1/responses", json=body)
    assert response.status_code in (400, 404), response.text
    assert response.json()["error"]["param"] == param
    assert not validator(document, "/v1/responses").is_valid(body)


ACCEPTED = [
    ("/v1/responses", OK),
    (
        "/v1/responses",
        {**OK, "tools": [TOOL, {"type": "web_search"}], "tool_choice": {"type": "web_search_preview"}, "metadata": {"k": "v"}},
    ),
    ("/v1/responses", {**OK, "input": [{"id": "msg_1", "role": "user", "content": "x"}]}),
    ("/v1/responses", {**OK, "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}}}),
    (
        "/v1/responses",
        {
            **OK,
            "tools": [{"type": "file_search", "vector_store_ids": ["vs_1"], "filters": {"type": "in", "key": "k", "value": ["a", 1]}}],
            "tool_choice": {"type": "file_search"},
        },
    ),
    ("/v1/responses/input_tokens", OK),
    ("/v1/responses/compact", {"model": "raw-too", "input": "hello"}),
    (
        "/v1/chat/completions",
        {"model": "chat-only", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": TOOL}]},
    ),
    ("/v1/completions", {"model": "raw-too", "prompt": "Once", "max_tokens": 3}),
    ("/v1/conversations", {"metadata": {"a": "b"}, "items": [{"role": "user", "content": "hi"}]}),
]


@pytest.mark.parametrize(("path", "body"), ACCEPTED, ids=[path for path, _ in ACCEPTED])
def test_what_the_schema_allows_the_server_takes(http, document, path, body):
    validator(document, path).validate(body)
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text


NOT_AS_RETURNED = [
    {"type": "code_interpreter_call", "status": "", "outputs": [{}]},
    {"type": "file_search_call", "status": "", "queries": []},
    {"type": "file_search_call", "status": "completed", "queries": ["q"], "results": [{"score": "high"}]},
]


@pytest.mark.parametrize("item", NOT_AS_RETURNED, ids=lambda item: item["type"])
def test_a_hosted_item_not_as_returned_is_a_400_in_a_conversation_too(http, document, item):
    """Found by the fuzzer: the item was stored, then failed to be shown as the SDK's (a 500)."""
    conversation = http.post("/v1/conversations", json={}).json()["id"]
    response = http.post(f"/v1/conversations/{conversation}/items", json={"items": [item]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].startswith("items[0]")
    assert not validator(document, "/v1/conversations/{conversation_id}/items").is_valid({"items": [item]})
    assert http.get(f"/v1/conversations/{conversation}/items").json()["data"] == []


@pytest.fixture(scope="module")
def stores_http(tmp_path_factory):
    """An app with the Files API in a directory and vector stores."""
    root = tmp_path_factory.mktemp("openapi-stores")
    settings = ServerSettings(
        request_limits=LIMITS,
        files=FilesConfig(blob=BlobConfig(path=str(root / "blobs"))),
        vector_stores=VectorStoresConfig(directory=str(root / "index")),
    )
    with TestClient(create_app([ServedModel("chat-only", ReplayBackend())], settings)) as client:
        yield client


@pytest.fixture(scope="module")
def vector_store(stores_http) -> str:
    return stores_http.post("/v1/vector_stores", json={"name": "docs"}).json()["id"]


STATIC = {"type": "static", "static": {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": 50}}
# Vector Stores bodies the server refuses and the schema states why: (path, body, the server's param).
STORE_REFUSED = [
    ("/v1/vector_stores", {"chunking_strategy": {"type": "static"}}, "chunking_strategy"),
    ("/v1/vector_stores", {"chunking_strategy": {**STATIC, "type": "auto"}}, "chunking_strategy"),
    ("/v1/vector_stores", {"metadata": {"a": "1", "b": "2", "c": "3", "d": "4"}}, "metadata"),
    ("/v1/vector_stores/{id}/file_batches", {"file_ids": ["file-1"], "files": [{"file_id": "file-1"}]}, "files"),
    ("/v1/vector_stores/{id}/file_batches", {}, "files"),
    ("/v1/vector_stores/{id}/files", {"file_id": "file-1", "attributes": {"k": {"nested": 1}}}, "attributes"),
    ("/v1/vector_stores/{id}/files", {"file_id": "file-1", "attributes": {"k" * 65: 1}}, "attributes"),
    ("/v1/vector_stores/{id}/search", {"query": ["q"] * 9}, "query"),
    ("/v1/vector_stores/{id}/search", {"query": []}, "query"),
]


@pytest.mark.parametrize(("path", "body", "param"), STORE_REFUSED, ids=[f"{path}-{param}" for path, _, param in STORE_REFUSED])
def test_what_the_vector_stores_api_refuses_the_schema_refuses(stores_http, document, vector_store, path, body, param):
    response = stores_http.post(path.replace("{id}", vector_store), json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert not validator(document, path.replace("{id}", "{vector_store_id}")).is_valid(body)


STORE_ACCEPTED = [
    ("/v1/vector_stores", {"name": "n", "metadata": {"k": "v"}, "chunking_strategy": STATIC}),
    ("/v1/vector_stores/{id}", {"name": None, "metadata": None, "expires_after": None}),  # found by the fuzzer: a 500
    ("/v1/vector_stores/{id}/files", {"file_id": "file-1", "attributes": {"dept": "x", "year": 2025, "draft": False}}),
    ("/v1/vector_stores/{id}/file_batches", {"files": [{"file_id": "file-2", "chunking_strategy": {"type": "auto"}}]}),
    (
        "/v1/vector_stores/{id}/search",
        {"query": ["zebras", "july"], "filters": {"type": "and", "filters": [{"type": "gte", "key": "year", "value": 2024}]}},
    ),
]


@pytest.mark.parametrize(("path", "body"), STORE_ACCEPTED, ids=[path for path, _ in STORE_ACCEPTED])
def test_what_the_vector_stores_schema_allows_the_server_takes(stores_http, document, vector_store, path, body):
    validator(document, path.replace("{id}", "{vector_store_id}")).validate(body)
    # a file named is one of the caller's: the placeholders become uploads (quoted: an upload's
    # id may itself begin with "file-2")
    text = json.dumps(body)
    for placeholder in ('"file-1"', '"file-2"'):
        if placeholder in text:
            uploaded = stores_http.post("/v1/files", files={"file": ("a.txt", b"some text")}, data={"purpose": "assistants"})
            text = text.replace(placeholder, json.dumps(uploaded.json()["id"]))
    response = stores_http.post(path.replace("{id}", vector_store), json=json.loads(text))
    assert response.status_code == 200, response.text


def test_a_vector_store_updated_with_a_null_name_has_none(stores_http, vector_store):
    updated = stores_http.post(f"/v1/vector_stores/{vector_store}", json={"name": None})
    assert updated.status_code == 200, updated.text
    assert updated.json()["name"] == ""

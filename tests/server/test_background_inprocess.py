"""Background responses and conversations with the official SDKs against the FastAPI app
served in-process (uvicorn, no Ray): every endpoint and error case, fast."""

from __future__ import annotations

import uuid

import pytest

from tests.support import bg_scenarios
from tests.support.servers import uvicorn_server

MODEL = "gpt-oss-replay"
SLOW = "gpt-oss-replay-slow"


@pytest.fixture(scope="module")
def slow_backend():
    from serve_app.engines.replay import ReplayBackend, ReplayConfig

    return ReplayBackend(ReplayConfig(step_delay_s=0.01))


@pytest.fixture(scope="module", params=["memory", "redis"])
def bg_url(request, replay_backend, slow_backend):
    """A fast and a slow scripted gpt-oss (for runs that must still be going when cancelled),
    on each store backend: in-process memory and a real redis-server."""
    from serve_app.server.app import ServedModel, create_app
    from serve_app.state.redis import RedisStore

    store = None
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        store = RedisStore(server.url, password=server.password, key_prefix=f"test-{uuid.uuid4().hex}:")
    app = create_app([ServedModel(MODEL, replay_backend), ServedModel(SLOW, slow_backend)], store=store)
    with uvicorn_server(app) as url:
        yield url


def test_background_poll(bg_url):
    bg_scenarios.background_poll(bg_url, MODEL)


def test_background_cancel_stops_the_engine(bg_url, slow_backend):
    bg_scenarios.background_cancel(bg_url, SLOW)
    assert slow_backend.num_running() == 0


def test_cancel_before_any_output(bg_url, slow_backend):
    bg_scenarios.background_cancel_at_once(bg_url, SLOW)
    assert slow_backend.num_running() == 0


def test_delete_while_running_stops_the_engine(bg_url, slow_backend):
    bg_scenarios.background_delete_while_running(bg_url, SLOW)
    assert slow_backend.num_running() == 0


@pytest.mark.slow
def test_background_stream_cut_and_resumed(bg_url):
    bg_scenarios.background_stream_resume(bg_url, SLOW)


def test_background_errors(bg_url):
    bg_scenarios.background_errors(bg_url, MODEL)


def test_conversations_crud(bg_url):
    bg_scenarios.conversations_crud(bg_url)


def test_conversation_items(bg_url):
    bg_scenarios.conversation_items(bg_url)


def test_responses_in_a_conversation(bg_url):
    bg_scenarios.responses_in_a_conversation(bg_url, MODEL)


def test_concurrent_turns(bg_url):
    bg_scenarios.concurrent_turns(bg_url, MODEL)


def test_agents_sdk_conversations_session(inprocess_url):
    bg_scenarios.agents_session(inprocess_url, MODEL)


@pytest.mark.slow
@pytest.mark.parametrize("drain_s", [60.0, 0.0])
def test_shutdown_waits_for_background_runs(replay_backend, drain_s):
    """Stopping the app (Serve stops a replica the same way: ASGI lifespan shutdown) waits
    for its background runs up to `background_drain_s`, then ends the rest as failed: none
    is left in_progress."""
    from serve_app.engines.replay import ReplayBackend, ReplayConfig
    from serve_app.server.app import ServedModel, ServerSettings, create_app
    from serve_app.state import MemoryStore

    store = MemoryStore()
    slow = ReplayBackend(ReplayConfig(step_delay_s=0.005))
    app = create_app([ServedModel(SLOW, slow)], ServerSettings(background_drain_s=drain_s), store=store)
    with uvicorn_server(app) as url:
        created = bg_scenarios.client(url).responses.create(model=SLOW, input=bg_scenarios.LONG_TEXT, background=True)
    assert slow.num_running() == 0
    with uvicorn_server(create_app([ServedModel(MODEL, replay_backend)], store=store)) as url:  # the next replica
        after = bg_scenarios.client(url).responses.retrieve(created.id)
    if drain_s:
        assert after.status == "completed"
        assert after.output_text == bg_scenarios.LONG_TEXT
    else:
        assert after.status == "failed"
        assert "shut down" in after.error.message

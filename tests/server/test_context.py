"""One home per concept: an app's settings are one `ServerSettings`, built from the config in
one place (`ServerSettings.from_config`), and what its routes share is one `AppContext`, the
app's only state attribute."""

from __future__ import annotations

import dataclasses

import pytest
from fastapi import FastAPI

from serve_app.config import AppConfig
from serve_app.core.encrypted_reasoning import ReasoningCipher
from serve_app.engines.replay import ReplayBackend
from serve_app.server.app import AppContext, ServedModel, ServerSettings, create_app
from serve_app.server.context import app_context


def test_the_context_is_the_apps_only_state():
    settings = ServerSettings(max_request_bytes=4096)
    app = create_app([ServedModel("m", ReplayBackend())], settings)
    assert set(vars(app.state)["_state"]) == {"context"}
    context = app_context(app)
    assert isinstance(context, AppContext)
    assert context.settings is settings
    assert list(context.served) == ["m"]
    assert (context.websockets_open, context.websockets_by_tenant, context.tenanted) == (0, {}, False)


def test_an_app_not_made_by_create_app_has_no_context():
    with pytest.raises(TypeError, match="create_app"):
        app_context(FastAPI())


def test_settings_from_config_take_every_server_field_of_the_config():
    config = AppConfig.model_validate(
        {
            "models": [{"name": "m"}],
            "auth": {"keys": [{"tenant": "t", "key_env": "KEY"}]},
            "max_request_bytes": 4096,
            "request_limits": {"max_tools": 3},
            "replica_limits": {"max_websockets": 5},
            "store": {"timeout_s": 0.5, "ttl_s": 60, "cache_bytes": 0},
            "max_stream_duration_s": 30,
            "sse_keepalive_s": 0,
            "tools": {"max_calls_per_response": 2},
        }
    )
    settings = ServerSettings.from_config(config, listen_host="0.0.0.0", replica_id="r1", background_drain_s=3.0, reasoning_keys=["k"])
    assert settings == ServerSettings(
        store_timeout_s=0.5,
        store_ttl_s=60,
        store_cache_bytes=0,
        auth=config.auth,
        listen_host="0.0.0.0",
        max_request_bytes=4096,
        request_limits=config.request_limits,
        replica_limits=config.replica_limits,
        replica_id="r1",
        background_drain_s=3.0,
        reasoning_keys=["k"],
        max_stream_duration_s=30,
        sse_keepalive_s=0,
        tools=config.tools,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_request_bytes = 1  # type: ignore[misc]


def test_reasoning_keys_are_not_in_the_settings_repr():
    key = ReasoningCipher.generate_key()
    assert key not in repr(ServerSettings(reasoning_keys=[key]))

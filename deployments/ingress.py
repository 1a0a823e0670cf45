"""ResponsesIngress: the FastAPI app of `serve_app.api`, talking to engines through handles.

Prompt rendering and token parsing happen here, on CPU replicas; engine replicas only
turn prompt tokens into token batches.
"""

from __future__ import annotations

import logging
import os
from typing import AsyncIterator

from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from deployments import use_serve_logging
from serve_app.api import ModelFamily, ServedModel, create_app
from serve_app.config import AppConfig, ModelConfig, StoreConfig
from serve_app.protocol.harmony import HarmonyModel
from serve_app.protocol.tokens import GenerationRequest, TokenBatch
from serve_app.reasoning_keys import reasoning_keys
from serve_app.state import MemoryStore, Store

logger = logging.getLogger("ray.serve")

# Failures that mean "this replica is gone", worth one retry elsewhere if nothing was sent yet.
_REPLICA_GONE = (ActorDiedError, ActorUnavailableError, RayActorError, BackPressureError)


class HandleTokenSource:
    """`TokenSource` over an `EngineServer` deployment handle (Ray object streaming)."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self._handle = handle.options(stream=True)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenBatch]:
        for attempt in (1, 2):
            response = self._handle.generate.remote(request)
            received = ended = False
            try:
                async for batch in response:
                    received = True
                    yield batch
                ended = True
                return
            except _REPLICA_GONE as exc:
                if received or attempt == 2:
                    raise
                logger.warning("request %s: engine replica unavailable before the first token (%s); retrying once", request.request_id, exc)
            finally:
                # A client that went away (or an error) must stop the engine's generator too;
                # a stream read to its end needs no cancel (that would be a Ray call per request).
                if not ended:
                    response.cancel()


def model_family(model: ModelConfig) -> ModelFamily:
    """Prompt rendering and completion parsing for a configured model (built on the replica)."""
    if model.family == "harmony":
        return HarmonyModel()
    from serve_app.protocol.chat_template import ChatTemplateModel
    from serve_app.smollm2 import load_tokenizer

    settings = model.chat_template
    assert settings is not None  # the config fills it in for this family
    return ChatTemplateModel(
        load_tokenizer(model.tokenizer),
        template=settings.template,
        reasoning_parser=settings.reasoning_parser,
        tool_parser=settings.tool_parser,
        template_kwargs=settings.template_kwargs,
    )


def open_store(config: StoreConfig, embedded: DeploymentHandle | None) -> Store:
    """The configured store backend, as seen from an ingress replica."""
    if config.type == "memory":
        return MemoryStore(max_entries=config.max_entries, max_bytes=config.max_bytes)
    if config.type == "redis":
        from serve_app.state.redis import RedisStore

        url = config.redis_url()
        assert url, "checked when the app was built"
        password = os.environ.get(config.password_env) or None
        return RedisStore(url, password=password, key_prefix=config.key_prefix, timeout_s=config.timeout_s)
    from deployments.store import HandleStore

    assert embedded is not None, "build_app binds the store deployment"
    return HandleStore(embedded)


SERVE_GRACEFUL_SHUTDOWN_S = 20.0  # Serve's default graceful_shutdown_timeout_s


def background_drain_s(config: AppConfig) -> float:
    """How long a stopping ingress replica waits for its background runs: the replica's
    graceful shutdown budget, less a margin for the rest of its shutdown (Serve kills it
    when the budget is spent; what is left by then is failed by lease expiry)."""
    budget = config.ingress.graceful_shutdown_timeout_s
    return max(1.0, (SERVE_GRACEFUL_SHUTDOWN_S if budget is None else budget) - 5.0)


@serve.ingress()
class ResponsesIngress:
    """Ray Serve deployment class; the app is built on the replica from the typed config."""

    def __init__(
        self,
        app_config: dict,
        engines: dict[str, DeploymentHandle],
        store: DeploymentHandle | None = None,
        reasoning_key: str | None = None,
    ) -> None:
        """`store`: the embedded store deployment, if configured. `reasoning_key`: the
        application's own key for encrypted reasoning, made by `build_app` so that all
        replicas share it; used only without configured keys."""
        use_serve_logging()
        self.config = AppConfig.model_validate(app_config)
        self.engines = engines
        self.store = store
        self.reasoning_key = reasoning_key

    def __serve_build_asgi_app__(self):
        models = [
            ServedModel(model.name, HandleTokenSource(self.engines[model.name]), model.max_model_len, model_family(model))
            for model in self.config.models
        ]
        return create_app(
            models,
            store=open_store(self.config.store, self.store),
            store_timeout_s=self.config.store.timeout_s,
            store_ttl_s=self.config.store.ttl_s,
            api_key=self.config.api_key,
            max_request_bytes=self.config.max_request_bytes,
            background_drain_s=background_drain_s(self.config),
            reasoning_keys=reasoning_keys(fallback=self.reasoning_key),
            max_stream_duration_s=self.config.max_stream_duration_s,
        )

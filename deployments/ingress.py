"""ResponsesIngress: the FastAPI app of `serve_app.api`, talking to engines through handles.

Prompt rendering and token parsing happen here, on CPU replicas; engine replicas only
turn prompt tokens into token batches.
"""

from __future__ import annotations

import logging
from typing import AsyncIterator

from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from deployments import use_serve_logging
from deployments.metrics import RayServeMetrics
from serve_app.api import ModelFamily, ServedModel, create_app
from serve_app.config import AppConfig, ModelConfig
from serve_app.protocol.harmony import HarmonyModel
from serve_app.protocol.tokens import GenerationRequest, TokenBatch
from serve_app.store import InMemoryStore

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


@serve.ingress()
class ResponsesIngress:
    """Ray Serve deployment class; the app is built on the replica from the typed config."""

    def __init__(self, app_config: dict, engines: dict[str, DeploymentHandle]) -> None:
        use_serve_logging()
        self.config = AppConfig.model_validate(app_config)
        self.engines = engines

    def __serve_build_asgi_app__(self):
        models = [
            ServedModel(model.name, HandleTokenSource(self.engines[model.name]), model.max_model_len, model_family(model))
            for model in self.config.models
        ]
        return create_app(
            models,
            store=InMemoryStore(self.config.store_max_entries),
            api_key=self.config.api_key,
            max_request_bytes=self.config.max_request_bytes,
            metrics=RayServeMetrics(),
        )

"""Engines: token sources that turn a `GenerationRequest` into `TokenBatch`es (replay, vLLM). Imports `config/` and below; the only home of vLLM."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from serve_app.core.tokens import TokenSource

if TYPE_CHECKING:
    from serve_app.config import ReplayBackendConfig, VLLMBackendConfig


class Backend(TokenSource, Protocol):
    """An engine backend (replay, vLLM): a token source with its control."""

    async def abort(self, request_id: str) -> None:
        """Stop a running request; a no-op for unknown ids."""
        ...

    def num_running(self) -> int:
        """Requests currently generating (0 once every stream ended or was aborted)."""
        ...

    async def check_health(self) -> None:
        """Raise if the backend cannot serve any more."""
        ...


def make_backend(config: ReplayBackendConfig | VLLMBackendConfig) -> Backend:
    """The backend a model's `backend:` config asks for (imported lazily: vLLM is heavy)."""
    if config.type == "replay":
        from serve_app.engines.replay import ReplayBackend, ReplayConfig, script_completion

        vision_script = None
        if config.script in ("qwen3", "qwen3-vl"):
            from serve_app.engines.replay_qwen3 import script_qwen3_completion as script
            from serve_app.engines.replay_qwen3 import script_qwen3_vl_completion
            from serve_app.families.smollm2 import SMOLLM2, load_tokenizer

            load_tokenizer(SMOLLM2)  # now, not on the first request
            if config.script == "qwen3-vl":
                from serve_app.families.vision import smollm2_vision_tokenizer

                smollm2_vision_tokenizer()
                vision_script = script_qwen3_vl_completion
        else:
            script = script_completion
        return ReplayBackend(
            ReplayConfig(
                min_step_tokens=config.min_step_tokens,
                max_step_tokens=config.max_step_tokens,
                step_delay_s=config.step_delay_ms / 1000,
                seed=config.seed,
            ),
            script,
            vision_script=vision_script,
        )
    if config.type == "vllm":
        from serve_app.engines.vllm import VLLMBackend

        return VLLMBackend(config)
    raise ValueError(f"unknown backend type {config.type!r}")

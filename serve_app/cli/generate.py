"""A Serve config file for one model, from `responses-serve run --model ...` flags.

The common case in a few flags: one vLLM model, its family guessed from its name (gpt-oss:
harmony; otherwise its chat template, with the reasoning and tool parsers its family uses),
two ingress replicas and the embedded store. `--print-config` shows the file; anything
beyond the flags is edited there and run with `responses-serve run FILE`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from serve_app.families.smollm2 import SMOLLM2

HARMONY_CONTEXT = 131_072  # gpt-oss
SMOLLM2_CONTEXT = 2_048  # SmolLM2 on CPU: a small KV cache
# Chat-template models by name: (reasoning parser, tool parser), vLLM's names.
PARSERS = {"qwen3": ("qwen3", "hermes"), "qwq": ("deepseek_r1", "hermes"), "deepseek-r1": ("deepseek_r1", None)}
NGRAM_DEFAULT_TOKENS, EAGLE_DEFAULT_TOKENS, MTP_DEFAULT_TOKENS = 4, 3, 1


class FlagError(ValueError):
    """A flag value that makes no config (the message says which and why)."""


@dataclass
class ModelFlags:
    """What `responses-serve run --model` was told; None: decide from the model."""

    model: str
    name: str | None = None
    device: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    speculative: str | None = None
    max_model_len: int | None = None
    family: str | None = None
    template: str | None = None
    reasoning_parser: str | None = None
    tool_parser: str | None = None
    dtype: str | None = None
    gpu_memory_utilization: float | None = None
    engine_args: list[str] = field(default_factory=list)
    replicas: int = 1
    max_replicas: int | None = None
    ingress_replicas: int = 2
    store: str = "embedded"
    api_key_env: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000


def has_nvidia_gpu() -> bool:
    """Whether `nvidia-smi` lists a GPU here."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def speculative_config(spec: str | None) -> dict[str, Any] | None:
    """`ngram[:K]`, `eagle3:DRAFT[:K]`, `mtp[:K]` or `none` -> vLLM's speculative_config."""
    if spec is None or spec == "none":
        return None
    method, _, rest = spec.partition(":")
    if method == "ngram":
        tokens = _count(rest or str(NGRAM_DEFAULT_TOKENS), spec)
        return {"method": "ngram", "num_speculative_tokens": tokens, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    if method == "mtp":
        return {"method": "mtp", "num_speculative_tokens": _count(rest or str(MTP_DEFAULT_TOKENS), spec)}
    if method == "eagle3":
        draft, tokens = rest, EAGLE_DEFAULT_TOKENS
        head, _, tail = rest.rpartition(":")
        if head and tail.isdigit():
            draft, tokens = head, _count(tail, spec)
        if not draft:
            raise FlagError(f"--speculative {spec}: eagle3 needs its draft model, e.g. eagle3:RedHatAI/gpt-oss-20b-speculator.eagle3")
        return {"method": "eagle3", "model": draft, "num_speculative_tokens": tokens}
    raise FlagError(f"--speculative {spec}: expected ngram[:K], eagle3:DRAFT[:K], mtp[:K] or none")


def _count(text: str, spec: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise FlagError(f"--speculative {spec}: {text!r} is not a number of draft tokens (1 or more)")
    return int(text)


def engine_kwargs(pairs: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` pairs, each VALUE read as YAML (`max_num_seqs=64`, `enforce_eager=true`)."""
    kwargs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise FlagError(f"--engine-arg {pair}: expected KEY=VALUE, e.g. max_num_seqs=64")
        kwargs[key.strip()] = yaml.safe_load(value)
    return kwargs


def is_gpt_oss(model: str) -> bool:
    return "gpt-oss" in model.lower()


def context_length(flags: ModelFlags) -> int:
    """The context window: the flag, else what the model is known or says to have (read from
    a local folder or the Hugging Face cache only: nothing is downloaded to write a config)."""
    if flags.max_model_len is not None:
        return flags.max_model_len
    if is_gpt_oss(flags.model):
        return HARMONY_CONTEXT
    if flags.model == SMOLLM2:
        return SMOLLM2_CONTEXT
    config = Path(flags.model) / "config.json"
    if not config.is_file():
        config = _cached_hub_config(flags.model) or config
    try:
        settings = json.loads(config.read_text())
        return int(settings.get("text_config", settings)["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        raise FlagError(
            f"cannot tell the context length of {flags.model} here (no config.json in a local folder or the "
            "Hugging Face cache): pass --max-model-len N"
        ) from None


def _cached_hub_config(model: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a hub id (e.g. a path that does not exist)
        return None
    return Path(found) if isinstance(found, str) else None


def model_args(flags: ModelFlags) -> dict[str, Any]:
    """The `models[0]` entry of the application args."""
    device = flags.device or ("gpu" if has_nvidia_gpu() else "cpu")
    family = flags.family or ("harmony" if is_gpt_oss(flags.model) else "chat_template")
    backend: dict[str, Any] = {"type": "vllm", "device": device, "model": flags.model}
    if device == "gpu":
        backend["tensor_parallel_size"] = flags.tensor_parallel_size
        if flags.pipeline_parallel_size > 1:
            backend["pipeline_parallel_size"] = flags.pipeline_parallel_size
        backend["gpu_memory_utilization"] = flags.gpu_memory_utilization or 0.9
    elif flags.tensor_parallel_size > 1 or flags.pipeline_parallel_size > 1:
        raise FlagError("--tp/--pp need --device gpu (a CPU engine runs on one node's cores)")
    if flags.dtype:
        backend["dtype"] = flags.dtype
    elif flags.model == SMOLLM2:
        backend["dtype"] = "float32"
    if (speculative := speculative_config(flags.speculative)) is not None:
        backend["speculative_config"] = speculative
    kwargs = {"enforce_eager": True} if device == "cpu" else {}  # CPU: skips minutes of torch.compile warm-up
    kwargs.update(engine_kwargs(flags.engine_args))
    if kwargs:
        backend["engine_kwargs"] = kwargs

    model: dict[str, Any] = {"name": flags.name or flags.model, "family": family}
    if family == "chat_template":
        guessed = next((parsers for key, parsers in PARSERS.items() if key in flags.model.lower()), (None, None))
        settings = {
            "template": flags.template,
            "reasoning_parser": _parser(flags.reasoning_parser, guessed[0]),
            "tool_parser": _parser(flags.tool_parser, guessed[1]),
        }
        model["chat_template"] = {key: value for key, value in settings.items() if value is not None}
    elif flags.template or flags.reasoning_parser or flags.tool_parser:
        raise FlagError("--template/--reasoning-parser/--tool-parser are for chat-template models (harmony has its own format)")
    model["max_model_len"] = context_length(flags)
    model["backend"] = backend
    engine: dict[str, Any] = {"max_ongoing_requests": 128}
    if flags.max_replicas is not None:
        if flags.max_replicas < flags.replicas:
            raise FlagError(f"--max-replicas {flags.max_replicas} is below --replicas {flags.replicas}")
        engine["autoscaling_config"] = {"min_replicas": flags.replicas, "max_replicas": flags.max_replicas, "target_ongoing_requests": 48}
    else:
        engine["num_replicas"] = flags.replicas
    if device == "cpu":
        engine["ray_actor_options"] = {"num_cpus": 0}  # the engine's cores are its own (serve_app/engines/cpu_cores.py)
    model["engine"] = engine
    return model


def _parser(flag: str | None, guessed: str | None) -> str | None:
    if flag is None:
        return guessed
    return None if flag == "none" else flag


def serve_config(flags: ModelFlags) -> dict[str, Any]:
    """A whole Serve config file (as a dict): `serve run`, `serve deploy` and `responses-serve run` take it."""
    model = model_args(flags)
    cpu = model["backend"]["device"] == "cpu"
    store: dict[str, Any] = {"type": flags.store}
    args: dict[str, Any] = {
        "models": [model],
        "ingress": {
            "num_replicas": flags.ingress_replicas,
            "max_ongoing_requests": 1024,
            "ray_actor_options": {"num_cpus": 0 if cpu else 1},
        },
        "store": store,
    }
    if flags.api_key_env:  # one key, read from this variable where the replicas run (docs/security.md)
        args["auth"] = {"keys": [{"tenant": "default", "key_env": flags.api_key_env}]}
    return {
        "proxy_location": "HeadOnly" if cpu else "EveryNode",
        "http_options": {"host": flags.host, "port": flags.port},
        "logging_config": {"log_level": "INFO"},
        "applications": [
            {
                "name": "responses",
                "route_prefix": "/",
                "import_path": "deployments.builder:build_app",
                "args": args,
            }
        ],
    }


def to_yaml(config: dict[str, Any], command: str) -> str:
    """The config as a YAML file, headed by the command that made it."""
    return f"# {command}\n" + cast(str, yaml.safe_dump(config, sort_keys=False))  # no stream: the text

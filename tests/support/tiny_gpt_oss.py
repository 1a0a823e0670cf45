"""A random tiny gpt-oss checkpoint for engine tests: vLLM's `GptOssForCausalLM` on CPU
(MoE, sliding window + full attention, attention sinks, the o200k_harmony vocabulary).

The weights are random, shaped so that the model writes harmony's special and header
tokens often (an untouched random model of this vocabulary would write one in ~10,000
tokens): the output head's rows for them are scaled up, and the embeddings dominate the
residual stream, so the next token depends mostly on the last one. At temperature 0 the
output then falls into short cycles that ngram speculation drafts and verifies; at
temperature 1 it is a random mix of special tokens, header words and arbitrary ids.
No tokenizer is saved: engines load gpt-oss's, built offline (`tokenizer: o200k_harmony`).
"""

from __future__ import annotations

from pathlib import Path

from serve_app.families.vocab import harmony_encoding

HARMONY_SPECIALS = list(range(199998, 200019))
HEADER_WORDS = [
    "assistant",
    "user",
    "analysis",
    "final",
    "commentary",
    " to",
    "=",
    "functions",
    ".",
    "get_weather",
    " json",
    "{}",
    " Hello",
    " world",
    "é",
    "世界",
]


def harmony_heavy_tokens() -> list[int]:
    encoding = harmony_encoding()
    words = {t for word in HEADER_WORDS for t in encoding.encode(word, allowed_special="all")}
    return sorted(set(HARMONY_SPECIALS) | words)


def build_tiny_gpt_oss(path: str | Path, *, seed: int = 0) -> Path:
    """Save the checkpoint (config.json + model.safetensors, ~100 MB, bf16) at `path`."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        vocab_size=201088,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=128,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,  # vLLM's CPU attention needs >= 64
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=4096,
        eos_token_id=200002,  # <|return|>, as gpt-oss
        pad_token_id=199999,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = GptOssForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(100.0)
        heavy = torch.tensor(harmony_heavy_tokens())
        model.lm_head.weight[heavy] *= 25.0
    out = Path(path)
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    return out

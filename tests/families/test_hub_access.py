"""Hub access is the environment's choice: only the bundled SmolLM2 is loaded offline, from
its local files; any other tokenizer loads as `transformers` would, and a failure names it."""

from __future__ import annotations

import os

import pytest

from serve_app.families.smollm2 import SMOLLM2, SmolLM2Unavailable, TokenizerUnavailable, load_tokenizer

OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


@pytest.mark.slow
def test_loading_tokenizers_never_switches_the_hub_off(tmp_path, monkeypatch):
    for var in OFFLINE_VARS:
        monkeypatch.delenv(var, raising=False)
    try:
        bundled = load_tokenizer(SMOLLM2)
    except SmolLM2Unavailable as exc:
        pytest.skip(str(exc))
    bundled.save_pretrained(tmp_path / "my-tokenizer")
    other = load_tokenizer(str(tmp_path / "my-tokenizer"))  # a config naming a folder or hub id
    assert other.encode("Grüße, 世界") == bundled.encode("Grüße, 世界")
    assert {var: os.environ.get(var) for var in OFFLINE_VARS} == dict.fromkeys(OFFLINE_VARS)
    with pytest.raises(TokenizerUnavailable, match="no-such-model"):
        load_tokenizer(str(tmp_path / "no-such-model"))

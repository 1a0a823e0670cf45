"""Encrypted reasoning for stateless clients (`include: ["reasoning.encrypted_content"]`).

A client that does not store responses (Codex sends `store: false`) can still give the model
its own chain of thought back on the next turn: reasoning items carry `encrypted_content`, the
reasoning text sealed with a key only the servers hold, and the client sends the items back
as they came. Sealing is `cryptography`'s Fernet (AES-128-CBC with an HMAC-SHA256 tag, a
timestamp and a version byte: authenticated, so a changed, cut or foreign blob is refused,
never half-read) under a `MultiFernet`: the first key encrypts, every key decrypts, so keys
rotate by putting the new one first and dropping the old one once its blobs have aged out.

Whoever holds a key can read every blob made with it: all replicas share the keys
(`RESPONSES_SERVE_REASONING_KEYS`), and a blob from a key the server no longer has is a 400.
A blob is sealed for one tenant (`for_tenant`) and opens for that tenant only: another
tenant that got hold of it cannot have the model read it back to it. A compaction item's
summary (`seal_compaction`) is sealed the same way, as a kind of its own: a reasoning blob
never opens as a compaction, nor the other way round.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import cast

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from serve_app.api.errors import invalid_request
from serve_app.api.items import HistoryItem, ReasoningItem, ReasoningText

INCLUDE = "reasoning.encrypted_content"
_VERSION = 1


class ReasoningCipher:
    """Seals and opens reasoning text with a list of Fernet keys (the first one encrypts)."""

    def __init__(self, keys: Sequence[str | bytes], tenant: str | None = None) -> None:
        """`tenant`: whose blobs these are (None: a server without tenants)."""
        self.tenant = tenant
        if not keys:
            raise ValueError("at least one reasoning key is needed")
        fernets = []
        for index, key in enumerate(keys):
            try:
                fernets.append(Fernet(key))
            except (ValueError, TypeError):
                raise ValueError(
                    f"reasoning key #{index + 1} is not a Fernet key (32 url-safe base64-encoded bytes; "
                    "make one with `python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`)"
                ) from None
        self._fernet = MultiFernet(fernets)

    def for_tenant(self, tenant: str | None) -> ReasoningCipher:
        """The same keys, sealing and opening `tenant`'s blobs only."""
        bound = copy.copy(self)
        bound.tenant = tenant
        return bound

    @staticmethod
    def generate_key() -> str:
        return Fernet.generate_key().decode()

    def encrypt(self, text: str) -> str:
        return self._seal({"reasoning": text})

    def decrypt(self, blob: str) -> str:
        """The reasoning text; `ValueError` for anything this server did not seal."""
        payload = self._open(blob, "reasoning")
        return cast(str, payload["reasoning"])  # a str: checked by `_open`

    def seal_compaction(self, summary: str, keep_chars: int) -> str:
        """A compaction item's `encrypted_content`: the summary, and how many characters of
        the user messages before it stay beside it."""
        return self._seal({"compaction": summary, "keep_chars": keep_chars})

    def open_compaction(self, blob: str) -> tuple[str, int]:
        payload = self._open(blob, "compaction")
        keep = payload.get("keep_chars")
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
            raise ValueError("an unknown payload version")
        return cast(str, payload["compaction"]), keep

    def _seal(self, fields: dict[str, object]) -> str:
        sealed = {"v": _VERSION, **fields} | ({"tenant": self.tenant} if self.tenant is not None else {})
        return self._fernet.encrypt(json.dumps(sealed, ensure_ascii=False).encode()).decode("ascii")

    def _open(self, blob: str, kind: str) -> dict[str, object]:
        """The payload sealing a `kind` text (`payload[kind]` is a str); `ValueError` else."""
        try:
            payload = json.loads(self._fernet.decrypt(blob.encode()))
        except (InvalidToken, UnicodeError, ValueError):
            raise ValueError("not sealed by this server's keys (tampered, truncated, or from another key)") from None
        if not isinstance(payload, dict) or payload.get("v") != _VERSION or not isinstance(payload.get(kind), str):
            raise ValueError("an unknown payload version")
        if payload.get("tenant") != self.tenant:  # said as for any foreign blob: whose it is stays unsaid
            raise ValueError("not sealed by this server's keys (tampered, truncated, or from another key)")
        return payload


def open_reasoning_items(items: list[HistoryItem], cipher: ReasoningCipher) -> list[HistoryItem]:
    """The request's input items with each `encrypted_content` opened into the reasoning text
    it seals (then rendered like any reasoning sent back); a blob that does not open is a 400
    naming the item."""
    opened = list(items)
    for index, item in enumerate(items):
        if isinstance(item, ReasoningItem) and item.encrypted_content:
            try:
                text = cipher.decrypt(item.encrypted_content)
            except ValueError as exc:
                raise invalid_request(
                    f"The encrypted content of reasoning item input[{index}] could not be decrypted: {exc}. "
                    "Send back reasoning items exactly as this server returned them.",
                    param=f"input[{index}].encrypted_content",
                    code="invalid_encrypted_content",
                ) from None
            opened[index] = item.model_copy(update={"content": [ReasoningText(text=text)], "encrypted_content": None})
    return opened

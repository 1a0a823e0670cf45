"""Waiting for a vector store's ingestion, as a client does: its `file_counts` polled until
no file is in progress."""

from __future__ import annotations

import time

import openai
from openai.types import VectorStore


def ingested(client: openai.OpenAI, vector_store_id: str, timeout_s: float = 60.0, interval_s: float = 0.1) -> VectorStore:
    """The vector store once none of its files is in progress; an AssertionError past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        vector_store = client.vector_stores.retrieve(vector_store_id)
        if vector_store.file_counts.in_progress == 0:
            return vector_store
        if time.monotonic() > deadline:
            raise AssertionError(f"ingestion of {vector_store_id} did not finish within {timeout_s:g} s: {vector_store.file_counts}")
        time.sleep(interval_s)

"""A real PostgreSQL with pgvector for the tests: the server the `pgserver` wheel ships,
started in a temporary directory (a Unix socket, no TCP port), stopped at the end."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def postgres() -> Iterator[str]:
    """A libpq URL of a fresh server with the pgvector extension available."""
    import pgserver

    with tempfile.TemporaryDirectory(prefix="pg-") as directory:
        server = pgserver.get_server(directory, cleanup_mode="stop")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()

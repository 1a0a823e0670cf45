"""A real PostgreSQL with pgvector for the tests: the server the `pgserver` wheel ships,
started in a temporary directory (a Unix socket, no TCP port), stopped at the end."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def postgres_server() -> Iterator[Any]:
    """A fresh server (`pgserver.PostgresServer`: `get_uri()`, `pgdata`, which is also the
    directory of its socket) with the pgvector extension available."""
    import pgserver

    with tempfile.TemporaryDirectory(prefix="pg-") as directory:
        server = pgserver.get_server(directory, cleanup_mode="stop")
        try:
            yield server
        finally:
            server.cleanup()


@contextmanager
def postgres() -> Iterator[str]:
    """A libpq URL of a fresh server with the pgvector extension available."""
    with postgres_server() as server:
        yield server.get_uri()


def psql_binary() -> Path:
    """The `psql` the pgserver wheel ships beside its server."""
    import pgserver

    return Path(pgserver.__file__).parent / "pginstall" / "bin" / "psql"

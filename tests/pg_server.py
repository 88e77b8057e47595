"""A real PostgreSQL 16 with pgvector for the tests (the pgserver wheel bundles both): started in
a temporary data directory, listening on a Unix socket only; stopped and started again by the
tests of a database that goes away. Skipped, with the reason, only where it cannot start."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def start(data: Path) -> Any:
    """A running server (pgserver.PostgresServer) with its data in `data`; a skip where none
    can start here."""
    try:
        import pgserver
    except ImportError:
        pytest.skip("pgserver is not installed (pip install 'bertforge[test]')")
    pytest.importorskip("psycopg", reason="psycopg is not installed (bertforge[postgres])")
    pytest.importorskip("psycopg_pool", reason="psycopg-pool is not installed")
    try:
        return pgserver.get_server(data, cleanup_mode="stop")
    except Exception as e:  # no way to run postgres on this machine: say why
        pytest.skip(f"PostgreSQL (pgserver) could not start here: {type(e).__name__}: {e}")


def stop(server: Any) -> None:
    """Stop the server (fast shutdown: connections are dropped), its data kept."""
    from pgserver._commands import pg_ctl

    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)


def restart(server: Any) -> None:
    """Start a stopped server again, on the same socket (its DSN unchanged)."""
    with server._lock:
        server.ensure_postgres_running()


@contextmanager
def running(data: Path) -> Iterator[Any]:
    """A server for the block, stopped after it."""
    server = start(data)
    try:
        yield server
    finally:
        server.cleanup()

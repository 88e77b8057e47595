"""A real PostgreSQL 16 with pgvector for the tests (the pgserver wheel bundles both): started in
a temporary data directory, listening on a Unix socket only; stopped and started again by the
tests of a database that goes away. Skipped, with the reason, only where it cannot start.

The data directory is a fresh one under the system's temporary directory, not pytest's: run as
root, pgserver runs PostgreSQL as its own user, which must be able to reach the directory, and
every pytest session started on the machine makes pytest's root (/tmp/pytest-of-root) private
again, so a server started there could no longer be stopped by pg_ctl."""

from __future__ import annotations

import shutil
import tempfile
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
def running() -> Iterator[Any]:
    """A server for the block in a fresh data directory, stopped and removed after it."""
    data = Path(tempfile.mkdtemp(prefix="bertforge-pg-"))
    try:
        server = start(data / "pgdata")
        try:
            yield server
        finally:
            server.cleanup()
    finally:
        shutil.rmtree(data, ignore_errors=True)

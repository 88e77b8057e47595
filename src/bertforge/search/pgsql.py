"""The PostgreSQL side of the PostgreSQL backend (postgres.py): where the server is (a DSN, never
shown with its password), a pool of connections whose failures are one error, the tables'
names (checked identifiers) and their SQL, and the binary COPY rows the windows are written as.

    db = Database("postgresql://me:secret@db/search")   # or "" / DATABASE_URL / PG* environment
    with db.connection() as conn:                       # one transaction, committed on exit
        conn.execute(sql("SELECT count(*) FROM {docs}", names("docs_v1")))

A DSN is a URI or libpq's key=value words (is_dsn: the one rule for --to and every index
argument). Safety. Every value is a bound parameter; a table name is an identifier checked here
(letters, digits and _, not a digit first, at most 48 characters: room for the suffixes of the
tables and indexes made beside it) and quoted by psycopg; the SQL texts are constants. A DSN's
password is replaced by *** wherever a message shows the DSN, and it (and PGPASSWORD) is
hidden from whatever the server or the driver says (errors.redacted, errors.hide). A server that cannot be reached, drops the connection or runs a
statement past the statement timeout (PgOptions.statement_timeout: a slow database, or a table
locked by another session) is one UnavailableError (the server answers 503 and recovers with
the database: the pool replaces broken connections); other database errors are one DataError
naming the table.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import (
    ConfigError,
    DataError,
    UnavailableError,
    hide,
    hide_passwords,
    need_extra,
    redacted,
)

SCHEMES = ("postgresql://", "postgres://")
POSTGRES_EXTRA = "a PostgreSQL index needs psycopg: pip install 'bertforge[postgres]'"
CONNECT_TIMEOUT = 10  # seconds to wait for a connection (to be made, or free in the pool)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,47}\Z")
# what a server (or libpq) says when it refuses a login for good: a wrong or missing password,
# no such role or database, no pg_hba.conf entry, a role that may not log in (a connection
# failure carries no SQLSTATE: its words are all there is); retrying will not help
_REFUSED = re.compile(
    r"authentication failed|no password supplied|(role|database) \".*\" does not exist|"
    r"no pg_hba\.conf entry|permission denied for database|not permitted to log in"
)

# the tables and indexes of an index named T: T's documents, their windows, the model's record
SUFFIXES = {
    "docs": "",
    "windows": "_windows",
    "meta": "_index",
    "hnsw": "_windows_hnsw",
    "tsv": "_tsv",
    "n": "_n",
}


# libpq's connection keywords (PostgreSQL 17's): an argument that starts with one of them and =
# is a DSN of key=value words; a path does not (a directory named so is the price)
CONNINFO_KEYWORDS = frozenset((
    "host", "hostaddr", "port", "dbname", "user", "password", "passfile", "require_auth",
    "channel_binding", "connect_timeout", "client_encoding", "options", "application_name",
    "fallback_application_name", "keepalives", "keepalives_idle", "keepalives_interval",
    "keepalives_count", "tcp_user_timeout", "replication", "gssencmode", "sslmode",
    "sslnegotiation", "requiressl", "sslcompression", "sslcert", "sslkey", "sslpassword",
    "sslcertmode", "sslrootcert", "sslcrl", "sslcrldir", "sslsni", "requirepeer",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "krbsrvname", "gsslib",
    "gssdelegation", "service", "target_session_attrs", "load_balance_hosts",
))  # fmt: skip
_FIRST_KEYWORD = re.compile(r"\s*([A-Za-z_]+)\s*=")


def is_dsn(value: object) -> bool:
    """Whether an index argument (search, mine, serve --index) or --to names a PostgreSQL
    server rather than a directory: a URI (postgresql:// or postgres://; alone: the
    environment's, resolve_dsn) or libpq's key=value words (host=db dbname=search ...), the
    first of them one of libpq's keywords. The one rule for every verb and the server."""
    text = str(value)
    first = _FIRST_KEYWORD.match(text)
    return text.startswith(SCHEMES) or (first is not None and first[1] in CONNINFO_KEYWORDS)


def resolve_dsn(dsn: str | None) -> str:
    """The DSN to connect with: the one given; none, or a bare postgresql://: $DATABASE_URL,
    else "" (libpq then reads PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE...)."""
    if not dsn or dsn in SCHEMES:
        return os.environ.get("DATABASE_URL", "")
    return dsn


def names(table: str) -> dict[str, Any]:
    """The quoted identifiers (psycopg.sql.Identifier) of table T's tables and indexes
    (SUFFIXES), T checked to be a plain identifier: one ConfigError otherwise."""
    if not isinstance(table, str) or not _NAME.match(table):
        raise ConfigError(
            f"table={table!r} (--table): not a table name: letters, digits and _, not a digit "
            "first, at most 48 characters"
        )
    identifier = need_extra("psycopg", POSTGRES_EXTRA).sql.Identifier
    return {key: identifier(table + suffix) for key, suffix in SUFFIXES.items()}


def sql(text: str, identifiers: Mapping[str, Any], **fixed: str) -> Any:
    """A constant SQL text with the tables' identifiers put in ({docs}, {windows}...) and
    `fixed` words chosen by the code from its own short lists ({vtype}, {op}): never a value."""
    psql = need_extra("psycopg", POSTGRES_EXTRA).sql
    words = {k: psql.SQL(v) for k, v in fixed.items()}
    return psql.SQL(text).format(**identifiers, **words)


class Database:
    """A pool of connections to one PostgreSQL server (psycopg_pool): opened at once (an
    unreachable server is an UnavailableError now), connections checked before each use and
    replaced when broken, each statement canceled after `timeout` seconds (its default:
    PgOptions.statement_timeout)."""

    def __init__(self, dsn: str | None, size: int = 1, *, timeout: float) -> None:
        psycopg = need_extra("psycopg", POSTGRES_EXTRA)
        pool = need_extra("psycopg_pool", POSTGRES_EXTRA)
        self.dsn = resolve_dsn(dsn)
        self.timeout = timeout
        hide_passwords(self.dsn)
        hide(os.environ.get("PGPASSWORD"))  # libpq's, where the DSN has none
        self.shown = redacted(self.dsn) or "the database of the PG* environment"
        try:
            if self.dsn and not is_dsn(self.dsn):  # a path given as --to, say
                raise psycopg.ProgrammingError("neither a URI nor key=value words")
            psycopg.conninfo.conninfo_to_dict(self.dsn)
        except psycopg.Error as e:
            raise ConfigError(
                f"{self.shown}: not a PostgreSQL DSN ({self.scrub(e)}): postgresql://user@host/db "
                "or libpq's key=value words (host=... dbname=...)"
            ) from None
        self.pool = pool.ConnectionPool(
            self.dsn,
            min_size=1,
            max_size=size,
            open=False,
            timeout=CONNECT_TIMEOUT,
            check=pool.ConnectionPool.check_connection,
            configure=self._configure,
            kwargs={"connect_timeout": CONNECT_TIMEOUT},
            name="bertforge",
        )
        with self.errors("connecting"):  # once by hand: the server's own refusal, at once
            psycopg.connect(self.dsn, connect_timeout=CONNECT_TIMEOUT).close()
            self.pool.open(wait=True, timeout=CONNECT_TIMEOUT)

    def scrub(self, error: object) -> str:
        """What the server or the driver said, its first line, the DSN's password out of it."""
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return redacted(text)

    @contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """The database's errors while doing `what`, as one error each: unreachable, dropped
        or timed out: UnavailableError; the login refused (_REFUSED): ConfigError; a table
        missing or another refusal: DataError."""
        psycopg = need_extra("psycopg", POSTGRES_EXTRA)
        pool = need_extra("psycopg_pool", POSTGRES_EXTRA)
        try:
            yield
        except psycopg.errors.QueryCanceled as e:  # slow, or waiting on another session's lock
            raise UnavailableError(
                f"{self.shown}: the database took longer than the statement timeout "
                f"({self.timeout:g} s, --statement-timeout) while {what} ({self.scrub(e)}); "
                "retry later"
            ) from None
        except psycopg.OperationalError as e:
            if _REFUSED.search(str(e)):
                raise ConfigError(
                    f"{self.shown}: the database refused the connection ({self.scrub(e)}): "
                    "check the DSN's user, password and database (retrying will not help)"
                ) from None
            raise UnavailableError(
                f"{self.shown}: the database is unavailable while {what} ({self.scrub(e)}); "
                "retry when it is back"
            ) from None
        except (pool.PoolTimeout, pool.PoolClosed) as e:
            raise UnavailableError(
                f"{self.shown}: the database is unavailable while {what} ({self.scrub(e)}); "
                "retry when it is back"
            ) from None
        except psycopg.Error as e:
            raise DataError(f"{self.shown}: {what}: {self.scrub(e)}") from None

    @contextmanager
    def connection(self, what: str = "searching", timeout: float | None = None) -> Iterator[Any]:
        """A pooled connection in a transaction, committed when the block ends (rolled back
        on an error), waited for up to `timeout` seconds (CONNECT_TIMEOUT); its errors as
        `errors` says."""
        with self.errors(what), self.pool.connection(timeout=timeout) as conn:
            yield conn

    def close(self) -> None:
        self.pool.close()

    def _configure(self, conn: Any) -> None:
        """Each new connection: its statements canceled after the timeout (in ms: a whole
        number, at least 1: 0 would be no limit)."""
        ms = str(max(1, round(self.timeout * 1000)))
        conn.execute("SELECT set_config('statement_timeout', %s, false)", [ms])
        conn.commit()


def vector_text(vector: np.ndarray) -> str:
    """A vector as pgvector reads it ('[0.1,-0.2,...]'; float32 values written exactly)."""
    return "[" + ",".join(map(repr, np.asarray(vector, np.float32).tolist())) + "]"


# -- binary COPY: the windows' rows ----------------------------------------------------------------

COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
COPY_TRAILER = struct.pack(">h", -1)


def window_rows(
    ids: Sequence[str],
    owners: np.ndarray,
    numbers: np.ndarray,
    spans: np.ndarray,
    vectors: np.ndarray,
    vtype: str,
) -> bytes:
    """Rows of (id text, w int4, span_start int4, span_end int4, embedding vector|halfvec) in
    PostgreSQL's binary COPY format (no header or trailer): each window's document's id
    (ids[owners[i]]), its number in the document, its characters and its vector (pgvector's
    binary form: int16 dimensions, int16 0, big-endian float4, or float2 for halfvec)."""
    width = 2 if vtype == "halfvec" else 4
    dim = vectors.shape[1]
    head = struct.pack(">iHH", 4 + width * dim, dim, 0)
    packed = np.ascontiguousarray(vectors, f">f{width}")  # (W, dim) big-endian
    encoded = [i.encode() for i in ids]
    out = []
    for i in range(len(owners)):
        name = encoded[owners[i]]
        out.append(
            struct.pack(">hi", 5, len(name))
            + name
            + struct.pack(">iiiiii", 4, numbers[i], 4, spans[i, 0], 4, spans[i, 1])
            + head
            + packed[i].tobytes()
        )
    return b"".join(out)

"""Engines for SQLite and PostgreSQL, with every dialect setting in one place."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

from tracestore.db.types import json_dumps, json_dumps_pg, json_loads

# Execution option read by the SQLite "begin" hook below.
BEGIN_MODE = "tracestore_sqlite_begin"
SQLITE_BUSY_TIMEOUT_S = 30.0


def normalize_url(url: str | URL) -> URL:
    """Parse a database URL; plain `postgresql://` means the psycopg 3 driver we ship."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def backend_name(url: str | URL) -> str:
    """'sqlite' or 'postgresql' (the dialect name of a URL)."""
    return normalize_url(url).get_backend_name()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Take transaction control away from pysqlite: it would otherwise begin lazily and
    # never with IMMEDIATE, and SQLAlchemy's "begin" hook below emits BEGIN itself.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    # WAL: readers never block the writer and the writer never blocks readers.
    cursor.execute("PRAGMA journal_mode=WAL")
    # NORMAL (not OFF) in WAL mode: a commit survives a process crash; only an OS crash
    # can lose the last transactions. We promise acknowledged means durable to processes.
    cursor.execute("PRAGMA synchronous=NORMAL")
    # Enforce the foreign keys the schema declares (off by default in SQLite).
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_begin(conn: Any) -> None:
    # Writers start with BEGIN IMMEDIATE: they take the write lock up front, so two
    # writers never deadlock upgrading a read lock (which busy_timeout cannot resolve).
    mode = conn.get_execution_options().get(BEGIN_MODE, "DEFERRED")
    conn.exec_driver_sql(f"BEGIN {mode}")


def _is_memory(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def create_engine(
    url: str | URL,
    *,
    connections: int | None = None,
    wait: float | None = None,
    **kwargs: Any,
) -> Engine:
    """Create the store's engine for a SQLite or PostgreSQL URL.

    `connections` fixes the pool's size (no overflow) and `wait` how long a checkout waits
    for a free connection before raising sqlalchemy.exc.TimeoutError (the API answers 503).
    """
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    if connections is not None and not _is_memory(parsed):
        # A server hands connections out on its event loop (api/overload.py), so the pool
        # never needs to grow past what it was given; the wait is a backstop.
        kwargs.setdefault("pool_size", connections)
        kwargs.setdefault("max_overflow", 0)
    if wait is not None and not _is_memory(parsed):
        kwargs.setdefault("pool_timeout", wait)
    if backend == "sqlite":
        connect_args: dict[str, Any] = {"check_same_thread": False}
        if "timeout" not in parsed.query:
            # Writers queue for the lock up to this many seconds (SQLite's busy timeout)
            # instead of failing with 'database is locked'; `?timeout=` in the URL sets it.
            connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_S
        engine = sa_create_engine(
            parsed,
            json_serializer=json_dumps,
            json_deserializer=json_loads,
            connect_args=connect_args,
            **kwargs,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    if backend == "postgresql":
        kwargs.setdefault("pool_pre_ping", True)
        return sa_create_engine(
            parsed,
            json_serializer=json_dumps_pg,
            json_deserializer=json_loads,
            **kwargs,
        )
    raise ValueError(
        f"unsupported database {backend!r}: use sqlite:///PATH or postgresql+psycopg://..."
    )


def write_engine(engine: Engine) -> Engine:
    """The same engine, beginning SQLite transactions with BEGIN IMMEDIATE."""
    if engine.dialect.name == "sqlite":
        return engine.execution_options(**{BEGIN_MODE: "IMMEDIATE"})
    return engine


def create_migration_engine(url: str | URL) -> Engine:
    """An engine for Alembic: no pooling, and SQLite foreign keys left off.

    A batch-mode table rewrite on SQLite drops and recreates a table; with foreign keys on
    that would cascade-delete its children.
    """
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        return sa_create_engine(parsed, poolclass=NullPool)
    return create_engine(parsed, poolclass=NullPool)

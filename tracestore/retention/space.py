"""Giving space back after deletes: SQLite's vacuum modes, PostgreSQL's VACUUM, sizes.

SQLite keeps the pages of deleted rows in the file (its freelist) for later rows, unless
the file is in incremental auto-vacuum mode, where `PRAGMA incremental_vacuum` hands the
free pages back to the file system. A store created before that mode is switched on
needs one full VACUUM to change mode (`tracestore db vacuum --incremental`). A plain
`VACUUM` rewrites the whole file and blocks writers while it runs.

PostgreSQL: deleted rows become dead tuples, which autovacuum makes reusable (the files
do not shrink, but later rows fill them). `db vacuum` runs VACUUM (ANALYZE) now.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text

# SQLite's auto_vacuum values.
AUTO_VACUUM_MODES = {0: "none", 1: "full", 2: "incremental"}


@dataclass(frozen=True, slots=True)
class Size:
    """The store's size: bytes on disk (SQLite: file + WAL) and free pages inside."""

    bytes: int
    free_bytes: int
    mode: str

    def as_dict(self) -> dict[str, Any]:
        """The size as JSON."""
        return {"bytes": self.bytes, "free_bytes": self.free_bytes, "auto_vacuum": self.mode}


def _sqlite_path(engine: Engine) -> str | None:
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return database


def store_size(engine: Engine) -> Size:
    """How much room the store takes now."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            page = int(conn.exec_driver_sql("PRAGMA page_size").scalar_one())
            free = int(conn.exec_driver_sql("PRAGMA freelist_count").scalar_one())
            mode = AUTO_VACUUM_MODES.get(
                int(conn.exec_driver_sql("PRAGMA auto_vacuum").scalar_one()), "?"
            )
            path = _sqlite_path(engine)
            on_disk = 0
            if path is not None:
                on_disk = sum(
                    os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p)
                )
            else:
                count = int(conn.exec_driver_sql("PRAGMA page_count").scalar_one())
                on_disk = count * page
            return Size(on_disk, free * page, mode)
        total = conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
        return Size(int(total), 0, "autovacuum")


def _sqlite_incremental(raw: Any) -> None:
    # executescript, not execute: each step of this pragma frees one page, and pysqlite's
    # execute steps once; sqlite3_exec (behind executescript) steps it to the end. It
    # runs in its own (autocommit) transaction, taking the write lock for its duration.
    raw.executescript("PRAGMA incremental_vacuum;")


def incremental_vacuum(engine: Engine) -> int:
    """Give SQLite's free pages back to the file system when the store is in incremental
    auto-vacuum mode; returns the pages freed (0 otherwise, and on PostgreSQL)."""
    if engine.dialect.name != "sqlite":
        return 0
    pooled = engine.raw_connection()
    try:
        raw = pooled.driver_connection
        assert raw is not None
        if int(raw.execute("PRAGMA auto_vacuum").fetchone()[0]) != 2:
            return 0
        free = int(raw.execute("PRAGMA freelist_count").fetchone()[0])
        if free:
            _sqlite_incremental(raw)
        return free
    finally:
        pooled.close()


def vacuum(engine: Engine, *, incremental: bool = False) -> str:
    """Give space back now; returns what was done, in words.

    SQLite: in incremental mode, `PRAGMA incremental_vacuum`; otherwise a full VACUUM
    (which, with `incremental`, first switches the file to incremental auto-vacuum, so
    later sweeps give space back batch by batch). Then the WAL is truncated. PostgreSQL:
    VACUUM (ANALYZE) of the whole database.
    """
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM (ANALYZE)")
        return "VACUUM (ANALYZE): dead rows made reusable, statistics refreshed"
    pooled = engine.raw_connection()
    try:
        raw = pooled.driver_connection
        assert raw is not None
        cursor = raw.cursor()
        mode = int(cursor.execute("PRAGMA auto_vacuum").fetchone()[0])
        if mode == 2:
            _sqlite_incremental(raw)
            done = "incremental vacuum: free pages given back"
        else:
            if incremental:
                # Takes effect with the VACUUM that follows (SQLite's rule for changing it).
                cursor.execute("PRAGMA auto_vacuum=INCREMENTAL")
            # Outside any transaction (VACUUM refuses to run inside one): the connection
            # runs in autocommit, as db/engine.py sets pysqlite up.
            cursor.execute("VACUUM")
            done = "VACUUM: file rewritten" + (
                ", now in incremental auto-vacuum mode" if incremental else ""
            )
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        cursor.close()
    finally:
        pooled.close()
    return done

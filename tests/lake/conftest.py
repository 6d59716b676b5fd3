"""Stores and readers for the lake tests (issue 15): each test gets fresh databases.

The readers are the engines themselves: the deltalake package, DuckDB with its delta
extension loaded from the PyPI package's file (never downloaded), plain DuckDB over the
Parquet files. Nothing is mocked.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pytest
from sqlalchemy import Connection, Engine, text

from tests.conftest import _PgDatabases, minimal_rollout, new_database
from tracestore.db import migrate
from tracestore.db.engine import create_engine, write_engine
from tracestore.ingest.service import ingest_many, prepare
from tracestore.reports import live
from tracestore.reports.connection import extension_path, sql_literal
from tracestore.reports.export import ExportSummary
from tracestore.reports.filters import Filters
from tracestore.store.rollouts import store_many

# Tables whose rows belong to a run (legacy_reads does not).
RUN_TABLES = (
    "runs",
    "trajectories",
    "steps",
    "traces",
    "trace_time_steps",
    "trace_events",
    "trace_messages",
    "drift_checks",
    "drift_findings",
)


@dataclass
class LakeStore:
    """A fresh, migrated store of one backend."""

    backend: str
    url: str
    engine: Engine
    exports: list[ExportSummary] = field(default_factory=list)

    def ingest(self, *run_ids: str) -> None:
        """Store one small rollout per run id, in one committed batch."""
        docs = [json.dumps(rollout(r)).encode() for r in run_ids]
        results = ingest_many(self.engine, docs)
        assert [r.status for r in results] == ["created"] * len(run_ids), results

    def export(
        self,
        out: Path,
        *,
        fmt: str = "delta",
        incremental: bool = True,
        settle: bool = True,
        **window: Any,
    ) -> ExportSummary:
        """Export through the library call the CLI makes; with `settle`, first wait until
        every committed run is below the watermark (see `settled`)."""
        if settle:
            settled(self.engine)
        summary = live.export(self.url, out, Filters(**window), fmt=fmt, incremental=incremental)
        self.exports.append(summary)
        return summary

    def run_ids(self) -> set[str]:
        """Every run id the store holds (committed)."""
        with self.engine.connect() as conn:
            return set(conn.execute(text("SELECT run_id FROM runs")).scalars())

    def counts(self) -> dict[str, int]:
        """Rows per run table, as the store holds them."""
        with self.engine.connect() as conn:
            return {
                t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in RUN_TABLES
            }

    def store_id(self) -> str:
        """The store's id."""
        with self.engine.connect() as conn:
            return str(conn.execute(text("SELECT store_id FROM store_identity")).scalar_one())


def settled(engine: Engine, timeout: float = 60.0) -> None:
    """Wait until the watermark is past every committed run.

    On PostgreSQL any transaction open on the server holds the watermark back, whoever
    opened it (another test run sharing the server, a server fixture's flush); a test
    that wants every committed run in its next export waits for them to end. SQLite's
    watermark is always past every committed run.
    """
    from tracestore.reports.watermark import take_cut

    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            top = conn.execute(text("SELECT coalesce(max(ingest_seq), 0) FROM runs")).scalar_one()
        if take_cut(engine).upto > top or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def rollout(run_id: str) -> dict[str, Any]:
    """A small rollout with a trace (events and messages with epoch times) and a step."""
    doc = minimal_rollout(run_id, reward=float(len(run_id) % 5))
    doc["trace"] = {
        "session_id": f"s-{run_id}",
        "created_at": "2025-11-20T10:00:00Z",
        "metadata": {"env_id": "e", "policy_id": "p"},
        "session_time_steps": [],
        "event_history": [
            {
                "system_instance_id": "env:e",
                "time_record": {"event_time": 1763700000.25, "message_time": None},
                "reward": 1.0,
                "terminated": True,
                "truncated": False,
            }
        ],
        "markov_blanket_message_history": [
            {
                "content": {"text": "hi"},
                "message_type": "observation",
                "time_record": {"event_time": 1763700000.5, "message_time": 1763700001.0},
            }
        ],
    }
    return doc


@pytest.fixture
def lake_store(
    backend: str, tmp_path_factory: pytest.TempPathFactory, pg_databases: _PgDatabases | None
) -> Iterator[LakeStore]:
    """A fresh, migrated store of `backend`."""
    yield from _store(backend, tmp_path_factory, pg_databases)


def _store(
    backend: str, tmp_path_factory: pytest.TempPathFactory, pg_databases: _PgDatabases | None
) -> Iterator[LakeStore]:
    db = new_database(backend, "lake", tmp_path_factory, pg_databases)
    engine = create_engine(db.url)
    migrate.upgrade(engine)
    try:
        yield LakeStore(backend, db.url, engine)
    finally:
        engine.dispose()


@pytest.fixture
def store_factory(
    tmp_path_factory: pytest.TempPathFactory, pg_databases: _PgDatabases | None
) -> Iterator[Callable[[str], LakeStore]]:
    """Makes more fresh stores (several stores sharing one lake)."""
    made: list[Iterator[LakeStore]] = []

    def make(backend: str) -> LakeStore:
        it = _store(backend, tmp_path_factory, pg_databases)
        made.append(it)
        return next(it)

    yield make
    for it in made:
        next(it, None)


class OpenWrite:
    """A rollout written in a transaction that stays open until `commit()`."""

    def __init__(self, store: LakeStore, run_id: str) -> None:
        self.conn: Connection = write_engine(store.engine).connect()
        self.tx = self.conn.begin()
        result = store_many(self.conn, [prepare(json.dumps(rollout(run_id)).encode())])[0]
        assert result.status == "created", result
        self.seq = int(
            self.conn.execute(
                text("SELECT ingest_seq FROM runs WHERE run_id = :r"), {"r": run_id}
            ).scalar_one()
        )

    def commit(self) -> None:
        """Commit the write and close the connection."""
        self.tx.commit()
        self.conn.close()

    def close(self) -> None:
        """Roll back (if still open) and close."""
        if self.tx.is_active:
            self.tx.rollback()
        self.conn.close()


# --- readers ----------------------------------------------------------------------------------


def duck() -> duckdb.DuckDBPyConnection:
    """Plain DuckDB with the delta extension loaded from its PyPI package's file."""
    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    con.execute(f"LOAD {sql_literal(str(extension_path('delta')))}")
    con.execute("SET TimeZone = 'UTC'")
    return con


def delta_keys(lake: Path, table: str, key: str) -> list[tuple[str, Any]]:
    """(store_id, key) of every row of a Delta table, read by the deltalake package."""
    from deltalake import DeltaTable

    data = DeltaTable(str(lake / table)).to_pyarrow_table(columns=["store_id", key])
    return list(zip(data.column("store_id").to_pylist(), data.column(key).to_pylist(), strict=True))


def duck_keys(lake: Path, table: str, key: str) -> list[tuple[str, Any]]:
    """The same, read by DuckDB's delta extension."""
    con = duck()
    try:
        rows = con.execute(
            f"SELECT store_id, {key} FROM delta_scan({sql_literal(str(lake / table))})"
        ).fetchall()
    finally:
        con.close()
    return [(str(s), k) for s, k in rows]


def duplicates(keys: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Keys that occur more than once."""
    return [k for k, n in Counter(keys).items() if n > 1]


def check_lake_once(lake: Path, store: LakeStore) -> set[str]:
    """Assert the lake holds no row twice (both readers agree); return its runs' ids."""
    sid = store.store_id()
    runs = delta_keys(lake, "runs", "run_id")
    assert duplicates(runs) == []
    assert sorted(runs) == sorted(duck_keys(lake, "runs", "run_id"))
    for table in RUN_TABLES[1:]:
        key = "run_pk" if table == "drift_checks" else "id"
        rows = delta_keys(lake, table, key)
        assert duplicates(rows) == [], table
        assert sorted(rows) == sorted(duck_keys(lake, table, key)), table
    return {r for s, r in runs if s == sid}


def export_until_complete(store: LakeStore, lake: Path, want: set[str]) -> set[str]:
    """Incremental exports until the lake holds `want`, checking each leaves no duplicate.

    On PostgreSQL an open transaction anywhere on the server (another test run sharing
    it) holds the watermark back; on CI nothing else runs and the first export suffices.
    """
    deadline = time.monotonic() + 60
    while True:
        store.export(lake, settle=False)
        have = check_lake_once(lake, store)
        if have >= want or time.monotonic() > deadline:
            return have
        time.sleep(0.5)


# An export as the analytics child runs it (reports/live.py `_export`), in a process of its
# own (DuckDB may not attach a live SQLite store in the test's process): `python -c
# EXPORT_WHILE_RUNS_CHANGE URL OUT FMT INCREMENTAL TRACESTORE STORE_ID KIND UPTO AFTER_TABLE
# VICTIM NEWCOMER`. Once table AFTER_TABLE is staged, another process deletes VICTIM
# (`tracestore delete`) and, when given, stores NEWCOMER (`tracestore ingest`), both
# committed before staging goes on. It prints the tables staged, in order.
EXPORT_WHILE_RUNS_CHANGE = """
import os, subprocess, sys
from pathlib import Path
from sqlalchemy.pool import NullPool
from tracestore.db.engine import create_engine
from tracestore.reports import connection, export
from tracestore.reports.filters import Filters
from tracestore.reports.watermark import Cut

url, out, fmt, incremental, tracestore, store_id, kind, upto = sys.argv[1:9]
after_table, victim, newcomer = sys.argv[9:]
connection.allow_sqlite_attach()
staged = export._stage_table
calls = []

def stage_then_change(analytics, staging, name, *args):
    done = staged(analytics, staging, name, *args)
    calls.append(name)
    if name == after_table:
        run = lambda *a: subprocess.run([tracestore, *a, "--db", url], check=True,
                                        capture_output=True)
        run("delete", victim)
        if newcomer:
            run("ingest", newcomer)
    return done

export._stage_table = stage_then_change
engine = create_engine(url, poolclass=NullPool)
cut = Cut(store_id, kind, int(upto))
ext = os.environ.get("TRACESTORE_DUCKDB_EXTENSION_DIR")  # as live._export takes it
export.export_snapshot(
    engine,
    Path(out),
    Filters(),
    cut,
    fmt=fmt,
    incremental=incremental == "yes",
    extension_dir=Path(ext) if ext else None,
)
print(" ".join(calls))
"""

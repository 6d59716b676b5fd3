"""`tracestore export DIR`: the store's tables as Parquet, Hive-partitioned by day.

Every table is written from the normalized views (so a PostgreSQL store and a SQLite one
export the same types), partitioned by the UTC day its run was received: a run's
trajectories, steps, traces, events, messages and drift rows all sit under that run's
`day=YYYY-MM-DD`. Tables not tied to a run (legacy_reads) are partitioned by their own
`day` column, and never filtered by `--since`.

The set of runs is fixed first (received in the window, in the store when the export
started), so a store that keeps ingesting cannot give a snapshot whose children point at
runs it lacks. The snapshot is written into a hidden sibling directory and renamed into
place when complete, with its manifest written last.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from tracestore import __version__
from tracestore.errors import InvalidRequest
from tracestore.reports.connection import (
    EXCLUDED_TABLES,
    Analytics,
    model_tables,
    open_live,
    quote_ident,
    sql_literal,
)
from tracestore.reports.filters import Filters
from tracestore.reports.snapshot import FORMAT, FORMAT_VERSION, MANIFEST, sha256_file

PARTITION = "day"


@dataclass(frozen=True, slots=True)
class ExportSummary:
    """What an export wrote."""

    path: Path
    manifest: dict[str, Any]
    seconds: float

    @property
    def rows(self) -> dict[str, int]:
        """Rows per table."""
        return {name: t["rows"] for name, t in self.manifest["tables"].items()}


def _check_target(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidRequest(
            f"{out} exists and is not an empty directory: export into a new or empty one"
        )


def _select(name: str, columns: list[str]) -> tuple[str, bool]:
    """The SELECT that exports table `name` with its partition column, and if it has one."""
    cols = ", ".join(f"t.{quote_ident(c)}" for c in columns)
    table = quote_ident(name)
    if name == "runs":
        return (
            f"SELECT {cols}, x.day FROM runs AS t JOIN _export_runs AS x ON x.run_pk = t.id",
            True,
        )
    if "run_pk" in columns:
        return (
            f"SELECT {cols}, x.day FROM {table} AS t JOIN _export_runs AS x ON x.run_pk = t.run_pk",
            True,
        )
    if "trace_pk" in columns:
        return (
            f"SELECT {cols}, x.day FROM {table} AS t "
            "JOIN traces AS tr ON tr.id = t.trace_pk "
            "JOIN _export_runs AS x ON x.run_pk = tr.run_pk",
            True,
        )
    if PARTITION in columns:
        return f"SELECT {cols} FROM {table} AS t", True
    return f"SELECT {cols} FROM {table} AS t", False


def _describe(analytics: Analytics, name: str) -> list[tuple[str, str]]:
    rows = analytics.con.execute(f"DESCRIBE main.{quote_ident(name)}").fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def _write_table(
    analytics: Analytics, tmp: Path, name: str, columns: list[tuple[str, str]]
) -> dict[str, Any]:
    select, partitioned = _select(name, [c for c, _ in columns])
    target = tmp / name
    # Ordered by key: the same store exports the same bytes, so checksums compare.
    ordered = f"{select} ORDER BY t.{quote_ident(columns[0][0])}"
    if partitioned:
        options = f"FORMAT parquet, COMPRESSION zstd, PARTITION_BY ({PARTITION})"
        analytics.con.execute(f"COPY ({ordered}) TO {sql_literal(str(target))} ({options})")
    files = sorted(p for p in target.rglob("*.parquet")) if target.exists() else []
    if not files:
        # An empty table (or an unpartitioned one) still gets a file, so Spark and Trino
        # can read its schema.
        target.mkdir(parents=True, exist_ok=True)
        path = target / "data_0.parquet"
        analytics.con.execute(
            f"COPY ({ordered}) TO {sql_literal(str(path))} (FORMAT parquet, COMPRESSION zstd)"
        )
        files = [path]
        partitioned = False
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # no type stubs

    entries = []
    for path in files:
        entries.append(
            {
                "path": path.relative_to(tmp).as_posix(),
                "rows": pq.read_metadata(path).num_rows,
                "bytes": path.stat().st_size,
                "sha256": sha256_file(path),
            }
        )
    all_columns = [{"name": c, "type": t} for c, t in columns]
    if partitioned and PARTITION not in {c for c, _ in columns}:
        all_columns.append({"name": PARTITION, "type": "DATE"})
    return {
        "rows": sum(e["rows"] for e in entries),
        "partitioned": partitioned,
        "columns": all_columns,
        "files": entries,
    }


def export_snapshot(
    engine: Engine,
    out: Path,
    filters: Filters,
    *,
    extension_dir: Path | None = None,
    schema_revision: str | None = None,
) -> ExportSummary:
    """Write a Parquet snapshot of the store to `out` (a new or empty directory)."""
    if filters.env is not None:
        raise InvalidRequest("export takes --since and --until, not --env")
    started = time.monotonic()
    out = out.expanduser().resolve()
    _check_target(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with open_live(engine, extension_dir=extension_dir, writable_dir=tmp) as analytics:
            manifest = _export(analytics, tmp, filters)
        manifest["schema_revision"] = schema_revision
        manifest["source"] = {
            "backend": engine.dialect.name,
            "database": make_url(engine.url).render_as_string(hide_password=True),
            "notices": analytics.notices,
        }
        (tmp / MANIFEST).write_bytes(
            orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
        )
        _check_target(out)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportSummary(out, manifest, time.monotonic() - started)


def _export(analytics: Analytics, tmp: Path, filters: Filters) -> dict[str, Any]:
    con = analytics.con
    con.execute(
        "CREATE TEMP TABLE _export_runs AS "
        "SELECT id AS run_pk, received_at, CAST(timezone('UTC', received_at) AS DATE) AS day "
        "FROM runs WHERE ($since IS NULL OR received_at >= $since) "
        "AND ($until IS NULL OR received_at < $until)",
        {"since": filters.since, "until": filters.until},
    )
    span = con.execute(
        "SELECT count(*), CAST(min(received_at) AS VARCHAR), CAST(max(received_at) AS VARCHAR) "
        "FROM _export_runs"
    ).fetchone()
    assert span is not None
    tables: dict[str, Any] = {}
    for name in model_tables():
        if name not in analytics.tables or name in EXCLUDED_TABLES:
            continue

        def write(name: str = name) -> dict[str, Any]:
            # A retry starts over: a failed COPY may have left some partitions behind.
            shutil.rmtree(tmp / name, ignore_errors=True)
            return _write_table(analytics, tmp, name, _describe(analytics, name))

        # On SQLite a JSON column holding a bare number trips the scanner mid-COPY: the
        # table is then read through SQLAlchemy and written again (as `report` does).
        tables[name] = analytics.retrying(write)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tracestore_version": __version__,
        "created_at": datetime.now(UTC).isoformat(),
        "since": filters.since.isoformat() if filters.since else None,
        "until": filters.until.isoformat() if filters.until else None,
        "time_range": {
            "runs": span[0],
            "first_received_at": _iso(span[1]),
            "last_received_at": _iso(span[2]),
        },
        "partitioning": {
            "column": PARTITION,
            "type": "DATE",
            "meaning": "UTC date the run was received; rows of a run share its day",
        },
        "excluded_tables": sorted(EXCLUDED_TABLES),
        "tables": tables,
    }


def _iso(text: str | None) -> str | None:
    # DuckDB renders TIMESTAMPTZ as '2025-11-20 11:59:59.123+00'; give ISO 8601.
    if text is None:
        return None
    return datetime.fromisoformat(text).astimezone(UTC).isoformat()

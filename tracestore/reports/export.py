"""`tracestore export DIR`: the store's tables as Parquet or Delta Lake, partitioned by day.

Every table is written from the normalized views (so a PostgreSQL store and a SQLite one
export the same types), partitioned by the UTC day its run was received: a run's
trajectories, steps, traces, events, messages and drift rows all sit under that run's
`day=YYYY-MM-DD`. Tables not tied to a run (legacy_reads) are partitioned by their own
`day` column, never filtered, and replaced whole by every export.

Which runs an export carries is fixed first, by a commit-ordered cut on `ingest_seq`
(reports/watermark.py): the runs with `after <= ingest_seq < upto`, intersected with
`--since`/`--until` when given. `upto` is recorded in the target (the Parquet manifest,
or the lake's per-store state), and `--incremental` starts where the last export ended,
so a nightly job takes every run exactly once however ingest and the job interleave.

The batch is one picture of its runs, whatever is deleted or stored meanwhile: every
table holds the rows of exactly the runs in its `runs`, each with all of them. On
PostgreSQL every table is read in one snapshot (one DuckDB transaction); on SQLite, whose
scanner has none common to its reads, the runs deleted while the tables were read are
left out of every table afterwards (`_leave_out_gone`).

Every row carries the store's id and its run's run_id and ingest_seq (lake.py). Float
epoch seconds (trace_events.event_time, trace_messages.event_time and message_time)
become timestamps, the float kept beside as `<name>_epoch`.

The batch is first written as Parquet by DuckDB into a hidden sibling directory; then a
new snapshot is that directory renamed into place (manifest last), an incremental
Parquet export moves its files in and rewrites the manifest, and a Delta export commits
them table by table (lake.write_delta).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from datetime import time as clock
from enum import StrEnum
from pathlib import Path
from typing import Any

import duckdb
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from tracestore import __version__
from tracestore.errors import InvalidRequest
from tracestore.reports import lake
from tracestore.reports.connection import (
    EXCLUDED_TABLES,
    Analytics,
    model_tables,
    open_live,
    quote_ident,
    sql_literal,
)
from tracestore.reports.filters import Filters
from tracestore.reports.snapshot import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    read_manifest,
    sha256_file,
)
from tracestore.reports.watermark import SQLITE as SQLITE_KIND
from tracestore.reports.watermark import Cut

PARTITION = "day"
# Seconds of 0001-01-01 and 9999-12-31T23:59:59 UTC: outside, a float is no timestamp.
_EPOCH_MIN, _EPOCH_MAX = -62135596800.0, 253402300799.0
# Columns every exported row gets (runs has its own run_id and ingest_seq).
RUN_COLUMNS = ("run_id", "ingest_seq")
STORE_COLUMN = "store_id"
# Tables exported whole each time, not by run.
WHOLE_TABLES = frozenset({"legacy_reads"})
# Store tables an export leaves out besides EXCLUDED_TABLES: the store's id is on every row;
# the deletion audit, datasets and retention rules are the store's own bookkeeping (a
# Delta export applies the deletions instead, and a dataset's export names it).
NOT_EXPORTED = frozenset(
    {"store_identity", "run_deletions", "datasets", "dataset_runs", "retention_rules"}
)


class LakeFormat(StrEnum):
    """What `tracestore export` writes."""

    parquet = "parquet"
    delta = "delta"


@dataclass(frozen=True, slots=True)
class ExportSummary:
    """What an export wrote."""

    path: Path
    format: str
    # Parquet: the snapshot's manifest; Delta: the store's state in the lake.
    manifest: dict[str, Any]
    written: dict[str, int]  # rows this export wrote, per table
    runs: int  # runs this export carried
    after: int | None
    upto: int
    files: int  # Parquet files written; Delta commits made (deletions' included)
    seconds: float
    notices: list[str] = field(default_factory=list)
    # Delta: runs deleted from the store that this export removed from the lake, and the
    # commits that took (counted in `files` too).
    removed_runs: int = 0
    deletion_commits: int = 0

    @property
    def rows(self) -> dict[str, int]:
        """Rows this export wrote, per table."""
        return dict(self.written)

    def line(self) -> str:
        """The one-line summary `tracestore export` prints."""
        counts = ", ".join(f"{n} {t}" for t, n in self.written.items())
        batch = f"ingest_seq [{self.after or 0}, {self.upto})"
        what = "Parquet files" if self.format == LakeFormat.parquet else "Delta commits"
        text = (
            f"exported {self.runs} runs ({batch}) to {self.path} in {self.seconds:.1f}s: "
            f"{self.files} {what} ({counts})"
        )
        if self.format == LakeFormat.parquet:
            return f"{text}; manifest {self.path / MANIFEST}"
        if not (self.removed_runs or self.deletion_commits):
            return f"{text}; no deleted run to remove from the lake"
        return (
            f"{text}; {self.deletion_commits} of them removed {self.removed_runs} "
            "deleted runs from the lake"
        )


@dataclass(slots=True)
class _Staged:
    """One table's batch, written as Parquet in the staging directory."""

    rows: int
    partitioned: bool
    columns: list[dict[str, str]]
    files: list[Path]
    stem: str  # of its files' names (lake.file_stem)


def _check_empty_target(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidRequest(
            f"{out} exists and is not an empty directory: export into a new or empty one "
            "(or add to it with --incremental)"
        )


@contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file`: one export at a time writes a target."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InvalidRequest(
                f"another export is writing {lock_file.parent}: wait for it to finish"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def export_snapshot(
    engine: Engine,
    out: Path,
    filters: Filters,
    cut: Cut,
    *,
    fmt: str = LakeFormat.parquet,
    incremental: bool = False,
    extension_dir: Path | None = None,
    schema_revision: str | None = None,
    dataset: str | None = None,
) -> ExportSummary:
    """Export the runs `cut` and `filters` select to `out` as Parquet or Delta Lake.

    `dataset`: only the runs of that dataset (a new Parquet snapshot; its manifest names
    the dataset and its manifest hash).

    Parquet: a new snapshot in a new or empty directory, or with `incremental` the next
    batch of an existing one. Delta: into a lake directory, replacing the rows of the
    runs it carries. `cut` is taken beforehand by the process that writes the store
    (reports.watermark.take_cut).
    """
    if filters.env is not None:
        raise InvalidRequest("export takes --since and --until, not --env")
    if incremental and (filters.since is not None or filters.until is not None):
        raise InvalidRequest(
            "--incremental takes no --since/--until: it exports every run past the last export"
        )
    fmt = LakeFormat(fmt)
    if dataset is not None and (incremental or fmt is LakeFormat.delta):
        raise InvalidRequest("--dataset exports a new Parquet snapshot: no --incremental or delta")
    started = time.monotonic()
    out = out.expanduser().resolve()
    if fmt is LakeFormat.delta:
        summary = _export_delta(engine, out, filters, cut, incremental, extension_dir)
    elif incremental and out.is_dir() and any(out.iterdir()):
        with _exclusive(out / ".tracestore-export.lock"):
            summary = _export_parquet_more(engine, out, cut, extension_dir, schema_revision)
    else:
        # A first incremental export is a new snapshot (that --incremental can continue).
        summary = _export_parquet_new(
            engine, out, filters, cut, extension_dir, schema_revision, dataset
        )
    return ExportSummary(
        path=summary.path,
        format=summary.format,
        manifest=summary.manifest,
        written=summary.written,
        runs=summary.runs,
        after=summary.after,
        upto=summary.upto,
        files=summary.files,
        seconds=time.monotonic() - started,
        notices=[*cut.notices, *summary.notices],
        removed_runs=summary.removed_runs,
        deletion_commits=summary.deletion_commits,
    )


# --- staging: the batch as Parquet, written by DuckDB ---------------------------------------


def _staging_dir(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def _select(name: str, columns: list[str], store_id: str) -> tuple[str, bool]:
    """The SELECT that exports table `name` with its added columns, and if it has a day."""
    exprs = []
    for c in columns:
        col = f"t.{quote_ident(c)}"
        if c in lake.EPOCH_COLUMNS.get(name, ()):
            exprs.append(
                f"CASE WHEN {col} BETWEEN {_EPOCH_MIN} AND {_EPOCH_MAX} THEN to_timestamp({col}) "
                f"END AS {quote_ident(c)}"
            )
            exprs.append(f"{col} AS {quote_ident(c + lake.EPOCH_SUFFIX)}")
        else:
            exprs.append(col)
    store = f"{sql_literal(store_id)} AS {STORE_COLUMN}"
    table = quote_ident(name)
    if name == "runs":
        cols = ", ".join([*exprs, store])
        return (
            f"SELECT {cols}, x.day FROM runs AS t JOIN _export_runs AS x ON x.run_pk = t.id",
            True,
        )
    cols = ", ".join([*exprs, "x.run_id", "x.ingest_seq", store])
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
    cols = ", ".join([*exprs, store])
    return f"SELECT {cols} FROM {table} AS t", PARTITION in columns


def _table_columns(analytics: Analytics, name: str) -> list[str]:
    rows = analytics.con.execute(f"DESCRIBE main.{quote_ident(name)}").fetchall()
    return [str(r[0]) for r in rows]


def _stage_table(
    analytics: Analytics, staging: Path, name: str, store_id: str, stem: str
) -> _Staged:
    columns = _table_columns(analytics, name)
    select, partitioned = _select(name, columns, store_id)
    described = analytics.con.execute(f"DESCRIBE ({select})").fetchall()
    # Ordered by key: the same batch exports the same bytes, so checksums compare.
    files, partitioned = _copy_out(
        analytics,
        staging / name,
        stem,
        f"{select} ORDER BY t.{quote_ident(columns[0])}",
        partitioned,
    )
    return _Staged(
        rows=sum(_parquet_rows(p) for p in files),
        partitioned=partitioned,
        columns=[{"name": str(c[0]), "type": str(c[1])} for c in described],
        files=files,
        stem=stem,
    )


def _copy_out(
    analytics: Analytics, target: Path, stem: str, ordered: str, partitioned: bool
) -> tuple[list[Path], bool]:
    """Write the rows of the SELECT `ordered` as Parquet under `target`; returns the files
    and whether they sit in `day=` folders."""
    pattern = sql_literal(stem + "_{i}")
    if partitioned:
        options = (
            f"FORMAT parquet, COMPRESSION zstd, PARTITION_BY ({PARTITION}), "
            f"FILENAME_PATTERN {pattern}"
        )
        analytics.con.execute(f"COPY ({ordered}) TO {sql_literal(str(target))} ({options})")
    files = sorted(target.rglob("*.parquet")) if target.exists() else []
    if not files:
        # An empty table still gets a file, so Spark and Trino can read its schema.
        target.mkdir(parents=True, exist_ok=True)
        path = target / f"{stem}_0.parquet"
        analytics.con.execute(
            f"COPY ({ordered}) TO {sql_literal(str(path))} (FORMAT parquet, COMPRESSION zstd)"
        )
        files = [path]
        partitioned = False
    return files, partitioned


@dataclass(slots=True)
class _Batch:
    """The staged batch: its runs and, per table, its files."""

    runs: int
    first_received: str | None
    last_received: str | None
    tables: dict[str, _Staged]
    # The dataset the batch is limited to (its header), and for a Delta export the runs
    # deleted from the store since the last one: (run_id, ingest_seq), and where the
    # next export starts reading the audit (issue 20).
    dataset: dict[str, Any] | None = None
    deletions: list[tuple[str, int | None]] = field(default_factory=list)
    deletions_upto: int | None = None


def _stage(
    engine: Engine,
    staging: Path,
    filters: Filters,
    cut: Cut,
    after: int | None,
    extension_dir: Path | None,
    dataset: str | None = None,
    deletions_after: int | None = None,
) -> tuple[_Batch, list[str]]:
    with open_live(engine, extension_dir=extension_dir, writable_dir=staging) as analytics:
        con = analytics.con
        attached = _attached(analytics)
        # On PostgreSQL one DuckDB transaction is one REPEATABLE READ transaction of the
        # postgres scanner: the runs and every table are read in one snapshot. The sqlite
        # scanner has no such thing (each scan opens connections of its own), which
        # `_leave_out_gone` makes up for.
        one_snapshot = attached and engine.dialect.name == "postgresql"
        if one_snapshot:
            con.execute("BEGIN TRANSACTION")
        try:
            header = _dataset_header(con, dataset) if dataset is not None else None
            # The deletions this export applies are read before any run is: a run deleted
            # while its rows are being staged is then past their range, and the next export
            # deletes the rows this one writes. Read last (as they were), that deletion fell
            # in this export's range, applied before the staged rows went in: the run stayed
            # in the lake for good, partly (found by exploratory QA, on SQLite).
            deletions = None if deletions_after is None else _deletions(con, cut, deletions_after)
            con.execute(
                "CREATE TEMP TABLE _export_runs AS "
                "SELECT id AS run_pk, run_id, ingest_seq, received_at, "
                "CAST(timezone('UTC', received_at) AS DATE) AS day "
                "FROM runs WHERE ingest_seq < $upto AND ($after IS NULL OR ingest_seq >= $after) "
                "AND ($since IS NULL OR received_at >= $since) "
                "AND ($until IS NULL OR received_at < $until) "
                "AND ($dataset IS NULL OR run_id IN (SELECT r.run_id FROM dataset_runs AS r "
                "JOIN datasets AS d ON d.id = r.dataset_pk WHERE d.name = $dataset))",
                {
                    "upto": cut.upto,
                    "after": after,
                    "since": filters.since,
                    "until": filters.until,
                    "dataset": dataset,
                },
            )
            tables: dict[str, _Staged] = {}
            for name in model_tables():
                if name not in analytics.tables or name in EXCLUDED_TABLES | NOT_EXPORTED:
                    continue

                def write(name: str = name) -> _Staged:
                    # A retry starts over: a failed COPY may have left some partitions behind.
                    shutil.rmtree(staging / name, ignore_errors=True)
                    stem = lake.file_stem(cut.store_id, after, cut.upto, name)
                    return _stage_table(analytics, staging, name, cut.store_id, stem)

                # On SQLite a JSON column holding a bare number trips the scanner mid-COPY:
                # the table is then read through SQLAlchemy and written again.
                tables[name] = analytics.retrying(write)
            if one_snapshot:
                con.execute("COMMIT")
        except BaseException:
            if one_snapshot:
                with suppress(duckdb.Error):  # the first error is the one to report
                    con.execute("ROLLBACK")
            raise
        _leave_out_gone(analytics, engine, attached, staging, tables)
        span = con.execute(
            "SELECT count(*), CAST(min(received_at) AS VARCHAR), "
            "CAST(max(received_at) AS VARCHAR) FROM _export_runs"
        ).fetchone()
        assert span is not None
        notices = list(analytics.notices)
        batch = _Batch(int(span[0]), _iso(span[1]), _iso(span[2]), tables, header)
        if deletions is not None:
            batch.deletions, batch.deletions_upto = deletions
    return batch, notices


def _attached(analytics: Analytics) -> bool:
    """Whether DuckDB reads the store through its scanner (else through SQLAlchemy copies)."""
    found = analytics.con.execute(
        "SELECT count(*) FROM duckdb_databases() WHERE database_name = 'store'"
    ).fetchone()
    return found is not None and found[0] > 0


def _leave_out_gone(
    analytics: Analytics,
    engine: Engine,
    attached: bool,
    staging: Path,
    tables: dict[str, _Staged],
) -> None:
    """Leave out of the staged batch the runs deleted while it was staged.

    Each table was read at a moment of its own (SQLite: no snapshot is common to DuckDB's
    scans): a run deleted meanwhile could keep its `runs` row and lose its children, or
    the reverse, and on SQLite the next run stored may take its key, its rows then staged
    as the deleted run's. A run still in the store now, with its key, run_id and
    ingest_seq (a new run never has all three), existed all along: every table holds all
    its rows, as ingest wrote them in one transaction. Runs stored meanwhile are past the
    cut, so no table holds them. What is left to do is to drop, from every table, the
    runs no longer there, found by one read of `runs` after the last table.
    """
    con = analytics.con
    if attached:
        schema = "public" if engine.dialect.name == "postgresql" else "main"
        current = f"store.{quote_ident(schema)}.runs"
    else:
        current = "_export_current"
        _register_current_runs(analytics, engine)
    con.execute(
        "CREATE TEMP TABLE _export_gone AS SELECT x.run_pk, x.run_id, x.ingest_seq "
        "FROM _export_runs AS x WHERE NOT EXISTS (SELECT 1 FROM "
        f"{current} AS r WHERE r.id = x.run_pk AND r.run_id = x.run_id "
        "AND r.ingest_seq = x.ingest_seq)"
    )
    found = con.execute("SELECT count(*) FROM _export_gone").fetchone()
    gone = int(found[0]) if found is not None else 0
    if not gone:
        return
    con.execute("DELETE FROM _export_runs WHERE run_pk IN (SELECT run_pk FROM _export_gone)")
    for name, staged in tables.items():
        if name in WHOLE_TABLES or staged.rows == 0:
            continue
        tables[name] = _restage_without_gone(analytics, staging, name, staged)
    what = "1 run was" if gone == 1 else f"{gone} runs were"
    analytics.notices.append(f"{what} deleted from the store while the export read it: left out")


def _register_current_runs(analytics: Analytics, engine: Engine) -> None:
    """The store's runs as they are now, read through SQLAlchemy (no scanner attached:
    the tables DuckDB reads are copies taken when it opened)."""
    import pyarrow as pa  # type: ignore[import-untyped]  # no type stubs
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, run_id, ingest_seq FROM runs")).all()
    data = pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "run_id": pa.array([r[1] for r in rows], pa.string()),
            "ingest_seq": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
    analytics.con.register("_export_current_arrow", data)
    try:
        analytics.con.execute("CREATE TEMP TABLE _export_current AS FROM _export_current_arrow")
    finally:
        analytics.con.unregister("_export_current_arrow")


def _restage_without_gone(
    analytics: Analytics, staging: Path, name: str, staged: _Staged
) -> _Staged:
    """Write a staged table again without the rows of the runs in `_export_gone` (by the
    run_id and ingest_seq every staged row carries)."""
    con = analytics.con
    target = staging / name

    def rows_in(folder: Path) -> str:
        files = ", ".join(sql_literal(str(folder / p.relative_to(target))) for p in staged.files)
        if staged.partitioned:
            return (
                f"read_parquet([{files}], hive_partitioning = true, hive_types = {{'day': DATE}})"
            )
        return f"read_parquet([{files}], hive_partitioning = false)"

    gone = "_export_gone AS g ON g.run_id = t.run_id AND g.ingest_seq = t.ingest_seq"
    hit = con.execute(f"SELECT count(*) FROM {rows_in(target)} AS t SEMI JOIN {gone}").fetchone()
    if hit is None or not hit[0]:
        return staged
    old = staging / f".{name}.before"
    shutil.rmtree(old, ignore_errors=True)
    os.replace(target, old)
    kept = (
        f"SELECT * FROM {rows_in(old)} AS t ANTI JOIN {gone} "
        f"ORDER BY t.{quote_ident(staged.columns[0]['name'])}"
    )
    files, partitioned = _copy_out(analytics, target, staged.stem, kept, staged.partitioned)
    shutil.rmtree(old, ignore_errors=True)
    return _Staged(
        rows=sum(_parquet_rows(p) for p in files),
        partitioned=partitioned,
        columns=staged.columns,
        files=files,
        stem=staged.stem,
    )


def _dataset_header(con: Any, name: str) -> dict[str, Any]:
    """The dataset's name, count and manifest hash, as the store holds them."""
    row = con.execute(
        "SELECT name, n_runs, manifest_hash, CAST(created_at AS VARCHAR) FROM datasets "
        "WHERE name = $name",
        {"name": name},
    ).fetchone()
    if row is None:
        raise InvalidRequest(f"no dataset named {name!r}", name=name)
    return {"name": row[0], "n_runs": row[1], "manifest_hash": row[2], "created_at": _iso(row[3])}


def _deletions(con: Any, cut: Cut, after: int) -> tuple[list[tuple[str, int | None]], int]:
    """Runs deleted from the store with `after <= deletion_seq < upto`, and `upto`.

    `deletion_seq` is assigned like `ingest_seq` (store/deletion.py): on PostgreSQL the
    deleting transaction's id, bounded by the cut's watermark (every deletion below it has
    committed); on SQLite a commit-ordered counter, read here in one snapshot before the
    runs are (a deletion still open, or one committed while the runs are read, holds a
    larger value, so the next export takes it).
    """
    if cut.kind == SQLITE_KIND:
        upto = con.execute(
            "SELECT coalesce(max(deletion_seq), 0) + 1 FROM run_deletions"
        ).fetchone()[0]
        upto = max(int(upto), after)
    else:
        upto = cut.upto
    rows = con.execute(
        "SELECT run_id, ingest_seq FROM run_deletions "
        "WHERE deletion_seq >= $after AND deletion_seq < $upto ORDER BY deletion_seq",
        {"after": after, "upto": upto},
    ).fetchall()
    return [(str(r[0]), None if r[1] is None else int(r[1])) for r in rows], upto


# Runs per Delta delete: the predicate names each (run_id, ingest_seq) pair.
_DELETE_CHUNK = 200


@dataclass(frozen=True, slots=True)
class _LakeDeletion:
    """What deleting the store's deleted runs did to the lake."""

    runs: int  # rows of `runs` deleted: runs the lake held
    commits: int  # Delta commits made (a delete that matches nothing makes none)


def _delete_from_lake(
    out: Path, store_id: str, deletions: list[tuple[str, int | None]]
) -> _LakeDeletion:
    """Delete the rows of deleted runs from every run table of the lake. A run is named
    with its ingest_seq: the same run_id stored again later (a new run) keeps its rows."""
    from deltalake import DeltaTable

    if not deletions:
        return _LakeDeletion(0, 0)
    commits = removed = 0
    store = f"{STORE_COLUMN} = {lake.sql_string(store_id)}"
    tables = [p for p in sorted(out.iterdir()) if p.name not in WHOLE_TABLES]
    for path in tables:
        if not lake.is_delta_table(path):
            continue
        table = DeltaTable(str(path))
        for start in range(0, len(deletions), _DELETE_CHUNK):
            runs = " OR ".join(
                f"(run_id = {lake.sql_string(run_id)}"
                + ("" if seq is None else f" AND ingest_seq = {int(seq)}")
                + ")"
                for run_id, seq in deletions[start : start + _DELETE_CHUNK]
            )
            version = table.version()
            metrics = table.delete(f"{store} AND ({runs})")
            commits += table.version() != version
            if path.name == "runs":
                removed += int(metrics.get("num_deleted_rows") or 0)
    return _LakeDeletion(removed, commits)


def _iso(text: str | None) -> str | None:
    # DuckDB renders TIMESTAMPTZ as '2025-11-20 11:59:59.123+00'; give ISO 8601.
    if text is None:
        return None
    return datetime.fromisoformat(text).astimezone(UTC).isoformat()


# --- Parquet --------------------------------------------------------------------------------


def _parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # no type stubs

    return int(pq.read_metadata(path).num_rows)


def _file_entries(root: Path, files: list[Path]) -> list[dict[str, Any]]:
    return [
        {
            "path": p.relative_to(root).as_posix(),
            "rows": _parquet_rows(p),
            "bytes": p.stat().st_size,
            "sha256": sha256_file(p),
        }
        for p in files
    ]


def _source(engine: Engine, notices: list[str]) -> dict[str, Any]:
    return {
        "backend": engine.dialect.name,
        "database": make_url(engine.url).render_as_string(hide_password=True),
        "notices": notices,
    }


def _batch_entry(batch: _Batch, cut: Cut, after: int | None) -> dict[str, Any]:
    return {
        "after": after,
        "upto": cut.upto,
        "runs": batch.runs,
        "first_received_at": batch.first_received,
        "last_received_at": batch.last_received,
        "created_at": datetime.now(UTC).isoformat(),
    }


def _export_parquet_new(
    engine: Engine,
    out: Path,
    filters: Filters,
    cut: Cut,
    extension_dir: Path | None,
    schema_revision: str | None,
    dataset: str | None = None,
) -> ExportSummary:
    _check_empty_target(out)
    staging = _staging_dir(out)
    try:
        batch, notices = _stage(engine, staging, filters, cut, None, extension_dir, dataset)
        tables = {
            name: {
                "rows": staged.rows,
                "partitioned": staged.partitioned,
                "columns": staged.columns,
                "files": _file_entries(staging, staged.files),
            }
            for name, staged in batch.tables.items()
        }
        complete = filters.since is None and filters.until is None
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "tracestore_version": __version__,
            "created_at": datetime.now(UTC).isoformat(),
            "since": filters.since.isoformat() if filters.since else None,
            "until": filters.until.isoformat() if filters.until else None,
            "time_range": {
                "runs": batch.runs,
                "first_received_at": batch.first_received,
                "last_received_at": batch.last_received,
            },
            "store_id": cut.store_id,
            # `complete`: every run of the store below `upto` is here (no time window),
            # so --incremental may continue from it.
            "watermark": {"kind": cut.kind, "upto": cut.upto, "complete": complete},
            "batches": [_batch_entry(batch, cut, None)],
            "partitioning": {
                "column": PARTITION,
                "type": "DATE",
                "meaning": "UTC date the run was received; rows of a run share its day",
            },
            "excluded_tables": sorted(EXCLUDED_TABLES),
            # The dataset this snapshot holds exactly (null: the store's runs).
            "dataset": batch.dataset,
            "tables": tables,
            "schema_revision": schema_revision,
            "source": _source(engine, notices),
        }
        lake.write_json(staging / MANIFEST, manifest)
        _check_empty_target(out)
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportSummary(
        path=out,
        format=LakeFormat.parquet,
        manifest=manifest,
        written={n: t.rows for n, t in batch.tables.items()},
        runs=batch.runs,
        after=None,
        upto=cut.upto,
        files=sum(len(t.files) for t in batch.tables.values()),
        seconds=0.0,
        notices=notices,
    )


def _continuable(out: Path, cut: Cut) -> dict[str, Any]:
    """The manifest of the snapshot at `out`, checked to be this store's and complete."""
    data = read_manifest(out).data
    if data.get("store_id") != cut.store_id:
        other = data.get("store_id")
        raise InvalidRequest(
            f"{out} holds "
            + (f"store {other}'s snapshot" if other else "a snapshot from an older tracestore")
            + f", not this store's ({cut.store_id}): export into another directory"
        )
    dataset = data.get("dataset")
    if dataset:
        # Continued, it would hold the runs stored since, which are not the dataset's,
        # under a manifest that still names the dataset and its hash.
        raise InvalidRequest(
            f"{out} is the snapshot of dataset {dataset.get('name')!r}: it holds exactly its "
            "runs and takes no --incremental; export the whole store into another directory"
        )
    mark = data.get("watermark") or {}
    if mark.get("kind") != cut.kind:
        raise InvalidRequest(
            f"{out} was exported from a {mark.get('kind')} sequence, this store has a "
            f"{cut.kind} one (moved to another database?): start a new snapshot"
        )
    if not mark.get("complete"):
        raise InvalidRequest(
            f"{out} was exported with --since/--until, so it lacks runs outside that window: "
            "an incremental export needs a complete snapshot to continue; start a new one"
        )
    return data


def _leftovers(out: Path, data: dict[str, Any]) -> list[Path]:
    """Files a died export moved in without listing them in the manifest."""
    listed = {f["path"] for t in data["tables"].values() for f in t["files"]}
    found = []
    for name in data["tables"]:
        folder = out / name
        if folder.is_dir():
            found += [
                p
                for p in folder.rglob("*.parquet")
                if lake.is_our_file(p.name) and p.relative_to(out).as_posix() not in listed
            ]
    return found


def _export_parquet_more(
    engine: Engine,
    out: Path,
    cut: Cut,
    extension_dir: Path | None,
    schema_revision: str | None,
) -> ExportSummary:
    data = _continuable(out, cut)
    for path in _leftovers(out, data):
        path.unlink()
    after = int(data["watermark"]["upto"])
    if cut.upto < after:
        raise InvalidRequest(
            f"{out} already holds runs up to sequence {after}, past this store's {cut.upto}"
        )
    staging = _staging_dir(out)
    retired: list[Path] = []
    try:
        batch, notices = _stage(engine, staging, Filters(), cut, after, extension_dir)
        moved = 0
        for name, staged in batch.tables.items():
            entry = data["tables"].get(name)
            placeholder = entry is not None and not entry["partitioned"] and entry["rows"] == 0
            if name in WHOLE_TABLES or entry is None or (placeholder and staged.rows):
                # Replaced: legacy_reads (whole each time), a new table, or a table whose
                # empty placeholder file gives way to real partitions.
                if entry is not None:
                    retired += [out / f["path"] for f in entry["files"]]
                entry = data["tables"][name] = {
                    "rows": 0,
                    "partitioned": staged.partitioned,
                    "files": [],
                }
            elif staged.rows == 0:
                continue  # nothing new, and the table already has its files
            entry["columns"] = staged.columns
            for path in staged.files:
                final = out / path.relative_to(staging)
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, final)
                entry["files"] += _file_entries(out, [final])
                moved += 1
            entry["rows"] = sum(f["rows"] for f in entry["files"])
            entry["partitioned"] = entry["partitioned"] or staged.partitioned
        span = data["time_range"]
        span["runs"] += batch.runs
        if batch.runs:
            span["first_received_at"] = min(
                filter(None, [span.get("first_received_at"), batch.first_received])
            )
            span["last_received_at"] = max(
                filter(None, [span.get("last_received_at"), batch.last_received])
            )
        data["watermark"]["upto"] = cut.upto
        data["batches"] = [*data.get("batches", []), _batch_entry(batch, cut, after)]
        data["updated_at"] = datetime.now(UTC).isoformat()
        data["schema_revision"] = schema_revision
        data["tracestore_version"] = __version__
        data["source"] = _source(engine, notices)
        # The commit point: from here the manifest lists the new files, not the old.
        lake.write_json(out / MANIFEST, data)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for path in retired:
        path.unlink(missing_ok=True)
    return ExportSummary(
        path=out,
        format=LakeFormat.parquet,
        manifest=data,
        written={n: t.rows for n, t in batch.tables.items()},
        runs=batch.runs,
        after=after,
        upto=cut.upto,
        files=moved,
        seconds=0.0,
        notices=notices,
    )


# --- Delta Lake -----------------------------------------------------------------------------


def _day_bounds(filters: Filters) -> list[str]:
    """Predicate terms for a window of whole days (a Delta export replaces whole days)."""
    terms = []
    for bound, op in ((filters.since, ">="), (filters.until, "<")):
        if bound is None:
            continue
        utc = bound.astimezone(UTC)
        if utc.timetz() != clock(0, tzinfo=UTC):
            raise InvalidRequest(
                "a Delta export replaces whole days: give --since/--until as dates "
                f"(YYYY-MM-DD), not {bound.isoformat()}"
            )
        terms.append(f"day {op} '{utc.date().isoformat()}'")
    return terms


def _export_delta(
    engine: Engine,
    out: Path,
    filters: Filters,
    cut: Cut,
    incremental: bool,
    extension_dir: Path | None,
) -> ExportSummary:
    if (out / MANIFEST).exists():
        raise InvalidRequest(
            f"{out} is a Parquet snapshot: a Delta lake goes into a directory of its own"
        )
    if out.exists() and any(out.iterdir()) and lake.detect_or_none(out) != "delta":
        raise InvalidRequest(f"{out} is not empty and holds no tracestore lake: use another one")
    out.mkdir(parents=True, exist_ok=True)
    window = _day_bounds(filters)
    with _exclusive(lake.state_path(out, cut.store_id).with_suffix(".lock")):
        state = lake.read_state(out, cut.store_id)
        if state.kind is not None and state.kind != cut.kind:
            raise InvalidRequest(
                f"the lake's exports of store {cut.store_id} came from a {state.kind} sequence, "
                f"this store has a {cut.kind} one (moved to another database?): "
                "export it into a new lake"
            )
        after = state.upto if incremental else None
        if after is not None and cut.upto < after:
            raise InvalidRequest(
                f"the lake holds store {cut.store_id} up to sequence {after}, past its {cut.upto}"
            )
        staging = _staging_dir(out)
        deletions_after = int(state.data.get("deletions_upto") or 0)
        try:
            batch, notices = _stage(
                engine, staging, filters, cut, after, extension_dir, None, deletions_after
            )
            # Runs deleted from the store since the last export leave the lake first.
            removed = _delete_from_lake(out, cut.store_id, batch.deletions)
            store = f"{STORE_COLUMN} = {lake.sql_string(cut.store_id)}"
            if window:
                by_run = " AND ".join([store, *window])
            elif incremental:
                seq = [f"ingest_seq < {cut.upto}"]
                if after is not None:
                    seq.insert(0, f"ingest_seq >= {after}")
                by_run = " AND ".join([store, *seq])
            else:
                by_run = store
            metadata = {
                "tracestore.store_id": cut.store_id,
                "tracestore.after": "" if after is None else str(after),
                "tracestore.upto": str(cut.upto),
                "tracestore.mode": "incremental" if incremental else "window" if window else "full",
            }
            versions: dict[str, int] = {}
            written: dict[str, int] = {}
            # Children first, runs last: a reader that starts from runs never meets a run
            # whose rows are not all there yet.
            for name in reversed(list(batch.tables)):
                staged = batch.tables[name]
                path = out / name
                if batch.runs == 0 and name not in WHOLE_TABLES and lake.is_delta_table(path):
                    continue  # nothing to add or replace
                predicate = store if name in WHOLE_TABLES else by_run
                versions[name] = lake.write_delta(
                    path, staged.files, staged.partitioned, predicate, metadata
                )
                written[name] = staged.rows
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        lake.write_lake_file(out, {n: t.columns for n, t in batch.tables.items()})
        complete = not window
        entry = {
            **_batch_entry(batch, cut, after),
            "mode": metadata["tracestore.mode"],
            "window": window,
            "rows": written,
            "versions": versions,
            # Runs deleted from the store in the range; of them, those the lake held.
            "deleted_runs": len(batch.deletions),
            "removed_runs": removed.runs,
            "deletions": {"after": deletions_after, "upto": batch.deletions_upto},
            "deletion_commits": removed.commits,
        }
        # Where the next export starts reading the deletion audit (kept in the state).
        state.data["deletions_upto"] = batch.deletions_upto
        data = lake.record_export(out, state, cut.kind, cut.upto if complete else None, entry)
    return ExportSummary(
        path=out,
        format=LakeFormat.delta,
        manifest=data,
        written=written,
        runs=batch.runs,
        after=after,
        upto=cut.upto,
        files=len(versions) + removed.commits,
        seconds=0.0,
        notices=notices,
        removed_runs=removed.runs,
        deletion_commits=removed.commits,
    )


# --- a dataset's runs (issue 20) ----------------------------------------------------------


def export_dataset(
    url: str, out: Path, dataset: str, *, schema_revision: str | None = None
) -> ExportSummary:
    """A new Parquet snapshot of exactly the runs of `dataset` (and their rows), from the
    live store at `url`: cut and run where reports/live.py runs a full export."""
    from tracestore.reports import live

    # live.export's own steps, with the dataset: the cut in this process, the DuckDB work
    # in an analytics child.
    cut = live._cut(url)
    return live._dispatch(url, _export_dataset_in, out, dataset, cut, schema_revision)


def _export_dataset_in(
    url: str, ext: str | None, out: Path, dataset: str, cut: Cut, schema_revision: str | None
) -> ExportSummary:
    from sqlalchemy.pool import NullPool

    from tracestore.db.engine import create_engine

    engine = create_engine(url, poolclass=NullPool)
    try:
        return export_snapshot(
            engine,
            out,
            Filters(),
            cut,
            extension_dir=Path(ext) if ext is not None else None,
            schema_revision=schema_revision,
            dataset=dataset,
        )
    finally:
        engine.dispose()

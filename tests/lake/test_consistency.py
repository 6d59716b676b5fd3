"""An export is one consistent picture of its runs while runs are deleted and stored, on both
databases: every row of every table belongs to a run in the export's `runs`, and every run
there has all its rows. DuckDB reads each store table in a read of its own (on SQLite in
no snapshot common to them), so a run deleted while its tables were copied left a `runs`
row without children, or children without it; on SQLite the next run stored took the
deleted run's key, and its rows were exported as the deleted run's."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from sqlalchemy import text

from tests.lake.conftest import (
    EXPORT_WHILE_RUNS_CHANGE,
    RUN_TABLES,
    LakeStore,
    rollout,
    settled,
)
from tracestore.reports.snapshot import verify_snapshot
from tracestore.reports.watermark import take_cut

# Children: (run_id, ingest_seq) of every row; `runs`: its own.
Keys = dict[str, Counter[tuple[str, int]]]


def _parquet_keys(snapshot: Path) -> Keys:
    assert verify_snapshot(snapshot) == []
    manifest = json.loads((snapshot / "manifest.json").read_text())
    con = duckdb.connect()
    try:
        keys: Keys = {}
        for table in RUN_TABLES:
            files = [str(snapshot / f["path"]) for f in manifest["tables"][table]["files"]]
            rows = con.execute(
                "SELECT run_id, ingest_seq FROM read_parquet($files, union_by_name = true)",
                {"files": files},
            ).fetchall()
            keys[table] = Counter((str(r), int(s)) for r, s in rows)
            entry = manifest["tables"][table]
            assert entry["rows"] == len(rows), table
            # The files hold the columns the manifest lists (an empty table's too).
            hive = "true" if entry["partitioned"] else "false"
            described = con.execute(
                f"DESCRIBE SELECT * FROM read_parquet($files, hive_partitioning = {hive})",
                {"files": files},
            ).fetchall()
            assert [c[0] for c in described] == [c["name"] for c in entry["columns"]], table
    finally:
        con.close()
    return keys


def _delta_keys(lake: Path, store_id: str) -> Keys:
    from deltalake import DeltaTable

    keys: Keys = {}
    for table in RUN_TABLES:
        path = lake / table
        if not (path / "_delta_log").is_dir():
            keys[table] = Counter()
            continue
        data = DeltaTable(str(path)).to_pyarrow_table(
            columns=["run_id", "ingest_seq"], filters=[("store_id", "=", store_id)]
        )
        keys[table] = Counter(
            zip(
                data.column("run_id").to_pylist(),
                data.column("ingest_seq").to_pylist(),
                strict=True,
            )
        )
    return keys


def _store_keys(store: LakeStore) -> Keys:
    """(run_id, ingest_seq) of every row of the run tables, as the store holds them."""
    keys: Keys = {}
    with store.engine.connect() as conn:
        for table in RUN_TABLES:
            if table == "runs":
                sql = "SELECT run_id, ingest_seq FROM runs"
            elif table == "trace_time_steps":
                sql = (
                    "SELECT r.run_id, r.ingest_seq FROM trace_time_steps t "
                    "JOIN traces tr ON tr.id = t.trace_pk JOIN runs r ON r.id = tr.run_pk"
                )
            else:
                sql = f"SELECT r.run_id, r.ingest_seq FROM {table} t JOIN runs r ON r.id = t.run_pk"
            keys[table] = Counter((str(r), int(s)) for r, s in conn.execute(text(sql)))
    return keys


def _pk(store: LakeStore, run_id: str) -> int:
    with store.engine.connect() as conn:
        found = conn.execute(text("SELECT id FROM runs WHERE run_id = :r"), {"r": run_id})
        return int(found.scalar_one())


def _check_consistent(exported: Keys, before: Keys, runs: set[str], maybe: set[str]) -> None:
    """`runs` are exported, and perhaps `maybe` (deleted meanwhile), each with every row the
    store held of it before the export (and nothing else)."""
    held = set(exported["runs"])
    assert runs <= {r for r, _ in held} <= runs | maybe
    assert all(n == 1 for n in exported["runs"].values()), exported["runs"]
    assert held <= set(before["runs"])  # every exported run is the store's, by run_id and seq
    for table in RUN_TABLES[1:]:
        orphans = set(exported[table]) - held
        assert not orphans, (table, orphans)
        mine = Counter({k: n for k, n in before[table].items() if k in held})
        assert exported[table] == mine, table


@pytest.mark.parametrize(
    ("mode", "after_table", "runs"),
    [
        ("new", "runs", ("keep", "early")),
        ("new", "trace_events", ("keep", "early")),
        ("new", "runs", ()),  # every table left empty
        ("incremental", "runs", ("keep", "early")),
        ("delta", "runs", ("keep", "early")),
    ],
)
def test_runs_deleted_and_stored_while_an_export_stages_them(
    lake_store: LakeStore, tmp_path: Path, mode: str, after_table: str, runs: tuple[str, ...]
) -> None:
    out = tmp_path / ("lake" if mode == "delta" else "snap")
    fmt = "delta" if mode == "delta" else "parquet"
    if runs:
        lake_store.ingest(runs[0])
    if mode != "new":
        lake_store.export(out, fmt=fmt, incremental=True)  # the export below adds to it
    # `doomed` is stored last: on SQLite the next run stored takes its key once it is gone.
    lake_store.ingest(*runs[1:], "doomed")
    newcomer = tmp_path / "newcomer.json"
    doc = rollout("newcomer")
    for rows in ("event_history", "markov_blanket_message_history"):
        doc["trace"][rows] *= 2  # its rows, if exported as doomed's, would not count alike
    newcomer.write_text(json.dumps(doc))
    settled(lake_store.engine)
    before = _store_keys(lake_store)
    doomed_pk = _pk(lake_store, "doomed")
    cut = take_cut(lake_store.engine)
    tracestore = str(Path(sys.executable).parent / "tracestore")
    args = [
        lake_store.url,
        str(out),
        fmt,
        "no" if mode == "new" else "yes",
        tracestore,
        cut.store_id,
        cut.kind,
        str(cut.upto),
        after_table,
        "doomed",
        str(newcomer),
    ]
    done = subprocess.run(
        [sys.executable, "-c", EXPORT_WHILE_RUNS_CHANGE, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    tables = done.stdout.split()
    assert after_table in tables[:-1], tables  # the change came before the last table staged
    assert lake_store.run_ids() == {*runs, "newcomer"}
    if lake_store.backend == "sqlite":
        # The reused key did happen: the newcomer holds doomed's old key.
        assert _pk(lake_store, "newcomer") == doomed_pk

    exported = _delta_keys(out, cut.store_id) if mode == "delta" else _parquet_keys(out)
    _check_consistent(exported, before, set(runs), {"doomed"})

"""Deletion reaches the lake (issue 20.4), on both databases: the next Delta export deletes a
deleted run's rows from every table, keeps a run_id stored again as a new run, and records
it in the store's state; a dataset exports as its own Parquet snapshot."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.lake.conftest import (
    EXPORT_WHILE_RUNS_CHANGE,
    RUN_TABLES,
    LakeStore,
    check_lake_once,
    delta_keys,
    lake_store,
    rollout,
    settled,
)
from tracestore.db.uow import write_session
from tracestore.errors import InvalidRequest
from tracestore.ingest.service import ingest_bytes
from tracestore.reports import lake as lake_files
from tracestore.reports.export import export_dataset
from tracestore.reports.watermark import take_cut
from tracestore.store.datasets import create_dataset
from tracestore.store.deletion import Deletion, delete_run
from tracestore.store.runs import RunFilter

__all__ = ["lake_store"]  # the fixture, shared with tests/lake


def _delete(store: LakeStore, *run_ids: str) -> None:
    for run_id in run_ids:
        with write_session(store.engine) as session:
            delete_run(session, run_id, Deletion("test", "cli"), datetime.now(UTC))


def _run_rows(lake: Path, run_id: str) -> dict[str, int]:
    return {t: sum(1 for _, r in delta_keys(lake, t, "run_id") if r == run_id) for t in RUN_TABLES}


def test_the_next_delta_export_deletes_deleted_runs(lake_store: LakeStore, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake_store.ingest("r1", "r2", "r3", "r4")
    lake_store.export(lake)
    assert check_lake_once(lake, lake_store) == {"r1", "r2", "r3", "r4"}
    # The run has rows in the lake's tables (not every table: it has no drift, no step).
    held = _run_rows(lake, "r2")
    assert all(held[t] > 0 for t in ("runs", "trajectories", "steps", "traces", "trace_events"))

    # One delete commit per table holding rows of either run (one chunk of runs each).
    holding = {t for t in RUN_TABLES if held[t] or _run_rows(lake, "r3")[t]}
    _delete(lake_store, "r2", "r3")
    # r3 comes back as a new run (other content): the lake must keep the new one.
    again = rollout("r3")
    again["metrics"]["note"] = "stored again"
    assert ingest_bytes(lake_store.engine, json.dumps(again).encode()).status == "created"

    summary = lake_store.export(lake)
    assert check_lake_once(lake, lake_store) == {"r1", "r3", "r4"}
    assert set(_run_rows(lake, "r2").values()) == {0}
    assert set(_run_rows(lake, "r3").values()) - {0}  # the new r3's rows
    with lake_store.engine.connect() as conn:
        seq = conn.exec_driver_sql("SELECT ingest_seq FROM runs WHERE run_id = 'r3'").scalar()
    assert {s for (_, s) in delta_keys(lake, "runs", "ingest_seq")} >= {seq}
    for table in RUN_TABLES:
        assert len(delta_keys(lake, table, "run_id")) == lake_store.counts()[table], table

    entry = summary.manifest["exports"][-1]
    assert entry["deleted_runs"] == 2
    assert entry["removed_runs"] == summary.removed_runs == 2
    assert entry["deletion_commits"] == summary.deletion_commits == len(holding)
    # The summary's Delta commits count the deletions' too (it left them out), and says so.
    assert summary.files == len(entry["versions"]) + len(holding)
    line = summary.line()
    assert f": {summary.files} Delta commits (" in line
    assert line.endswith(f"; {len(holding)} of them removed 2 deleted runs from the lake")
    state = lake_files.read_state(lake, lake_store.store_id())
    assert state.data["deletions_upto"] == entry["deletions"]["upto"]
    assert entry["deletions"]["upto"] > entry["deletions"]["after"]

    # The next export has nothing more to delete and changes nothing.
    quiet = lake_store.export(lake)
    assert quiet.manifest["exports"][-1]["deleted_runs"] == 0
    assert (quiet.removed_runs, quiet.deletion_commits) == (0, 0)
    assert quiet.files == len(quiet.manifest["exports"][-1]["versions"])
    assert quiet.line().endswith("; no deleted run to remove from the lake")
    # A run deleted before any export took it: nothing to remove, and no commit made (a
    # Delta delete that matches no row commits nothing; each was counted as one).
    lake_store.ingest("fleeting")
    _delete(lake_store, "fleeting")
    passing = lake_store.export(lake)
    assert passing.manifest["exports"][-1]["deleted_runs"] == 1
    assert (passing.removed_runs, passing.deletion_commits) == (0, 0)
    assert check_lake_once(lake, lake_store) == {"r1", "r3", "r4"}


def test_a_dataset_exports_exactly_its_runs(lake_store: LakeStore, tmp_path: Path) -> None:
    lake_store.ingest("a1", "a2", "b1")
    made_at = datetime.now(UTC)
    with write_session(lake_store.engine) as session:
        made = create_dataset(
            session,
            "pair",
            RunFilter(correlation_id=None, trace_kind=None),
            created_by="t",
            now=made_at,
        )
    lake_store.ingest("late")  # after the dataset: not in it
    settled(lake_store.engine)  # PostgreSQL: no transaction on the server holds the cut back
    out = tmp_path / "snap"
    summary = export_dataset(lake_store.url, out, "pair")
    assert summary.runs == 3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dataset"]["name"] == "pair"
    assert manifest["dataset"]["manifest_hash"] == made["manifest_hash"]
    # ISO 8601 in UTC, like every other time of the manifest (it was DuckDB's rendering).
    assert manifest["dataset"]["created_at"] == made_at.isoformat()
    assert manifest["tables"]["runs"]["rows"] == 3
    assert "run_deletions" not in manifest["tables"]

    # Continued, the snapshot took the runs stored since (not the dataset's) under a
    # manifest still naming the dataset (found by exploratory QA): refused, untouched.
    def files() -> list[Path]:  # the export's lock file aside: every export makes it
        return sorted(p.relative_to(out) for p in out.rglob("*") if not p.name.endswith(".lock"))

    before = files()
    with pytest.raises(InvalidRequest, match="is the snapshot of dataset 'pair'"):
        lake_store.export(out, fmt="parquet", incremental=True)
    assert files() == before
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_deleting_the_newest_run_keeps_incremental_exports_going(
    lake_store: LakeStore, tmp_path: Path
) -> None:
    # On SQLite ingest_seq and the export's watermark are max + 1: over `runs` alone,
    # deleting the newest run lowered both, the next incremental export refused ("holds
    # runs up to sequence N, past its N - 1") and the next run reused the sequence.
    lake = tmp_path / "lake"
    lake_store.ingest("old", "newest")
    lake_store.export(lake)
    _delete(lake_store, "newest")
    lake_store.ingest("next")
    lake_store.export(lake)
    assert check_lake_once(lake, lake_store) == {"old", "next"}


def test_a_run_deleted_while_an_export_stages_it_never_reaches_the_lake(
    lake_store: LakeStore, tmp_path: Path
) -> None:
    # The deletion commits after the export fixed its runs, while it copies their tables.
    # On SQLite the export read its deletion range last, so that deletion fell in it:
    # applied to the lake before the staged rows went in, then recorded as done. The run
    # stayed in the lake for good, partly (found by exploratory QA).
    lake = tmp_path / "lake"
    lake_store.ingest("keep")
    lake_store.export(lake)
    lake_store.ingest("doomed", "late")  # the next export's runs
    settled(lake_store.engine)
    cut = take_cut(lake_store.engine)
    tracestore = str(Path(sys.executable).parent / "tracestore")
    # Once `runs` is staged, another process deletes "doomed" (and stores nothing).
    args = [lake_store.url, str(lake), "delta", "yes", tracestore, cut.store_id, cut.kind]
    args += [str(cut.upto), "runs", "doomed", ""]
    done = subprocess.run(
        [sys.executable, "-c", EXPORT_WHILE_RUNS_CHANGE, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    tables = done.stdout.split()
    assert "runs" in tables[:-1], tables  # the delete came before the last table staged
    with lake_store.engine.connect() as conn:
        gone = conn.exec_driver_sql("SELECT count(*) FROM runs WHERE run_id = 'doomed'")
        assert gone.scalar() == 0
    # That export left the run out, deleted while it was staged (it wrote its `runs` row,
    # the children gone: tests/lake/test_consistency.py); the next one has nothing to do.
    assert set(_run_rows(lake, "doomed").values()) == {0}
    lake_store.export(lake)
    assert set(_run_rows(lake, "doomed").values()) == {0}
    assert check_lake_once(lake, lake_store) == {"keep", "late"}

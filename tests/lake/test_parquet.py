"""Parquet exports (issue 15, item 2): unique file names, incremental batches, one store each."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from tests.lake.conftest import RUN_TABLES, LakeStore, OpenWrite
from tracestore.errors import InvalidRequest
from tracestore.reports.connection import sql_literal
from tracestore.reports.snapshot import read_manifest, verify_snapshot


def _glob_runs(root: Path) -> list[str]:
    """run_ids as a reader that lists the files itself (Spark, plain DuckDB) sees them."""
    con = duckdb.connect()
    try:
        pattern = sql_literal(str(root / "runs" / "**" / "*.parquet"))
        rows = con.execute(
            f"SELECT run_id FROM read_parquet({pattern}, hive_partitioning = true)"
        ).fetchall()
    finally:
        con.close()
    return [r[0] for r in rows]


def test_an_incremental_snapshot_run_three_times_holds_every_run_once(
    lake_store: LakeStore, tmp_path: Path
) -> None:
    snap = tmp_path / "snap"
    lake_store.ingest("p1", "p2")
    lake_store.export(snap, fmt="parquet")
    late = OpenWrite(lake_store, "late")
    try:
        if lake_store.backend == "postgresql":
            lake_store.ingest("p3")
        lake_store.export(snap, fmt="parquet", settle=False)
        assert "late" not in _glob_runs(snap)
    finally:
        late.commit()
    lake_store.ingest("p4")
    want = lake_store.run_ids()
    for _ in range(120):  # PostgreSQL: another session's open transaction only delays it
        lake_store.export(snap, fmt="parquet")
        got = _glob_runs(snap)
        assert len(got) == len(set(got)), Counter(got).most_common(3)
        if set(got) == want:
            break
    assert set(got) == want
    assert verify_snapshot(snap) == []
    manifest = read_manifest(snap)
    counts = lake_store.counts()
    for table in RUN_TABLES:
        assert manifest.tables[table].rows == counts[table], table
    names = [Path(f).name for t in manifest.tables.values() for f in t.files]
    assert len(names) == len(set(names)), "file names repeat"
    assert not any(n == "data_0.parquet" for n in names)
    batches = manifest.data["batches"]
    assert [b["after"] for b in batches[1:]] == [b["upto"] for b in batches[:-1]]
    assert sum(b["runs"] for b in batches) == len(want)
    # legacy_reads is replaced whole, never piled up batch after batch.
    assert manifest.tables["legacy_reads"].rows == 0
    assert len(manifest.tables["legacy_reads"].files) == 1


def test_a_snapshot_refuses_another_store_and_keeps_its_files_apart(
    lake_store: LakeStore, store_factory: Callable[[str], LakeStore], tmp_path: Path
) -> None:
    other = store_factory("sqlite")
    lake_store.ingest("same", "mine")
    other.ingest("same", "theirs")
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    lake_store.export(mine, fmt="parquet")
    other.export(theirs, fmt="parquet")
    with pytest.raises(InvalidRequest, match=f"store {lake_store.store_id()}'s snapshot"):
        other.export(mine, fmt="parquet")
    with pytest.raises(InvalidRequest, match="not an empty directory"):
        other.export(mine, fmt="parquet", incremental=False)
    # Copied into one tree, two stores' files keep their names apart: nothing is lost.
    both = tmp_path / "both"
    for src in (mine, theirs):
        shutil.copytree(src, both, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.json"))
    files = list(both.rglob("*.parquet"))
    assert len(files) == len(list(mine.rglob("*.parquet"))) + len(list(theirs.rglob("*.parquet")))
    con = duckdb.connect()
    pattern = sql_literal(str(both / "runs" / "**" / "*.parquet"))
    rows = con.execute(
        f"SELECT store_id, run_id FROM read_parquet({pattern}, hive_partitioning = true)"
    ).fetchall()
    con.close()
    assert sorted(rows) == sorted(
        [
            (lake_store.store_id(), "same"),
            (lake_store.store_id(), "mine"),
            (other.store_id(), "same"),
            (other.store_id(), "theirs"),
        ]
    )


def test_files_a_died_export_left_behind_are_removed(lake_store: LakeStore, tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    lake_store.ingest("x1")
    lake_store.export(snap, fmt="parquet")
    listed = read_manifest(snap).tables["runs"].files[0]
    # As if an export had moved a batch's file in and died before its manifest.
    stray = (snap / listed).with_name(f"s{lake_store.store_id()[:12]}_q7-9_runs_0.parquet")
    shutil.copy(snap / listed, stray)
    assert len(_glob_runs(snap)) == 2
    lake_store.export(snap, fmt="parquet")
    assert not stray.exists()
    assert _glob_runs(snap) == ["x1"]


def test_a_windowed_snapshot_cannot_be_continued(lake_store: LakeStore, tmp_path: Path) -> None:
    from datetime import UTC, datetime

    snap = tmp_path / "snap"
    lake_store.ingest("w1")
    lake_store.export(
        snap, fmt="parquet", incremental=False, since=datetime(2020, 1, 1, tzinfo=UTC)
    )
    with pytest.raises(InvalidRequest, match="--since/--until"):
        lake_store.export(snap, fmt="parquet")


def test_the_summary_line_says_what_a_parquet_export_wrote(
    lake_store: LakeStore, tmp_path: Path
) -> None:
    lake_store.ingest("p1")
    summary = lake_store.export(tmp_path / "snap", fmt="parquet", incremental=False)
    rows = ", ".join(f"{n} {t}" for t, n in summary.rows.items())
    assert summary.line() == (
        f"exported 1 runs (ingest_seq [0, {summary.upto})) to {summary.path} in "
        f"{summary.seconds:.1f}s: {summary.files} Parquet files ({rows}); "
        f"manifest {summary.path / 'manifest.json'}"
    )

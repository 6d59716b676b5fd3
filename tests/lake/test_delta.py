"""Delta Lake exports (issue 15, items 2 and 4): incremental, idempotent, shared by stores.

Every check reads the lake with the engines themselves: the deltalake package and
DuckDB's delta extension.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.lake.conftest import (
    LakeStore,
    OpenWrite,
    check_lake_once,
    delta_keys,
    duck,
    export_until_complete,
)
from tracestore.errors import InvalidRequest
from tracestore.reports import lake as lake_files
from tracestore.reports.connection import sql_literal


def test_an_incremental_job_run_three_times_holds_every_run_once(
    lake_store: LakeStore, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    lake_store.ingest("r1", "r2", "r3")
    first = lake_store.export(lake)
    assert first.runs == 3
    assert first.after is None
    assert check_lake_once(lake, lake_store) == {"r1", "r2", "r3"}

    # A transaction stays open across the second run of the job, and (on PostgreSQL;
    # SQLite has one writer at a time) ingest goes on meanwhile.
    late = OpenWrite(lake_store, "late")
    try:
        if lake_store.backend == "postgresql":
            lake_store.ingest("r4", "r5")
        second = lake_store.export(lake, settle=False)
        assert second.after == first.upto
        got = check_lake_once(lake, lake_store)
        assert "late" not in got
        assert got <= {"r1", "r2", "r3", "r4", "r5"}
    finally:
        late.commit()
    if lake_store.backend == "sqlite":
        lake_store.ingest("r4", "r5")
    lake_store.ingest("r6")
    want = lake_store.run_ids()
    assert export_until_complete(lake_store, lake, want) == want

    # Rerunning the job with nothing new changes nothing.
    before = {t: delta_keys(lake, t, "run_id") for t in ("runs", "steps", "trace_events")}
    again = lake_store.export(lake)
    assert again.runs == 0
    assert {t: delta_keys(lake, t, "run_id") for t in before} == before
    # Every child row is there once, with its run's run_id.
    counts = lake_store.counts()
    for table, n in counts.items():
        assert len(delta_keys(lake, table, "run_id")) == n, table
    state = lake_files.read_state(lake, lake_store.store_id())
    assert state.upto == lake_store.exports[-1].upto
    assert [e["after"] for e in state.data["exports"]][:2] == [None, first.upto]


def test_a_reexport_replaces_the_runs_rows_and_never_duplicates_them(
    lake_store: LakeStore, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    lake_store.ingest("d1a", "d1b", "d2a")
    with lake_store.engine.begin() as conn:
        for run_id, day in (("d1a", 18), ("d1b", 18), ("d2a", 19)):
            conn.execute(
                text("UPDATE runs SET received_at = :t WHERE run_id = :r"),
                {"t": datetime(2025, 11, day, 9, tzinfo=UTC), "r": run_id},
            )
    lake_store.export(lake, incremental=False)
    lake_store.export(lake, incremental=False)
    assert check_lake_once(lake, lake_store) == {"d1a", "d1b", "d2a"}
    # The store changes a run (as a backfill or a recompute would): a day-range export
    # replaces that day's runs, leaves the other day alone, and duplicates nothing.
    with lake_store.engine.begin() as conn:
        conn.execute(text("UPDATE runs SET mean_return = 42.0 WHERE run_id = 'd1a'"))
        conn.execute(
            text(
                "DELETE FROM drift_checks WHERE run_pk = (SELECT id FROM runs WHERE run_id = 'd1b')"
            )
        )
    for _ in range(2):
        window = lake_store.export(
            lake,
            incremental=False,
            since=datetime(2025, 11, 18, tzinfo=UTC),
            until=datetime(2025, 11, 19, tzinfo=UTC),
        )
        assert window.runs == 2
        assert check_lake_once(lake, lake_store) == {"d1a", "d1b", "d2a"}
    con = duck()
    runs = sql_literal(str(lake / "runs"))
    checks = sql_literal(str(lake / "drift_checks"))
    assert con.execute(
        f"SELECT run_id, mean_return FROM delta_scan({runs}) ORDER BY run_id"
    ).fetchall() == [("d1a", 42.0), ("d1b", 1.0 * (3 % 5)), ("d2a", 1.0 * (3 % 5))]
    assert con.execute(f"SELECT run_id FROM delta_scan({checks}) ORDER BY 1").fetchall() == [
        ("d1a",),
        ("d2a",),
    ]
    con.close()
    # A day-range export does not move the incremental watermark.
    state = lake_files.read_state(lake, lake_store.store_id())
    assert state.upto == lake_store.exports[1].upto
    with pytest.raises(InvalidRequest, match="whole days"):
        lake_store.export(lake, incremental=False, since=datetime(2025, 11, 18, 6, tzinfo=UTC))


def test_rows_carry_store_run_and_sequence_and_times_are_timestamps(
    lake_store: LakeStore, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    lake_store.ingest("t1", "t2")
    lake_store.export(lake)
    sid = lake_store.store_id()
    con = duck()
    for table in ("steps", "trace_events", "trace_messages", "trace_time_steps", "drift_checks"):
        path = sql_literal(str(lake / table))
        bad = con.execute(
            f"SELECT count(*) FROM delta_scan({path}) WHERE store_id IS DISTINCT FROM ? "
            "OR run_id IS NULL OR ingest_seq IS NULL OR day IS NULL",
            [sid],
        ).fetchone()
        assert bad == (0,), table
    events = sql_literal(str(lake / "trace_events"))
    types = dict(
        con.execute(
            f"SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM delta_scan({events}))"
        ).fetchall()
    )
    assert types["event_time"] == "TIMESTAMP WITH TIME ZONE"
    assert types["event_time_epoch"] == "DOUBLE"
    assert types["day"] == "DATE"
    row = con.execute(
        f"SELECT epoch(event_time), event_time_epoch FROM delta_scan({events}) LIMIT 1"
    ).fetchone()
    assert row == (1763700000.25, 1763700000.25)
    # run_id agrees with the run the row's key points at.
    mismatched = con.execute(
        f"SELECT count(*) FROM delta_scan({events}) AS e "
        f"JOIN delta_scan({sql_literal(str(lake / 'runs'))}) AS r ON r.id = e.run_pk "
        "WHERE r.run_id <> e.run_id"
    ).fetchone()
    assert mismatched == (0,)
    con.close()


def test_stores_share_one_lake(
    lake_store: LakeStore, store_factory: Callable[[str], LakeStore], tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    other = store_factory("sqlite")
    lake_store.ingest("same", "mine")
    other.ingest("same", "theirs")
    lake_store.export(lake)
    other.export(lake)
    other.export(lake)
    rows = sorted(delta_keys(lake, "runs", "run_id"))
    a, b = lake_store.store_id(), other.store_id()
    assert rows == sorted([(a, "same"), (a, "mine"), (b, "same"), (b, "theirs")])
    assert sorted(lake_files.stores_in(lake)) == sorted([a, b])
    assert check_lake_once(lake, lake_store) == {"same", "mine"}


def test_time_travel_and_a_new_column(lake_store: LakeStore, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    lake = tmp_path / "lake"
    lake_store.ingest("v1")
    lake_store.export(lake)
    lake_store.ingest("v2")
    lake_store.export(lake)
    versions = [
        e["versions"]["runs"]
        for e in lake_files.read_state(lake, lake_store.store_id()).data["exports"]
    ]
    first = DeltaTable(str(lake / "runs"), version=versions[0]).to_pyarrow_table()
    assert first.column("run_id").to_pylist() == ["v1"]
    assert sorted(
        DeltaTable(str(lake / "runs")).to_pyarrow_table().column("run_id").to_pylist()
    ) == [
        "v1",
        "v2",
    ]
    # A newer tracestore with one more column writes into the same table.
    import pyarrow as pa  # type: ignore[import-untyped]  # no type stubs
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    stage = tmp_path / "stage" / "runs"
    (stage / "day=2025-11-20").mkdir(parents=True)
    old = DeltaTable(str(lake / "runs")).to_pyarrow_table().slice(0, 1).drop(["day"])
    newer = old.append_column("new_figure", pa.array([7], pa.int64()))
    pq.write_table(newer, stage / "day=2025-11-20" / "x_0.parquet")
    lake_files.write_delta(
        lake / "runs",
        [stage / "day=2025-11-20" / "x_0.parquet"],
        True,
        f"run_id = {lake_files.sql_string(str(old.column('run_id')[0]))}",
        {},
    )
    table = DeltaTable(str(lake / "runs")).to_pyarrow_table()
    assert table.num_rows == 2
    assert sorted(table.column("new_figure").to_pylist(), key=str) == [7, None]

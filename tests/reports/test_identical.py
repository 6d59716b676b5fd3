"""Reports on live SQLite, live PostgreSQL and their Parquet snapshots give identical results."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import duckdb
import orjson
import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type stubs
import pytest
from sqlalchemy import text

from tests.reports.conftest import Store
from tracestore.reports.catalog import get_report, list_reports
from tracestore.reports.connection import duck_type, model_tables, open_snapshot
from tracestore.reports.filters import Filters
from tracestore.reports.runner import run_report, run_sql
from tracestore.reports.snapshot import read_manifest, verify_snapshot

FILTERS = [
    Filters(),
    Filters(since=datetime(2025, 11, 19, tzinfo=UTC)),
    Filters(until=datetime(2025, 11, 19, 12, tzinfo=UTC), env="toolbox"),
]


def _sources(stores: dict[str, Store]) -> dict[str, Any]:
    sources: dict[str, Any] = {}
    for backend, store in stores.items():
        sources[f"{backend} live"] = store.live
        sources[f"{backend} snapshot"] = store.frozen
    return sources


@pytest.mark.parametrize("filters", FILTERS, ids=["all", "since", "until+env"])
def test_every_report_is_identical_on_every_source(
    stores: dict[str, Store], filters: Filters
) -> None:
    sources = _sources(stores)
    if len(stores) < 2:
        pytest.skip("needs SQLite and PostgreSQL (one is not selected or unreachable)")
    for report in list_reports():
        results = {name: run_report(a, report, filters) for name, a in sources.items()}
        first_name, first = next(iter(results.items()))
        if filters == Filters():
            assert first.table.num_rows > 0, report.name
        for name, result in results.items():
            # Same schema, same values, same order, to the last bit of every double.
            assert result.types == first.types, (report.name, name)
            assert result.table.equals(first.table), (report.name, first_name, name)


def test_sqlite_store_and_its_snapshot_agree(stores: dict[str, Store]) -> None:
    if "sqlite" not in stores:
        pytest.skip("SQLite not selected")
    store = stores["sqlite"]
    for report in list_reports():
        live = run_report(store.live, report, Filters())
        frozen = run_report(store.frozen, report, Filters())
        assert live.table.equals(frozen.table), report.name


def _content(store: Store, table: str) -> list[dict[str, Any]]:
    """A snapshot table's rows with JSON parsed (PostgreSQL's jsonb re-spells JSON text)."""
    manifest = read_manifest(store.snapshot)
    json_columns = {c.name for c in model_tables()[table].columns if duck_type(c) == "JSON"}
    rows: list[dict[str, Any]] = []
    for rel in manifest.tables[table].files:
        for row in pq.read_table(store.snapshot / rel).to_pylist():
            row.pop("day", None)
            # Each store's own: its id, and its sequence (a counter on SQLite, transaction
            # ids on PostgreSQL).
            row.pop("store_id", None)
            row.pop("ingest_seq", None)
            for column in json_columns:
                if row[column] is not None:
                    row[column] = orjson.loads(row[column])
            rows.append(row)
    key = model_tables()[table].primary_key.columns.keys()
    return sorted(rows, key=lambda r: tuple(r[k] for k in key))


def test_exports_of_both_databases_hold_the_same_content(stores: dict[str, Store]) -> None:
    if len(stores) < 2:
        pytest.skip("needs SQLite and PostgreSQL (one is not selected or unreachable)")
    sqlite, pg = stores["sqlite"], stores["postgresql"]
    a, b = read_manifest(sqlite.snapshot), read_manifest(pg.snapshot)
    assert set(a.tables) == set(b.tables)
    for table in a.tables:
        assert a.tables[table].rows == b.tables[table].rows, table
        assert a.tables[table].columns == b.tables[table].columns, table
        assert _content(sqlite, table) == _content(pg, table), table


def test_manifest_describes_the_snapshot(store: Store) -> None:
    manifest = read_manifest(store.snapshot)
    data = manifest.data
    assert verify_snapshot(store.snapshot) == []
    with store.engine.connect() as conn:
        revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
        for name, entry in manifest.tables.items():
            count = conn.execute(text(f"SELECT count(*) FROM {name}")).scalar_one()
            assert entry.rows == count, name
    assert manifest.schema_revision == revision
    assert "run_documents" not in manifest.tables
    assert data["excluded_tables"] == ["run_documents"]
    assert data["time_range"]["first_received_at"] == "2025-11-18T06:00:00+00:00"
    assert data["tracestore_version"]
    runs = manifest.tables["runs"]
    assert runs.partitioned
    assert sorted({f.split("/")[1] for f in runs.files}) == [
        "day=2025-11-18",
        "day=2025-11-19",
        "day=2025-11-20",
    ]
    for f in data["tables"]["steps"]["files"]:
        assert len(f["sha256"]) == 64
        assert f["bytes"] > 0
        assert f["rows"] > 0


def test_tampering_is_detected(store: Store, tmp_path: Any) -> None:
    import shutil

    copy = tmp_path / "snap"
    shutil.copytree(store.snapshot, copy)
    victim = copy / read_manifest(copy).tables["steps"].files[0]
    victim.write_bytes(victim.read_bytes()[:-1] + b"\0")
    problems = verify_snapshot(copy)
    assert problems
    assert "sha256" in problems[0]


def test_plain_duckdb_reads_the_snapshot_with_hive_partitioning(store: Store) -> None:
    # What docs/ANALYTICS.md tells DuckDB users to run: no tracestore involved.
    con = duckdb.connect()
    root = store.snapshot
    runs = con.execute(
        f"SELECT day, count(*) FROM read_parquet('{root}/runs/*/*.parquet', "
        "hive_partitioning = true) GROUP BY day ORDER BY day"
    ).fetchall()
    assert [str(d) for d, _ in runs] == ["2025-11-18", "2025-11-19", "2025-11-20"]
    steps = con.execute(
        f"SELECT count(*) FROM read_parquet('{root}/steps/**/*.parquet', hive_partitioning = true) "
        "WHERE day = DATE '2025-11-19'"
    ).fetchone()
    want = run_sql(
        store.live,
        "SELECT count(*) FROM steps JOIN run_facts USING (run_pk) "
        "WHERE run_facts.day = DATE '2025-11-19'",
    )
    assert steps is not None
    assert steps[0] == want.table.column(0)[0].as_py() > 0


def test_pyarrow_dataset_reads_the_partitions_like_spark(store: Store) -> None:
    import pyarrow.dataset as ds  # type: ignore[import-untyped]  # pyarrow ships no type stubs

    dataset = ds.dataset(store.snapshot / "steps", format="parquet", partitioning="hive")
    table = dataset.to_table(filter=ds.field("day") == "2025-11-18")
    assert table.num_rows > 0
    assert "day" in table.column_names


def test_a_snapshot_without_drift_tables_says_no_drift_data(store: Store, tmp_path: Any) -> None:
    import shutil

    old = tmp_path / "old"
    shutil.copytree(store.snapshot, old)
    manifest = orjson.loads((old / "manifest.json").read_bytes())
    for table in ("drift_checks", "drift_findings", "legacy_reads"):
        del manifest["tables"][table]
        shutil.rmtree(old / table)
    (old / "manifest.json").write_bytes(orjson.dumps(manifest))
    with open_snapshot(old) as analytics:
        drift = run_report(analytics, get_report("drift"), Filters())
        assert drift.table.num_rows == 0
        assert drift.columns == run_report(store.live, get_report("drift"), Filters()).columns
        assert any(n.startswith("no drift data") for n in drift.notices), drift.notices
        # Reports that do not need the drift tables are unaffected.
        returns = run_report(analytics, get_report("returns"), Filters())
        assert returns.notices == []
        assert returns.table.equals(run_report(store.live, get_report("returns"), Filters()).table)

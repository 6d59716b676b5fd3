"""The named reports over a Delta lake (issue 15, item 3): the same rows as the live store.

The store holds the reports suite's corpus (tests/reports: the examples and the hand-built
cases, receive times spread over three days), exported to a lake incrementally in two
batches, with another store's rows beside it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import Example, _PgDatabases, new_database
from tests.lake.conftest import LakeStore
from tests.reports.conftest import corpus, populate
from tests.reports.conftest import stored_runs as stored_runs  # the fixture, shared
from tests.reports.figures import StoredRun
from tests.reports.test_offline import PROVE_OFFLINE, _offline
from tracestore.cli.main import app
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.errors import InvalidRequest
from tracestore.ingest.service import ingest_bytes
from tracestore.reports import live, output
from tracestore.reports.catalog import get_report, list_reports
from tracestore.reports.connection import open_live, open_snapshot
from tracestore.reports.filters import Filters
from tracestore.reports.runner import run_report, run_sql


@pytest.fixture
def reports_lake(
    backend: str,
    tmp_path_factory: pytest.TempPathFactory,
    pg_databases: _PgDatabases | None,
    examples: list[Example],
    stored_runs: list[StoredRun],
) -> Iterator[tuple[LakeStore, Path]]:
    """The reports corpus in a store of `backend`, and a Delta lake it was exported to."""
    db = new_database(backend, "lakereports", tmp_path_factory, pg_databases)
    engine = create_engine(db.url)
    migrate.upgrade(engine)
    store = LakeStore(backend, db.url, engine)
    lake = tmp_path_factory.mktemp("reports-lake") / "lake"
    docs = corpus(examples)
    for raw in docs[: len(docs) // 2]:
        ingest_bytes(engine, raw)
    store.export(lake)  # the first half, received today
    # The rest, then fixed receive times for all (populate's own ingest of the first
    # half finds duplicates): the second batch carries the new runs only.
    populate(engine, examples, stored_runs)
    store.export(lake)
    # The first half's runs moved to other days: a full export replaces every row.
    store.export(lake, incremental=False)
    assert store.export(lake).runs == 0
    try:
        yield store, lake
    finally:
        engine.dispose()


def test_every_report_on_the_lake_equals_the_live_store(
    reports_lake: tuple[LakeStore, Path],
) -> None:
    store, lake = reports_lake
    assert store.run_ids(), "empty corpus"
    with open_live(store.engine, in_this_process=True) as on_live, open_snapshot(lake) as on_lake:
        assert on_lake.source == "lake"
        assert on_lake.notices == []
        for filters in (Filters(), Filters(env="toolbox")):
            for report in list_reports():
                want = run_report(on_live, report, filters)
                got = run_report(on_lake, report, filters)
                if filters == Filters():
                    assert want.table.num_rows > 0, report.name
                assert got.types == want.types, report.name
                assert got.table.equals(want.table), report.name
        # The friendly views too, row for row.
        query = "SELECT * FROM event_facts ORDER BY event_pk"
        assert run_sql(on_lake, query).table.equals(run_sql(on_live, query).table)


def test_report_from_detects_the_lake_and_picks_a_store(
    reports_lake: tuple[LakeStore, Path], tmp_path: Path
) -> None:
    store, lake = reports_lake
    with open_live(store.engine, in_this_process=True) as on_live:
        want = run_report(on_live, get_report("returns"), Filters())
    done = CliRunner().invoke(app, ["report", "returns", "--from", str(lake), "-f", "json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["rows"] == output.rows(want.table)
    # Another store exports into the same lake: readers must now say which store.
    other_db = f"sqlite:///{tmp_path / 'other.db'}"
    other = create_engine(other_db)
    migrate.upgrade(other)
    for raw in corpus([])[:3]:
        ingest_bytes(other, raw)
    other.dispose()
    live.export(other_db, lake, Filters(), fmt="delta", incremental=True)
    with pytest.raises(InvalidRequest, match="choose one with --store"):
        open_snapshot(lake)
    done = CliRunner().invoke(
        app, ["report", "returns", "--from", str(lake), "--store", store.store_id(), "-f", "json"]
    )
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["rows"] == output.rows(want.table)


def test_without_the_delta_extension_the_deltalake_package_reads_the_lake(
    reports_lake: tuple[LakeStore, Path], tmp_path: Path
) -> None:
    store, lake = reports_lake
    report = get_report("tools")
    with open_live(store.engine, in_this_process=True) as on_live:
        want = run_report(on_live, report, Filters())
    with open_snapshot(lake, extension_dir=tmp_path) as on_lake:  # no extension file there
        assert any("deltalake package" in n for n in on_lake.notices), on_lake.notices
        assert run_report(on_lake, report, Filters()).table.equals(want.table)


OFFLINE_LAKE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from tracestore.reports import output
    from tracestore.reports.catalog import list_reports
    from tracestore.reports.connection import load_extension, new_connection, open_snapshot
    from tracestore.reports.filters import Filters
    from tracestore.reports.runner import run_report

    con = new_connection()
    load_extension(con, "delta")
    loaded = sorted(
        name for (name,) in con.execute(
            "SELECT extension_name FROM duckdb_extensions() WHERE loaded"
        ).fetchall()
    )
    with open_snapshot(Path(sys.argv[1])) as analytics:
        rows = {r.name: output.rows(run_report(analytics, r, Filters()).table)
                for r in list_reports()}
        print(json.dumps({"loaded": loaded, "notices": analytics.notices, "rows": rows}))
    """
)


def test_the_delta_extension_loads_with_the_network_cut(
    reports_lake: tuple[LakeStore, Path],
) -> None:
    store, lake = reports_lake
    if store.backend != "sqlite":
        pytest.skip("one backend suffices: the lake is the same files")
    done = _offline(
        [sys.executable, "-c", PROVE_OFFLINE + "\n" + OFFLINE_LAKE, str(lake)],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert "delta" in got["loaded"]
    assert got["notices"] == []
    with open_live(store.engine, in_this_process=True) as on_live:
        for report in list_reports():
            want = output.rows(run_report(on_live, report, Filters()).table)
            assert got["rows"][report.name] == want, report.name


def test_importing_the_exporter_loads_no_deltalake() -> None:
    # `import tracestore.reports.export` must not pull deltalake in (the CLI imports it
    # for every verb's help); deltalake loads only when a Delta lake is written or read.
    code = "import sys, tracestore.reports.export; print('deltalake' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"

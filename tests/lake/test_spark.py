"""PySpark in local mode reads the Parquet export (issue 15, item 4) and recomputes two
named reports with the live store's rows.

Spark lives in a venv of its own (scripts/spark-venv: pyspark only, about 450 MB), so
these tests run where TRACESTORE_SPARK_PYTHON names its python: .ci/run's Spark step
builds it and sets TRACESTORE_TEST_REQUIRE_SPARK=1, which turns a missing Spark into a
failure. Elsewhere they are skipped, saying how to run them. Java 17 runs Spark; it
needs no network (local mode, no packages).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text, update

from tests.conftest import Example, _PgDatabases, new_database
from tests.lake.conftest import settled
from tests.reports.conftest import corpus, populate
from tests.reports.conftest import stored_runs as stored_runs  # the fixture, shared
from tests.reports.figures import StoredRun
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.ingest.service import ingest_bytes
from tracestore.models import Run
from tracestore.reports import live, output
from tracestore.reports.catalog import get_report
from tracestore.reports.connection import open_live
from tracestore.reports.filters import Filters
from tracestore.reports.runner import run_report

pytestmark = pytest.mark.spark

SCRIPT = Path(__file__).with_name("spark_reports.py")
PYTHON_ENV = "TRACESTORE_SPARK_PYTHON"
REQUIRE_ENV = "TRACESTORE_TEST_REQUIRE_SPARK"


def _spark_python() -> str:
    python = os.environ.get(PYTHON_ENV)
    if python:
        return python
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"Spark is required ({REQUIRE_ENV}=1) but {PYTHON_ENV} is not set")
    pytest.skip(
        f"no Spark here: set {PYTHON_ENV}=$(scripts/spark-venv) (.ci/run's Spark step does)"
    )


def _set_times(engine: Engine, runs: list[StoredRun]) -> None:
    with engine.begin() as conn:
        for run in runs:
            conn.execute(
                update(Run)
                .where(Run.run_id == run.doc["run_id"])
                .values(received_at=run.received_at)
            )


@pytest.fixture
def exported(
    backend: str,
    tmp_path_factory: pytest.TempPathFactory,
    pg_databases: _PgDatabases | None,
    examples: list[Example],
    stored_runs: list[StoredRun],
) -> Iterator[tuple[Engine, Path]]:
    """The reports corpus in a store, exported to Parquet in two incremental batches."""
    db = new_database(backend, "spark", tmp_path_factory, pg_databases)
    engine = create_engine(db.url)
    migrate.upgrade(engine)
    snap = tmp_path_factory.mktemp("spark") / "snap"
    docs = corpus(examples)
    for raw in docs[: len(docs) // 2]:
        ingest_bytes(engine, raw)
    # Receive times as the reports suite fixes them, set before the runs are exported
    # (a run's day is its partition: the store never changes it afterwards).
    _set_times(engine, stored_runs)
    settled(engine)
    live.export(db.url, snap, Filters(), fmt="parquet", incremental=True)
    populate(engine, examples, stored_runs)
    settled(engine)
    assert live.export(db.url, snap, Filters(), fmt="parquet", incremental=True).runs > 0
    try:
        yield engine, snap
    finally:
        engine.dispose()


def test_spark_reads_the_export_and_recomputes_returns_and_correlation(
    exported: tuple[Engine, Path], tmp_path: Path
) -> None:
    python = _spark_python()
    engine, snap = exported
    out = tmp_path / "spark.json"
    started = time.monotonic()
    done = subprocess.run(
        [python, str(SCRIPT), str(snap), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(out.read_text())
    print(f"Spark read test: {seconds:.1f}s (JVM up in {got['seconds']['start']:.1f}s)")
    with open_live(engine, in_this_process=True) as analytics:
        for name in ("returns", "correlation"):
            want = output.rows(run_report(analytics, get_report(name), Filters()).table)
            assert want, name
            assert got[name] == want, name
    with engine.connect() as conn:
        for table, n in got["tables"].items():
            assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() == n, table
    assert got["types"] == {
        "runs.received_at": "timestamp",
        "runs.day": "date",
        "trace_events.event_time": "timestamp",
    }

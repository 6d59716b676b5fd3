"""Stores for the analytics tests: the examples and hand-built cases, on each database.

Built once per run (reports only read): every created rollout is ingested through the
library call the API uses, its receive time is then set to a fixed value spread over
three days (so results do not depend on when the test runs and both databases hold the
same data), drift checks get a fixed time, and a few legacy_reads rows are added. Each
store is also exported to a Parquet snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from pathlib import Path

import orjson
import pytest
from sqlalchemy import Engine, insert, update

from tests.conftest import Example, _PgDatabases, backends, new_database
from tests.reports.cases import all_cases
from tests.reports.figures import LegacyReadRow, StoredRun, days_from
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.ingest.service import ingest_bytes
from tracestore.models import Run
from tracestore.models.drift import DriftCheck, LegacyRead
from tracestore.reports import live
from tracestore.reports.connection import Analytics, open_live, open_snapshot
from tracestore.reports.filters import Filters

BASE = datetime(2025, 11, 18, 6, 0, tzinfo=UTC)
CHECKED_AT = datetime(2025, 11, 22, tzinfo=UTC)
LEGACY_READS = [
    LegacyReadRow("key:abcd1234", date(2025, 11, 18), "trajectories", 5),
    LegacyReadRow("anonymous", date(2025, 11, 19), "rollout", 2),
    LegacyReadRow("key:ffff0000", date(2025, 11, 19), "trajectories", 1),
    # A day with reads and no runs.
    LegacyReadRow("key:abcd1234", date(2025, 11, 23), "trajectories", 3),
]


@dataclass
class Store:
    """A populated store of one backend, its exported snapshot, and DuckDB over both."""

    backend: str
    url: str
    engine: Engine
    snapshot: Path
    live: Analytics
    frozen: Analytics


def corpus(examples: list[Example]) -> list[bytes]:
    """Every document to ingest, in order: the examples then the hand-built cases."""
    return [ex.raw for ex in examples] + all_cases()


@pytest.fixture(scope="session")
def stored_runs(examples: list[Example]) -> list[StoredRun]:
    """The created runs with their receive times, as the stores hold them."""
    seen: set[str] = set()
    docs = []
    for raw in corpus(examples):
        doc = orjson.loads(raw)
        if doc["run_id"] not in seen:
            seen.add(doc["run_id"])
            docs.append(doc)
    times = days_from(BASE, len(docs))
    return [StoredRun(doc, t) for doc, t in zip(docs, times, strict=True)]


def populate(engine: Engine, examples: list[Example], runs: list[StoredRun]) -> None:
    """Ingest the corpus, then fix receive and check times and add legacy reads."""
    for raw in corpus(examples):
        ingest_bytes(engine, raw)
    with engine.begin() as conn:
        for run in runs:
            conn.execute(
                update(Run)
                .where(Run.run_id == run.doc["run_id"])
                .values(received_at=run.received_at)
            )
        conn.execute(update(DriftCheck).values(checked_at=CHECKED_AT))
        conn.execute(
            insert(LegacyRead),
            [
                {
                    "client": r.client,
                    "day": r.day,
                    "route": r.route,
                    "reads": r.reads,
                    "last_seen": datetime.combine(r.day, time(12), tzinfo=UTC),
                }
                for r in LEGACY_READS
            ],
        )


@pytest.fixture(scope="session")
def stores(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    pg_databases: _PgDatabases | None,
    examples: list[Example],
    stored_runs: list[StoredRun],
) -> Iterator[dict[str, Store]]:
    """Populated stores (and snapshots) of every backend selected and reachable."""
    out: dict[str, Store] = {}
    for backend in backends(request.config):
        if backend == "postgresql" and pg_databases is None:
            continue
        db = new_database(backend, "reports", tmp_path_factory, pg_databases)
        engine = create_engine(db.url)
        migrate.upgrade(engine)
        populate(engine, examples, stored_runs)
        snapshot = tmp_path_factory.mktemp(f"snapshot-{backend}") / "snap"
        live.export(db.url, snapshot, Filters(), schema_revision=migrate.current_revision(engine))
        out[backend] = Store(
            backend,
            db.url,
            engine,
            snapshot,
            open_live(engine, in_this_process=True),
            open_snapshot(snapshot),
        )
    yield out
    for store in out.values():
        store.live.close()
        store.frozen.close()
        store.engine.dispose()


@pytest.fixture
def store(backend: str, stores: dict[str, Store]) -> Store:
    """The populated store of `backend` (skipped when that database is unreachable)."""
    if backend not in stores:
        pytest.skip(f"no {backend} store (unreachable)")
    return stores[backend]

"""QA session 18's drift findings, on SQLite and PostgreSQL: booleans against numbers (#3),
phase 3 without any recorded read (#10) and the migration report's `dual` (#12)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import orjson
from sqlalchemy import Engine, delete, select, text, update
from sqlalchemy.orm import Session

from tests.conftest import Database, Example
from tests.drift.helpers import clean_example, created, ingest_examples
from tests.unit.test_drift_compare import GenStep, obs, set_state, simple_rollout
from tracestore.db.engine import create_engine
from tracestore.db.uow import read_session, write_session
from tracestore.drift.gates import migration_status
from tracestore.drift.queries import run_drift
from tracestore.drift.recompute import recompute
from tracestore.ingest.service import ingest_bytes
from tracestore.models import Run
from tracestore.models.drift import DriftCheck, DriftFinding, LegacyRead
from tracestore.reports import output
from tracestore.reports.catalog import get_report
from tracestore.reports.connection import open_live
from tracestore.reports.filters import Filters
from tracestore.reports.runner import run_report
from tracestore.store.runs import RunFilter


def _booleans_as_numbers(run_id: str) -> dict[str, object]:
    """QA #3's rollout: the trace writes 1 for the trajectory's true in an observation, and
    1 for its true in a tool call's argument."""
    doc = simple_rollout(
        GenStep(obs(0), calls=[("a", {"x": 0})], trace_source="message"),
        GenStep(obs(1), calls=[("a", {"x": 1})], trace_source="message"),
        GenStep(obs(2), calls=[("a", {"x": 2, "confirm": 1})], trace_source="message"),
    )
    steps = doc["trajectories"][0]["steps"]
    steps[1]["obs"] = {"door_open": True, "hp": 1}
    set_state(doc, 1, {"door_open": 1, "hp": True})
    steps[2]["tool_calls"] = [{"tool_name": "a", "arguments": {"x": 2, "confirm": True}}]
    doc["run_id"] = run_id
    return doc


def _stored_kinds(engine: Engine, run_id: str) -> list[tuple[str, int | None]]:
    with read_session(engine) as session:
        body = run_drift(session, run_id).model_dump()
    assert body["stored"] is True
    return [(f["kind"], f["position"]) for f in body["findings"]]


def test_ingest_stores_booleans_against_numbers_as_drift(engine: Engine) -> None:
    result = ingest_bytes(engine, orjson.dumps(_booleans_as_numbers("qa-bool-obs")))
    assert result.status == "created"
    assert _stored_kinds(engine, "qa-bool-obs") == [
        ("obs_mismatch", 1),
        ("tool_calls_mismatch", 2),
    ]
    with read_session(engine) as session:
        check = run_drift(session, "qa-bool-obs").model_dump()
    assert (check["reproduces"], check["reproduce_gap"]) == (False, "obs")


def test_checks_of_the_previous_comparator_are_stale_and_recomputed(engine: Engine) -> None:
    ingest_bytes(engine, orjson.dumps(_booleans_as_numbers("qa-bool-old")))
    with write_session(engine) as session:
        pk = session.scalars(select(Run.id).where(Run.run_id == "qa-bool-old")).one()
        # What comparator 1 (Python's ==, True == 1) stored for this run: no drift.
        session.execute(delete(DriftFinding).where(DriftFinding.run_pk == pk))
        session.execute(
            update(DriftCheck)
            .where(DriftCheck.run_pk == pk)
            .values(comparator_version=1, n_findings=0, reproduces=True, reproduce_gap=None)
        )
    stale = recompute(engine, RunFilter(), stale_only=True)
    assert (stale.selected, stale.recomputed, stale.with_drift) == (1, 1, 1)
    assert _stored_kinds(engine, "qa-bool-old") == [
        ("obs_mismatch", 1),
        ("tool_calls_mismatch", 2),
    ]


def test_recompute_lists_run_ids_not_in_the_store(engine: Engine, examples: list[Example]) -> None:
    ingest_examples(engine, examples)
    known = created(examples)[0].label["run_id"]
    other = created(examples)[1].label["run_id"]
    # A known run the filters leave out is not missing; each unknown one is named once.
    future = datetime.now(UTC) + timedelta(days=1)
    result = recompute(
        engine,
        RunFilter(since=future),
        run_ids=["no-such-run", known, "no-such-run", "also-missing"],
    )
    assert (result.selected, result.missing) == (0, ["no-such-run", "also-missing"])
    named = recompute(engine, RunFilter(), run_ids=[known, "no-such-run", other])
    assert (named.recomputed, named.missing) == (2, ["no-such-run"])


def test_phase_3_has_no_verdict_before_any_read_was_recorded(session: Session) -> None:
    # Live servers of other tests may flush reads at any moment: empty the table inside
    # this test's transaction (rolled back), locked on PostgreSQL so that none lands.
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("LOCK TABLE legacy_reads IN EXCLUSIVE MODE"))
    session.execute(delete(LegacyRead))
    start = datetime(2001, 1, 1, tzinfo=UTC)
    status = migration_status(session, start, start + timedelta(days=7), budget=0.001)
    phase3 = status.phases[2]
    assert phase3.verdict == "insufficient_data"
    assert phase3.reasons[0].startswith("no read of legacy trajectories was ever recorded")
    figures = phase3.figures.model_dump()
    assert (figures["legacy_reads"], figures["tracked_since"]) == (0, None)
    # Recorded reads, none in the window (an anonymous one elsewhere): the evidence exists.
    session.add(
        LegacyRead(
            client="anonymous",
            day=datetime(2000, 6, 1).date(),
            route="rollout",
            reads=1,
            last_seen=datetime(2000, 6, 1, 12, tzinfo=UTC),
        )
    )
    session.flush()
    later = migration_status(session, start, start + timedelta(days=7), budget=0.001)
    assert later.phases[2].verdict == "ready"


def test_migration_report_dual_is_the_reproduce_share_denominator(
    fresh_db: Database, examples: list[Example]
) -> None:
    # A database of its own: DuckDB may attach a live SQLite store only in a process that
    # writes to it through nothing else (tracestore.reports.connection.open_live).
    engine = create_engine(fresh_db.url)
    try:
        _migration_report_case(engine, examples)
    finally:
        engine.dispose()


def _migration_report_case(engine: Engine, examples: list[Example]) -> None:
    ingest_examples(engine, examples)
    # QA #12: one trajectory without a step, and a full trace. It sent both formats, but
    # there is no step to reproduce: it is not dual-serialized.
    doc = copy.deepcopy(clean_example(examples, "crafter", "full"))
    doc["run_id"] = "qa-emptytraj-trace"
    doc["trajectories"] = [dict(doc["trajectories"][0], steps=[], length=0)]
    assert ingest_bytes(engine, orjson.dumps(doc)).status == "created"
    # One day for every run, so the report has one row to set against the status.
    day = datetime(2025, 11, 20, 12, tzinfo=UTC)
    with write_session(engine) as session:
        session.execute(update(Run).values(received_at=day))
    with read_session(engine) as session:
        status = migration_status(session, day, day + timedelta(hours=1), budget=0.001)
    phase1 = status.phases[0].figures.model_dump()
    dual, reproducing = phase1["dual_serialized_runs"], phase1["reproducing_runs"]
    assert 0 < reproducing < dual < status.runs
    # The live store only: an export of a PostgreSQL store holds back runs while any older
    # transaction is open on the server, as other tests' may be (tests/reports checks
    # that snapshots give the same reports).
    analytics = open_live(engine, in_this_process=True)
    try:
        result = run_report(analytics, get_report("migration"), Filters())
    finally:
        analytics.close()
    (row,) = [row for row in output.rows(result.table) if row["runs"]]  # not read-only days
    assert row["runs"] == status.runs
    assert row["dual"] == dual
    assert row["reproduce_share"] == round(reproducing / row["dual"], 6)

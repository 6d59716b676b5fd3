"""Stored drift on SQLite and PostgreSQL: written at ingest, queried, recomputed, reads."""

from __future__ import annotations

import copy
import math
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from sqlalchemy import Engine, delete, select, update

from tests.conftest import Example, row_counts
from tests.drift.helpers import (
    clean_example,
    created,
    ingest_examples,
    label_figures,
    trace_reproduces,
)
from tests.unit.test_drift_compare import build_rollout, gen_rollouts, inject
from tracestore.db.engine import create_engine
from tracestore.db.uow import read_session, write_session
from tracestore.drift import COMPARATOR_VERSION, DRIFT_KINDS
from tracestore.drift.gates import migration_status
from tracestore.drift.queries import DriftFilter, run_drift, summary, window
from tracestore.drift.reads import LegacyReadTracker
from tracestore.drift.recompute import recompute
from tracestore.ingest.service import ingest_bytes
from tracestore.models import Run
from tracestore.models.drift import DriftCheck, DriftFinding, LegacyRead
from tracestore.store.drift import drift_kinds_for, has_drift_clause
from tracestore.store.runs import RunFilter


def _stored_kinds(engine: Engine) -> dict[str, set[str]]:
    with read_session(engine) as session:
        rows = session.execute(
            select(Run.run_id, DriftFinding.kind).join(DriftFinding, DriftFinding.run_pk == Run.id)
        )
        out: dict[str, set[str]] = {}
        for run_id, kind in rows:
            out.setdefault(run_id, set()).add(kind)
        return out


def _findings(engine: Engine) -> list[tuple[Any, ...]]:
    with read_session(engine) as session:
        return sorted(
            session.execute(
                select(
                    Run.run_id,
                    DriftFinding.ordinal,
                    DriftFinding.kind,
                    DriftFinding.trajectory_index,
                    DriftFinding.step_index,
                    DriftFinding.position,
                    DriftFinding.expected,
                    DriftFinding.actual,
                ).join(Run, Run.id == DriftFinding.run_pk)
            )
        )


def test_example_findings_equal_labels(engine: Engine, examples: list[Example]) -> None:
    ingest_examples(engine, examples)
    stored = _stored_kinds(engine)
    for ex in created(examples):
        assert stored.get(ex.label["run_id"], set()) == set(ex.label["drift"]), ex.label
    counts = row_counts(engine)
    # One check per created run, whatever its kind; retries and conflicts add nothing.
    assert counts["drift_checks"] == len(created(examples))
    assert counts["drift_findings"] == sum(len(e.label["drift"]) for e in created(examples))


@pytest.mark.parametrize("kind", DRIFT_KINDS)
def test_injected_kind_is_stored_at_its_step(
    engine: Engine, examples: list[Example], kind: str
) -> None:
    doc = clean_example(examples, "crafter", "full")
    doc["run_id"] = f"injected-{kind}"
    steps = sum(len(t["steps"]) for t in doc["trajectories"])
    trajectory_index, step_index, position = inject(doc, kind, steps // 2)
    assert ingest_bytes(engine, orjson.dumps(doc)).status == "created"
    with read_session(engine) as session:
        body = run_drift(session, doc["run_id"]).model_dump()
    assert body["stored"] is True
    assert body["comparable"] is True
    assert [
        (f["kind"], f["trajectory_index"], f["step_index"], f["position"]) for f in body["findings"]
    ] == [(kind, trajectory_index, step_index, position)]
    finding = body["findings"][0]
    assert finding["expected"] != finding["actual"]
    assert finding["comparator_version"] == body["comparator_version"]


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(gen=gen_rollouts())
def test_generated_clean_rollouts_store_no_findings(engine: Engine, gen: Any) -> None:
    doc = build_rollout(gen).doc
    doc["run_id"] = f"gen-{datetime.now(UTC).timestamp()}-{id(gen)}"
    assert ingest_bytes(engine, orjson.dumps(doc)).status == "created"
    with read_session(engine) as session:
        body = run_drift(session, doc["run_id"]).model_dump()
    assert body["comparable"] is True
    assert body["findings"] == []
    # Observations or tool calls the trace does not hold cannot come back from it.
    assert body["reproduces"] is trace_reproduces(doc)


def test_duplicate_and_conflict_write_no_drift_rows(
    engine: Engine, examples: list[Example]
) -> None:
    ex = next(e for e in created(examples) if e.label["drift"])
    assert ingest_bytes(engine, ex.raw).status == "created"
    before = _data_counts(engine)
    assert ingest_bytes(engine, ex.raw).status == "duplicate"
    other = copy.deepcopy(ex.doc)
    other["aborted"] = not other.get("aborted", False)
    assert ingest_bytes(engine, orjson.dumps(other)).status == "conflict"
    after = _data_counts(engine)
    assert (after["drift_checks"], after["drift_findings"]) == (1, len(ex.label["drift"]))
    assert after == before


def _data_counts(engine: Engine) -> dict[str, int]:
    # legacy_reads is left out: live servers of other tests flush reads into it at any time.
    return {k: v for k, v in row_counts(engine).items() if k != "legacy_reads"}


def test_has_drift_clause_and_drift_kinds_for(engine: Engine, examples: list[Example]) -> None:
    ingest_examples(engine, examples)
    with read_session(engine) as session:
        with_drift = set(session.scalars(select(Run.run_id).where(has_drift_clause(True))))
        without = set(session.scalars(select(Run.run_id).where(has_drift_clause(False))))
        rewards = set(
            session.scalars(select(Run.run_id).where(has_drift_clause(True, "reward_mismatch")))
        )
        pks = dict(session.execute(select(Run.run_id, Run.id)).all())
        kinds = drift_kinds_for(session, list(pks.values()))
    labelled = {e.label["run_id"]: e.label["drift"] for e in created(examples)}
    assert with_drift == {r for r, d in labelled.items() if d}
    assert without == {r for r, d in labelled.items() if not d}
    assert rewards == {r for r, d in labelled.items() if "reward_mismatch" in d}
    assert {r: kinds.get(pks[r], []) for r in labelled} == labelled


def test_status_figures_equal_label_figures(engine: Engine, examples: list[Example]) -> None:
    ingest_examples(engine, examples)
    expected = label_figures(examples)
    with read_session(engine) as session:
        drift = summary(session, DriftFilter()).model_dump()
        status = migration_status(session, *window(None, None), budget=0.001).model_dump()
    for key in ("runs", "comparable_runs", "comparable_runs_with_drift", "runs_with_drift"):
        assert drift[key] == expected[key], key
    assert drift["drift_rate"] == pytest.approx(expected["drift_rate"])
    assert drift["not_comparable"] == expected["not_comparable"]
    assert {k: v["runs"] for k, v in drift["by_kind"].items() if v["runs"]} == expected["kinds"]
    assert drift["unchecked_runs"] == 0
    # Every day and env adds up to the whole.
    assert sum(d["comparable_runs"] for d in drift["by_day"]) == expected["comparable_runs"]
    assert (
        sum(d["runs_with_drift"] for d in drift["by_day"]) == expected["comparable_runs_with_drift"]
    )

    phase1, phase2, phase3 = status["phases"]
    assert [p["phase"] for p in status["phases"]] == [1, 2, 3]
    f1 = phase1["figures"]
    assert f1["runs"] == f1["checked_runs"] == expected["runs"]
    assert f1["usable_trace_runs"] == expected["usable_trace_runs"]
    assert f1["usable_trace_share"] == pytest.approx(
        expected["usable_trace_runs"] / expected["runs"]
    )
    assert f1["dual_serialized_runs"] == expected["dual_serialized_runs"]
    assert f1["reproducing_runs"] == expected["reproducing_runs"]
    assert f1["reproduce_share"] == pytest.approx(
        expected["reproducing_runs"] / expected["dual_serialized_runs"]
    )
    assert sum(f1["not_reproducing"].values()) == (
        expected["dual_serialized_runs"] - expected["reproducing_runs"]
    )
    assert phase1["verdict"] == "not_ready"
    f2 = phase2["figures"]
    assert (f2["comparable_runs"], f2["runs_with_drift"]) == (
        expected["comparable_runs"],
        expected["comparable_runs_with_drift"],
    )
    assert phase2["verdict"] == "not_ready"
    # Phase 3 counts reads, not runs (see the tracker tests); the examples hold none.
    assert set(phase3["figures"]) >= {"legacy_reads", "readers", "tracked_since"}
    assert status["safe_through_phase"] == 0


def test_kind_filter_counts_only_that_kind(engine: Engine, examples: list[Example]) -> None:
    ingest_examples(engine, examples)
    expected = label_figures(examples)
    with read_session(engine) as session:
        drift = summary(session, DriftFilter(kind="reward_mismatch")).model_dump()
    assert drift["comparable_runs"] == expected["comparable_runs"]
    assert drift["comparable_runs_with_drift"] == expected["kinds"]["reward_mismatch"]
    assert list(drift["by_kind"]) == ["reward_mismatch"]


def test_empty_store_gives_no_rates(engine: Engine) -> None:
    # A window of its own: live servers of other tests may flush today's legacy reads.
    start = datetime(2001, 1, 1, tzinfo=UTC)
    with read_session(engine) as session:
        drift = summary(session, DriftFilter()).model_dump()
        status = migration_status(
            session, start, start + timedelta(days=7), budget=0.001
        ).model_dump()
    assert (drift["runs"], drift["drift_rate"], drift["by_day"]) == (0, None, [])
    # Phase 3 reads the whole legacy_reads table, which live servers of other tests may
    # write to: tests/drift/test_qa18.py checks it on a table it holds empty.
    assert [p["verdict"] for p in status["phases"]][:2] == [
        "insufficient_data",
        "insufficient_data",
    ]


def _drop_drift(engine: Engine) -> None:
    with write_session(engine) as session:
        session.execute(delete(DriftFinding))
        session.execute(delete(DriftCheck))


def test_recompute_restores_findings_in_batches(engine: Engine, examples: list[Example]) -> None:
    ingest_examples(engine, examples)
    before = _findings(engine)
    _drop_drift(engine)  # as after upgrading a store that predates drift checks
    with read_session(engine) as session:
        assert summary(session, DriftFilter()).model_dump()["unchecked_runs"] == len(
            created(examples)
        )
        # A run never checked is still answered, computed on the fly and marked so.
        drifted = next(e for e in created(examples) if e.label["drift"])
        body = run_drift(session, drifted.label["run_id"]).model_dump()
    assert body["stored"] is False
    assert {f["kind"] for f in body["findings"]} == set(drifted.label["drift"])

    advanced: list[int] = []
    result = recompute(engine, RunFilter(), stale_only=True, batch_size=7, progress=advanced.append)
    n = len(created(examples))
    assert (result.selected, result.recomputed, result.batches) == (n, n, math.ceil(n / 7))
    assert advanced == [7] * (n // 7) + ([n % 7] if n % 7 else [])
    assert _findings(engine) == before
    # Nothing is stale any more: a resumed run has nothing to do.
    again = recompute(engine, RunFilter(), stale_only=True)
    assert (again.selected, again.recomputed) == (0, 0)


def test_recompute_selects_stale_versions_and_named_runs(
    engine: Engine, examples: list[Example]
) -> None:
    ingest_examples(engine, examples)
    before = _findings(engine)
    some = [e.label["run_id"] for e in created(examples)[:5]]
    with write_session(engine) as session:
        pks = session.scalars(select(Run.id).where(Run.run_id.in_(some))).all()
        # As if an older comparator had checked these runs.
        session.execute(
            update(DriftCheck).where(DriftCheck.run_pk.in_(pks)).values(comparator_version=0)
        )
        session.execute(
            update(DriftFinding).where(DriftFinding.run_pk.in_(pks)).values(comparator_version=0)
        )
    stale = recompute(engine, RunFilter(), stale_only=True)
    assert (stale.selected, stale.recomputed) == (5, 5)
    assert _findings(engine) == before
    named = recompute(engine, RunFilter(), run_ids=some[:2])
    assert named.recomputed == 2
    with read_session(engine) as session:
        versions = set(session.scalars(select(DriftCheck.comparator_version).distinct()))
    assert versions == {COMPARATOR_VERSION}


def test_recompute_respects_time_filter(engine: Engine, examples: list[Example]) -> None:
    ingest_examples(engine, examples)
    future = datetime.now(UTC) + timedelta(days=1)
    result = recompute(engine, RunFilter(since=future))
    assert (result.selected, result.recomputed, result.batches) == (0, 0, 0)


# --- legacy reads -------------------------------------------------------------------------


# Far from today and with labels of their own: live servers of other tests may flush
# their (anonymous, today's) reads into the same database at any moment.
T0 = datetime(2001, 2, 3, 10, 0, tzinfo=UTC)
KEY, OTHER = "key:test0001", "key:test0002"


def _reads(engine: Engine) -> list[tuple[str, str, str, int, datetime]]:
    with read_session(engine) as session:
        return [
            (r.client, r.day.isoformat(), r.route, r.reads, r.last_seen)
            for r in session.scalars(
                select(LegacyRead)
                .where(LegacyRead.client.in_([KEY, OTHER]))
                .order_by(LegacyRead.client, LegacyRead.day)
            )
        ]


def test_tracker_flush_upserts_per_client_day_route(engine: Engine) -> None:
    tracker = LegacyReadTracker()
    tracker.record(KEY, "trajectories", T0)
    tracker.record(KEY, "trajectories", T0 + timedelta(minutes=5))
    tracker.record(OTHER, "rollout", T0)
    assert tracker.pending() == 3
    assert tracker.flush(engine) == 3
    assert tracker.pending() == 0
    # A second flush adds to the same rows; an older read does not move last_seen back.
    tracker.record(KEY, "trajectories", T0 + timedelta(minutes=1))
    tracker.record(KEY, "trajectories", T0 + timedelta(days=1))
    assert tracker.flush(engine) == 2
    assert tracker.flush(engine) == 0
    assert _reads(engine) == [
        (KEY, "2001-02-03", "trajectories", 3, T0 + timedelta(minutes=5)),
        (KEY, "2001-02-04", "trajectories", 1, T0 + timedelta(days=1)),
        (OTHER, "2001-02-03", "rollout", 1, T0),
    ]
    with read_session(engine) as session:
        status = migration_status(
            session, T0 - timedelta(days=1), T0 + timedelta(days=2), budget=0.001
        ).model_dump()
    phase3 = status["phases"][2]
    assert phase3["verdict"] == "not_ready"
    assert phase3["figures"]["legacy_reads"] == 5
    assert phase3["figures"]["clients_reading"] == 2
    readers = {(r["client"], r["route"]): r for r in phase3["figures"]["readers"]}
    key = readers[(KEY, "trajectories")]
    assert (key["reads"], key["last_seen"]) == (4, T0 + timedelta(days=1))
    assert key["days"] == [
        {"day": date(2001, 2, 3), "reads": 3},
        {"day": date(2001, 2, 4), "reads": 1},
    ]
    # A later window without reads: ready, and the clients are still listed as last seen.
    with read_session(engine) as session:
        later = migration_status(
            session, T0 + timedelta(days=10), T0 + timedelta(days=11), budget=0.001
        ).model_dump()
    assert later["phases"][2]["verdict"] == "ready"
    assert {(r["client"], r["reads"]) for r in later["phases"][2]["figures"]["readers"]} >= {
        (KEY, 0),
        (OTHER, 0),
    }


def test_tracker_keeps_counts_when_a_flush_fails(engine: Engine, tmp_path: Path) -> None:
    tracker = LegacyReadTracker()
    tracker.record(KEY, "rollout", T0)
    broken = create_engine(f"sqlite:///{tmp_path / 'no-schema.db'}")  # no legacy_reads table
    with pytest.raises(Exception, match="legacy_reads"):
        tracker.flush(broken)
    broken.dispose()
    assert tracker.pending() == 1
    assert tracker.flush(engine) == 1
    assert _reads(engine) == [(KEY, "2001-02-03", "rollout", 1, T0)]

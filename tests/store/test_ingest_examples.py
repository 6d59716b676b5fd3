"""The examples, ingested in-process: labels, typed projections, and exact read-back.

Each test runs in a transaction rolled back at its end (the `session` fixture).
"""

from __future__ import annotations

import orjson
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tests.conftest import Example, row_counts, store_raw
from tracestore.models import Run, Step, Trace, TraceEvent, TraceMessage, Trajectory
from tracestore.store.runs import get_document


def _ingest_all(session: Session, examples: list[Example]) -> None:
    for ex in examples:
        result = store_raw(session.connection(), ex.raw)
        assert result.status == ex.label["expect_status"], ex.label


def test_labels_hold_and_documents_come_back_equal(
    session: Session, examples: list[Example]
) -> None:
    first: dict[str, Example] = {}
    for ex in examples:
        result = store_raw(session.connection(), ex.raw)
        label = ex.label
        assert result.status == label["expect_status"], label
        if label["expect_status"] == "created":
            first[label["run_id"]] = ex
            assert (
                result.correlation_id,
                result.correlation_source,
                result.trace_kind,
            ) == (label["correlation_id"], label["correlation_source"], label["trace_kind"])
    for run_id, ex in first.items():
        raw = get_document(session, run_id)
        assert raw == ex.raw  # byte for byte, so certainly the same JSON value
        assert orjson.loads(raw) == ex.doc


def test_typed_tables_hold_the_figures(session: Session, examples: list[Example]) -> None:
    _ingest_all(session, examples)
    created = [ex for ex in examples if ex.label["expect_status"] == "created"]
    for ex in created:
        run = session.execute(select(Run).where(Run.run_id == ex.label["run_id"])).scalar_one()
        doc = ex.doc
        assert run.n_trajectories == len(doc["trajectories"])
        steps = [s for t in doc["trajectories"] for s in t["steps"]]
        assert run.n_steps == len(steps)
        stored_rewards = session.scalars(
            select(Step.reward)
            .join(Trajectory, Trajectory.id == Step.trajectory_pk)
            .where(Step.run_pk == run.id)
            .order_by(Trajectory.idx, Step.idx)
        ).all()
        assert stored_rewards == [s.get("reward") for s in steps]
        assert run.mean_return == doc["metrics"]["mean_return"]
        env_events = session.scalar(
            select(func.count())
            .select_from(TraceEvent)
            .join(Trace, Trace.id == TraceEvent.trace_pk)
            .where(
                TraceEvent.run_pk == run.id,
                TraceEvent.event_type == "environment",
                Trace.trajectory_idx.is_(None),
            )
        )
        if ex.label["trace_kind"] in ("full", "wrapped"):
            # Each event once, though the trace lists it twice (SPEC §3).
            session_trace = doc["trace"].get("session_trace", doc["trace"])
            assert run.n_events == len(session_trace["event_history"])
            assert run.n_messages == len(session_trace["markov_blanket_message_history"])
            if not doc["trajectories"]:
                assert env_events == ex.label["n_steps"]
            else:
                assert env_events == len(steps)
        else:
            assert env_events == 0
        if doc["trajectories"]:
            assert run.n_steps == ex.label["n_steps"]


def test_events_keep_typed_columns(session: Session, examples: list[Example]) -> None:
    crafter = next(ex for ex in examples if ex.label["kind"] == "crafter")
    store_raw(session.connection(), crafter.raw)
    trace = crafter.doc["trace"]
    lm = next(e for e in trace["event_history"] if "call_records" in e)
    row = (
        session.execute(
            select(TraceEvent)
            .where(TraceEvent.event_type == "lm_call")
            .order_by(TraceEvent.position)
        )
        .scalars()
        .first()
    )
    assert row is not None
    assert (row.model_name, row.input_tokens, row.output_tokens, row.latency_ms) == (
        lm["model_name"],
        lm["input_tokens"],
        lm["output_tokens"],
        lm["latency_ms"],
    )
    assert row.call_records == lm["call_records"]  # kept whole
    messages = session.scalar(select(func.count()).select_from(TraceMessage))
    assert messages == len(trace["markov_blanket_message_history"])


def test_trace_created_at_is_parsed_from_the_repr_form(
    session: Session, examples: list[Example]
) -> None:
    ex = next(
        e
        for e in examples
        if e.label.get("serialization") == "task_app" and e.label.get("trace_kind") == "full"
    )
    assert ex.doc["trace"]["created_at"].startswith("datetime.datetime(")
    store_raw(session.connection(), ex.raw)
    from tracestore.wire.datetimes import parse_datetime

    created_at = session.scalar(select(Trace.created_at))
    assert created_at == parse_datetime(ex.doc["trace"]["created_at"])


@pytest.mark.parametrize("mutate", ["retry", "conflict"])
def test_idempotency(session: Session, examples: list[Example], mutate: str) -> None:
    ex = next(e for e in examples if e.label["kind"] == "crafter")
    assert store_raw(session.connection(), ex.raw).status == "created"
    before = row_counts(session.connection())
    doc = dict(ex.doc)
    if mutate == "retry":
        # Same JSON value, other spelling (key order, spacing): still a duplicate.
        raw = orjson.dumps(dict(reversed(list(doc.items()))))
        assert store_raw(session.connection(), raw).status == "duplicate"
    else:
        doc["aborted"] = not doc["aborted"]
        doc["metrics"] = dict(doc["metrics"], mean_return=-1.0)
        result = store_raw(session.connection(), orjson.dumps(doc))
        assert result.status == "conflict"
        assert result.error is not None
        assert result.error.details["differing_parts"] == ["metrics", "aborted"]
    assert row_counts(session.connection()) == before  # no write

"""The inspector's read side on both databases: what the run page, search and home show.

- The typed-table reading of a stored part (what keeps a 5,000-step page fast) gives
  exactly the steps the document reading gives: tool calls, observations, transcripts,
  LM calls, rewards, for every example.
- Each drift example's findings are marked on their step and field; every run says where
  each format comes from, with the loss report of a converted one.
- Paging a long run; searching by run id, cid, URL and log line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from tests.conftest import Example
from tests.drift.helpers import PER_STEP_KINDS, created
from tests.web.conftest import (
    LONG_DRIFT_AT,
    LONG_STEPS,
    SHARED_CID_RUN,
    Store,
    extra_rollouts,
)
from tracestore.db.engine import create_engine
from tracestore.errors import InvalidRequest, NotFound
from tracestore.inspect.models import TraceStep
from tracestore.inspect.run import (
    converted_part,
    inspect_run,
    page_of,
    trace_step,
    trajectory_step,
)
from tracestore.inspect.search import resolve, run_links, store_figures
from tracestore.inspect.sides import (
    DocumentTrace,
    DocumentTrajectories,
    TypedTrace,
    TypedTrajectories,
)
from tracestore.models import Run
from tracestore.models.traces import Trace
from tracestore.store.runs import RunFilter, list_runs


@pytest.fixture(scope="module")
def engine(store: Store) -> Iterator[Engine]:
    eng = create_engine(store.db.url)
    yield eng
    eng.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with Session(engine) as s:
        yield s
        s.rollback()


def _comparable(step: TraceStep) -> dict[str, Any]:
    # The trace side as the page shows it; the event itself is shown as stored (typed
    # columns lose only absent-vs-null, which the page does not show).
    data: dict[str, Any] = step.model_dump(mode="json")
    event = data.pop("event")
    data["event_reward"] = event.get("reward")
    return data


def test_typed_reading_equals_the_document_reading(
    session: Session, examples: list[Example]
) -> None:
    checked_trace = checked_steps = 0
    for ex in created(examples):
        run = session.execute(select(Run).where(Run.run_id == ex.label["run_id"])).scalar_one()
        doc = ex.doc
        if run.n_trajectories:
            typed = TypedTrajectories(session, run.id)
            document = DocumentTrajectories(doc["trajectories"])
            assert typed.count() == document.count()
            assert typed.rewards() == document.rewards()
            typed_steps = [trajectory_step(s) for s in typed.window(0, typed.count())]
            document_steps = [trajectory_step(s) for s in document.window(0, document.count())]
            assert [s.model_dump(mode="json") for s in typed_steps] == [
                s.model_dump(mode="json") for s in document_steps
            ], ex.label["run_id"]
            checked_steps += len(typed_steps)
        trace_row = session.execute(
            select(Trace).where(Trace.run_pk == run.id, Trace.trajectory_idx.is_(None))
        ).scalar_one_or_none()
        if ex.label.get("trace_kind") in ("full", "wrapped"):
            assert trace_row is not None
            typed_trace = TypedTrace(session, trace_row.id)
            document_trace = DocumentTrace(doc["trace"])
            n = document_trace.count()
            assert typed_trace.count() == n > 0
            assert typed_trace.rewards() == document_trace.rewards()
            # Whole, and in pages that cut time steps apart: grouping must not depend on
            # which events the page holds.
            for start, stop in [(0, n), (1, min(n, 3)), (n - 1, n)]:
                typed_rows = [_comparable(trace_step(s)) for s in typed_trace.window(start, stop)]
                doc_rows = [_comparable(trace_step(s)) for s in document_trace.window(start, stop)]
                assert typed_rows == doc_rows, (ex.label["run_id"], start, stop)
            checked_trace += 1
    assert checked_trace == 33  # 21 crafter + 8 trace-only + 4 sokoban
    assert checked_steps > 300


# The step field each per-step kind is about (docs/FORMAT.md §6).
FIELDS = {
    "reward_mismatch": "reward",
    "done_mismatch": "done",
    "truncated_mismatch": "truncated",
    "obs_mismatch": "obs",
    "tool_calls_mismatch": "tool_calls",
    "step_count_mismatch": "step",
}


def test_each_finding_is_marked_on_its_step_and_field(
    session: Session, examples: list[Example]
) -> None:
    for ex in created(examples):
        kinds = set(ex.label.get("drift") or [])
        inspected = inspect_run(session, ex.label["run_id"], limit=500)
        assert inspected.drift is not None
        assert inspected.steps is not None
        assert {f.kind for f in inspected.drift.findings} == kinds
        marked = {
            (row.position, f.kind, f.field) for row in inspected.steps.items for f in row.findings
        }
        expected = {
            (f.position, f.kind, FIELDS[f.kind])
            for f in inspected.drift.findings
            if f.kind in PER_STEP_KINDS
        }
        assert marked == expected, ex.label["run_id"]
        assert bool(marked) == bool(kinds & PER_STEP_KINDS)
        for row in inspected.steps.items:
            assert row.fields == sorted({f.field for f in row.findings})
        assert inspected.rewards is not None
        assert inspected.rewards.drift_positions == sorted({p for p, _k, _f in marked})


def test_every_run_says_where_each_format_comes_from(
    session: Session, examples: list[Example]
) -> None:
    expected = {
        "crafter": ("stored", "stored"),
        "sokoban": ("stored", "stored"),
        "trace_only": ("converted", "stored"),
        "legacy_only": ("stored", "converted"),
        "crafter_compact": ("stored", "converted"),
        "math": ("stored", "converted"),
        "banking": ("stored", "converted"),
    }
    for ex in created(examples):
        inspected = inspect_run(session, ex.label["run_id"], panel="parts")
        assert inspected.parts is not None
        assert inspected.steps is None
        sources = {p.part: p for p in inspected.parts}
        want = expected[ex.label["kind"]]
        assert (sources["trajectories"].source, sources["trace"].source) == want
        # What api/held.py charges the budget for, from the run row alone: the part
        # converted, and none for a panel that reads no part.
        run = session.execute(select(Run).where(Run.run_id == ex.label["run_id"])).scalar_one()
        converted = [p.part for p in inspected.parts if p.source == "converted"]
        charged = converted_part(run.trace_kind, run.n_trajectories, "parts")
        assert ([] if charged is None else [charged]) == converted
        assert converted_part(run.trace_kind, run.n_trajectories, "drift") is None
        for part in inspected.parts:
            if part.source == "converted":
                report = part.report
                assert report is not None
                assert report["provenance"]["converter_version"]
                # Trajectories carry everything into the trace they make; a trace's own
                # conversion lists what it has no place for.
                if part.part == "trace":
                    assert report["lossless"] is True, ex.label["run_id"]
            else:
                assert part.report is None


def test_header_says_where_the_cid_came_from(session: Session, examples: list[Example]) -> None:
    for ex in created(examples):
        header = inspect_run(session, ex.label["run_id"], panel="header").header
        assert header is not None
        assert header.correlation_id == ex.label["correlation_id"]
        source = ex.label.get("correlation_source")
        if source is None:
            assert header.correlation is None
            continue
        assert header.correlation is not None
        assert header.correlation.source == source
        if source in ("inference_url", "pipeline_metadata_url"):
            assert header.correlation.url is not None
            assert ex.label["correlation_id"] in header.correlation.url
        assert header.doc_bytes == len(ex.raw)
        assert header.metrics == ex.doc["metrics"]


def test_a_long_run_is_paged(session: Session, store: Store) -> None:
    first = inspect_run(session, store.long_run_id)
    assert first.steps is not None
    assert first.rewards is not None
    assert first.steps.total == LONG_STEPS
    assert [r.position for r in first.steps.items] == list(range(25))
    assert len(first.rewards.trace) == len(first.rewards.trajectory) == LONG_STEPS
    assert first.rewards.drift_positions == [LONG_DRIFT_AT]
    at = inspect_run(session, store.long_run_id, step=LONG_DRIFT_AT, limit=40)
    assert at.steps is not None
    assert at.steps.offset == page_of(LONG_DRIFT_AT, 40) == 1080
    row = next(r for r in at.steps.items if r.position == LONG_DRIFT_AT)
    assert [(f.kind, f.field) for f in row.findings] == [("reward_mismatch", "reward")]
    assert row.trajectory is not None
    assert row.trace is not None
    assert row.trajectory.reward != row.trace.reward
    assert row.trace.lm_calls
    assert row.trace.lm_calls[0].model == "Qwen/Qwen3-4B"
    assert row.trace.messages[0].role == "user"
    last = inspect_run(session, store.long_run_id, offset=LONG_STEPS - 5, panel="steps")
    assert last.steps is not None
    assert len(last.steps.items) == 5


def test_bad_requests(session: Session, store: Store) -> None:
    with pytest.raises(NotFound):
        inspect_run(session, "no-such-run")
    for kwargs in ({"limit": 0}, {"limit": 501}, {"offset": -1}, {"panel": "nope"}):
        with pytest.raises(InvalidRequest):
            inspect_run(session, store.long_run_id, **kwargs)


def test_search_finds_runs_by_id_cid_url_and_log_line(
    session: Session, examples: list[Example], store: Store
) -> None:
    labels = {e.label["run_id"]: e.label for e in created(examples)}
    malformed = next(e for e in created(examples) if e.label.get("url_style") == "malformed")
    url = malformed.doc["trajectories"][0]["inference_url"]
    assert "/v1/chat/completions" in url.split("?", 1)[1]  # the id is followed by a path
    cases = {
        malformed.label["run_id"]: ("run", malformed.label["run_id"]),
        malformed.label["correlation_id"]: ("run", malformed.label["run_id"]),
        url: ("run", malformed.label["run_id"]),
        f'INFO POST "{url}" 200 OK latency=0.9s': ("run", malformed.label["run_id"]),
        # What synth-ai's extractor logs for that URL: the id with the path.
        malformed.label["correlation_id"] + "/v1/chat/completions": (
            "run",
            malformed.label["run_id"],
        ),
        store.shared_cid: ("correlation", None),
        "https://host/v1/chat/completions?model=x": ("none", None),
        "trace_does_not_exist": ("none", None),
        "   ": ("none", None),
    }
    for query, (kind, run_id) in cases.items():
        found = resolve(session, query)
        assert (found.kind, found.run_id) == (kind, run_id), query
    shared = resolve(session, store.shared_cid)
    assert {r["run_id"] for r in shared.runs} == {SHARED_CID_RUN, "run-1001-00003-626fda73"}
    assert labels  # every created example resolves by its own id
    for run_id in labels:
        assert resolve(session, run_id).run_id == run_id


def test_home_figures_and_run_links(session: Session, examples: list[Example]) -> None:
    figures = store_figures(session)
    made = created(examples)
    assert figures.runs == len(made) + 2
    # The long run drifts too (one reward at LONG_DRIFT_AT).
    assert figures.runs_with_drift == sum(bool(e.label["drift"]) for e in made) + 1
    assert figures.trace_only_runs == sum(e.label["kind"] == "trace_only" for e in made)
    extra, _long, _cid = extra_rollouts(examples)
    assert figures.doc_bytes == sum(len(e.raw) for e in made) + sum(map(len, extra))
    runs, _ = list_runs(session, RunFilter(has_drift=True), limit=100)
    listed = run_links(session, runs)
    with_steps = [r for r in listed if r.first_finding_position is not None]
    assert {r.run_id for r in with_steps} >= {
        e.label["run_id"] for e in made if set(e.label["drift"]) & PER_STEP_KINDS
    }

"""The migration gates (docs/FORMAT.md §7): each phase's figures and verdict, and the report.

Phase 1: traces usable, and traces that alone reproduce the trajectories; phase 2: the
drift rate against the budget; phase 3: which clients still read legacy trajectories.
Functions take a `Session` and never commit.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tracestore.drift.compare import COMPARATOR_VERSION
from tracestore.drift.models import (
    DriftReport,
    DriftSummary,
    MigrationStatus,
    Phase,
    Phase1Figures,
    Phase2Figures,
    Phase3Figures,
    ReadDay,
    Reader,
    Verdict,
    Window,
)
from tracestore.drift.queries import DriftFilter, one_if, rate, summary, window, worst_runs
from tracestore.drift.reads import UNATTRIBUTED
from tracestore.models import Run
from tracestore.models.drift import DriftCheck, LegacyRead
from tracestore.store.drift import as_date
from tracestore.store.runs import RunFilter
from tracestore.store.runs import filtered as filtered_runs

# Phase 1 gate: share of recent runs whose trace is usable (full or wrapped, with events).
DEFAULT_MIN_TRACE_SHARE = 0.99
PHASE_NAMES = {
    1: "training reads traces, falling back to trajectories",
    2: "trajectories become optional",
    3: "trajectories and their classes are removed",
}


def _phase(
    number: int,
    verdict: Verdict,
    reasons: list[str],
    figures: Phase1Figures | Phase2Figures | Phase3Figures,
) -> Phase:
    return Phase(
        phase=number, name=PHASE_NAMES[number], verdict=verdict, reasons=reasons, figures=figures
    )


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2%}"


def _phase1(session: Session, scope: DriftFilter, min_trace_share: float, budget: float) -> Phase:
    row = session.execute(
        filtered_runs(
            select(
                func.count(Run.id).label("runs"),
                func.count(DriftCheck.run_pk).label("checked"),
                func.sum(one_if(DriftCheck.usable_trace)).label("usable"),
                func.sum(one_if(DriftCheck.dual_serialized)).label("dual"),
                func.sum(one_if(DriftCheck.reproduces)).label("reproducing"),
            ).outerjoin(DriftCheck, DriftCheck.run_pk == Run.id),
            scope.runs,
        )
    ).one()
    gaps = dict(
        session.execute(
            filtered_runs(
                select(DriftCheck.reproduce_gap, func.count())
                .join(Run, Run.id == DriftCheck.run_pk)
                .where(DriftCheck.dual_serialized, ~DriftCheck.reproduces)
                .group_by(DriftCheck.reproduce_gap),
                scope.runs,
            )
        ).all()
    )
    checked, usable = int(row.checked), int(row.usable or 0)
    dual, reproducing = int(row.dual or 0), int(row.reproducing or 0)
    usable_share, reproduce_share = rate(usable, checked), rate(reproducing, dual)
    min_reproduce = 1 - budget
    figures = Phase1Figures(
        runs=row.runs,
        checked_runs=checked,
        usable_trace_runs=usable,
        usable_trace_share=usable_share,
        dual_serialized_runs=dual,
        reproducing_runs=reproducing,
        reproduce_share=reproduce_share,
        not_reproducing={str(g): n for g, n in sorted(gaps.items(), key=lambda x: str(x[0]))},
        min_usable_trace_share=min_trace_share,
        min_reproduce_share=min_reproduce,
    )
    reasons = [
        f"{_percent(usable_share)} of {checked} checked runs have a usable trace "
        f"(gate {_percent(min_trace_share)})",
        f"{_percent(reproduce_share)} of {dual} dual-serialized runs are reproduced by their "
        f"trace alone (gate {_percent(min_reproduce)})",
    ]
    if usable_share is None or reproduce_share is None:
        verdict: Verdict = "insufficient_data"
    elif usable_share >= min_trace_share and reproduce_share >= min_reproduce:
        verdict = "ready"
    else:
        verdict = "not_ready"
    return _phase(1, verdict, reasons, figures)


def _phase2(drift: DriftSummary, budget: float) -> Phase:
    drift_rate = drift.drift_rate
    figures = Phase2Figures(
        comparable_runs=drift.comparable_runs,
        runs_with_drift=drift.comparable_runs_with_drift,
        drift_rate=drift_rate,
        budget=budget,
        by_kind={k: v.runs for k, v in drift.by_kind.items()},
    )
    reasons = [
        f"drift rate {_percent(drift_rate)} over {drift.comparable_runs} comparable runs "
        f"(budget {_percent(budget)})"
    ]
    verdict: Verdict = (
        "insufficient_data"
        if drift_rate is None
        else "ready"
        if drift_rate <= budget
        else "not_ready"
    )
    return _phase(2, verdict, reasons, figures)


def legacy_readers(session: Session, start: datetime, end: datetime) -> list[Reader]:
    """Per (client, route): reads in the window, per day, and when last seen (ever)."""
    readers: dict[tuple[str, str], Reader] = {}
    for client, route, last_seen in session.execute(
        select(LegacyRead.client, LegacyRead.route, func.max(LegacyRead.last_seen)).group_by(
            LegacyRead.client, LegacyRead.route
        )
    ):
        readers[(client, route)] = Reader(
            client=client,
            route=route,
            reads=0,
            # max() over the column loses the type on SQLite: read it back as UTC.
            last_seen=_utc(last_seen),
            days=[],
            # A client is a key's name or a self-given label; `anonymous` is a person looking
            # at a run (a browser, curl without a label), which must not hold the migration.
            counted=client != UNATTRIBUTED,
        )
    for r in session.scalars(
        select(LegacyRead)
        .where(LegacyRead.day >= start.date(), LegacyRead.day <= end.date())
        .order_by(LegacyRead.day)
    ):
        entry = readers[(r.client, r.route)]
        entry.reads += r.reads
        entry.days.append(ReadDay(day=r.day, reads=r.reads))
    return sorted(readers.values(), key=lambda e: (-e.reads, e.client, e.route))


def _utc(value: object) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _phase3(session: Session, start: datetime, end: datetime) -> Phase:
    readers = legacy_readers(session, start, end)
    counted = [r for r in readers if r.counted]
    reads = sum(r.reads for r in counted)
    unattributed = sum(r.reads for r in readers if not r.counted)
    active = [r for r in counted if r.reads]
    tracked = session.execute(select(func.min(LegacyRead.day))).scalar()
    figures = Phase3Figures(
        legacy_reads=reads,
        clients_reading=len({r.client for r in active}),
        unattributed_reads=unattributed,
        tracked_since=as_date(tracked) if tracked is not None else None,
        readers=readers,
    )
    if active:
        who = ", ".join(f"{r.client} ({r.route}: {r.reads})" for r in active[:5])
        reasons = [f"{reads} legacy reads in the window by {who}"]
        verdict: Verdict = "not_ready"
    elif tracked is None:
        # Not one read recorded, ever: "none in the window" is then no evidence that nobody
        # reads legacy trajectories (nothing was attributed yet), so no verdict, as phases 1
        # and 2 give none without data.
        reasons = [
            "no read of legacy trajectories was ever recorded: no data on who still reads them"
        ]
        verdict = "insufficient_data"
    else:
        reasons = ["no client read legacy trajectories in the window"]
        verdict = "ready"
    if unattributed:
        reasons.append(
            f"{unattributed} reads by callers without an API key or X-Tracestore-Client "
            "label (a person looking at a run) are listed but not counted"
        )
    return _phase(3, verdict, reasons, figures)


def migration_status(
    session: Session,
    start: datetime,
    end: datetime,
    *,
    budget: float,
    min_trace_share: float = DEFAULT_MIN_TRACE_SHARE,
    drift: DriftSummary | None = None,
) -> MigrationStatus:
    """Each phase of the migration with its gate figures and verdict, over runs in the window."""
    scope = DriftFilter(RunFilter(since=start, until=end))
    drift = drift if drift is not None else summary(session, scope)
    phases = [
        _phase1(session, scope, min_trace_share, budget),
        _phase2(drift, budget),
        _phase3(session, start, end),
    ]
    safe = 0
    for phase in phases:
        if phase.verdict != "ready":
            break
        safe = phase.phase
    notes = []
    if drift.unchecked_runs:
        notes.append(
            f"{drift.unchecked_runs} runs in the window have no drift check: "
            "run 'tracestore drift --recompute --stale'"
        )
    return MigrationStatus(
        window=Window(since=start, until=end),
        runs=drift.runs,
        unchecked_runs=drift.unchecked_runs,
        safe_through_phase=safe,
        phases=phases,
        notes=notes,
    )


def report_data(
    session: Session,
    f: DriftFilter,
    *,
    budget: float,
    min_trace_share: float = DEFAULT_MIN_TRACE_SHARE,
) -> DriftReport:
    """Everything the drift report shows: summary, worst runs, migration status."""
    runs = f.runs
    if runs.since is None or runs.until is None:
        start, end = window(runs.since, runs.until)
        f = replace(f, runs=replace(runs, since=start, until=end))
    drift = summary(session, f)
    unfiltered = not any(
        v is not None for k, v in f.as_dict().items() if k not in ("since", "until")
    )
    assert f.runs.since is not None
    assert f.runs.until is not None
    return DriftReport(
        generated_at=datetime.now(UTC),
        comparator_version=COMPARATOR_VERSION,
        summary=drift,
        worst_runs=worst_runs(session, f),
        # The status is about the whole store in the window: reuse the summary when it is.
        status=migration_status(
            session,
            f.runs.since,
            f.runs.until,
            budget=budget,
            min_trace_share=min_trace_share,
            drift=drift if unfiltered else None,
        ),
    )

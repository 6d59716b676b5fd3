"""Drift service: per-run findings, summaries, migration status (SPEC §7), recompute, reads.

Store functions here take a `Session` and never commit, except `recompute` and
`LegacyReadTracker.flush`, which own their transactions (one per batch, one per flush).
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal

import orjson
from sqlalchemy import Engine, Select, and_, bindparam, case, func, or_, select
from sqlalchemy.orm import Session

from tracestore.convert import CONVERTER_VERSION
from tracestore.db.uow import read_session, write_session
from tracestore.drift.compare import COMPARATOR_VERSION
from tracestore.drift.rows import drift_rows
from tracestore.errors import InvalidRequest, NotFound
from tracestore.models import Run, RunDocument, Trajectory
from tracestore.models.drift import DriftCheck, DriftFinding, LegacyRead
from tracestore.store.documents import decompress_document
from tracestore.store.drift import (
    DriftRows,
    ReadCount,
    as_date,
    has_drift_clause,
    replace_drift,
    upsert_legacy_reads,
    utc_day,
)
from tracestore.store.runs import KEY_LIMIT, MAX_LIMIT, RunFilter
from tracestore.store.runs import filtered as filtered_runs  # the list's filters, reused
from tracestore.vocabulary import DRIFT_KINDS

log = logging.getLogger("tracestore.drift")

DEFAULT_WINDOW_DAYS = 30
# Phase 1 gate: share of recent runs whose trace is usable (full or wrapped, with events).
DEFAULT_MIN_TRACE_SHARE = 0.99
WORST_RUNS = 10
FINDINGS_PER_WORST_RUN = 5
LEGACY_ROUTES = {
    "/v1/rollouts/{run_id}/trajectories": "trajectories",
    "/v1/rollouts/{run_id}": "rollout",
}
# Reads by this name are a person's look (or a caller that says nothing of itself): listed
# in phase 3, never counted against its gate (tracestore/api/clients.py).
UNATTRIBUTED = "anonymous"
_N_TRAJECTORIES = select(Run.n_trajectories).where(Run.run_id == bindparam("run_id"))
Verdict = Literal["ready", "not_ready", "insufficient_data"]
PHASE_NAMES = {
    1: "training reads traces, falling back to trajectories",
    2: "trajectories become optional",
    3: "trajectories and their classes are removed",
}


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


@dataclass(frozen=True, slots=True)
class DriftFilter:
    """The runs a summary covers (the run list's filters) and the finding kind it counts."""

    runs: RunFilter = field(default_factory=RunFilter)
    kind: str | None = None

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in DRIFT_KINDS:
            raise InvalidRequest(
                f"unknown drift kind {self.kind!r}; kinds: {', '.join(DRIFT_KINDS)}",
                kind=self.kind,
            )

    def as_dict(self) -> dict[str, Any]:
        """The filters that are set, for echoing in responses."""
        out = {k: getattr(self.runs, k) for k in self.runs.__dataclass_fields__}
        out["kind"] = self.kind
        return {k: v for k, v in out.items() if v is not None}


def window(
    since: datetime | None, until: datetime | None, days: int = DEFAULT_WINDOW_DAYS
) -> tuple[datetime, datetime]:
    """The time window of a status or report: `since`..`until`, by default the last `days`."""
    end = until or datetime.now(UTC)
    try:
        start = since or end - timedelta(days=days)
    except OverflowError:  # `days` before an `until` near the calendar's start
        start = datetime.min.replace(tzinfo=UTC)
    if start >= end:
        raise InvalidRequest("since must be before until", since=start, until=end)
    return start, end


def _one_if(condition: Any) -> Any:
    """1 where `condition` holds, else 0 (for SUM): portable across both databases."""
    return case((condition, 1), else_=0)


# --- one run ------------------------------------------------------------------------------


FINDING_FIELDS = (
    "kind",
    "trajectory_index",
    "step_index",
    "position",
    "expected",
    "actual",
    "message",
    "comparator_version",
)
CHECK_FIELDS = (
    "comparator_version",
    "comparable",
    "reason",
    "trajectory_steps",
    "environment_events",
    "usable_trace",
    "dual_serialized",
    "reproduces",
    "reproduce_gap",
    "reproduce_detail",
    "converter_version",
)


def _pick(obj: object, names: Sequence[str]) -> dict[str, Any]:
    # Stored rows are ORM objects; rows computed on the fly are dicts with the same names.
    if isinstance(obj, dict):
        return {name: obj[name] for name in names}
    return {name: getattr(obj, name) for name in names}


def run_drift(session: Session, run_id: str) -> dict[str, Any]:
    """A run's stored drift check and findings; computed on the fly when never checked."""
    run = session.execute(select(Run.id).where(Run.run_id == run_id)).first()
    if run is None:
        raise NotFound(f"no rollout with run_id {run_id!r}", run_id=run_id)
    check = session.get(DriftCheck, run.id)
    if check is None:
        # Stored before drift checks existed: answer from the document, say it is not stored.
        doc_row = session.execute(
            select(RunDocument.body, RunDocument.encoding).where(RunDocument.run_pk == run.id)
        ).one()
        rows = drift_rows(orjson.loads(decompress_document(doc_row.body, doc_row.encoding)))
        return {
            "run_id": run_id,
            "stored": False,
            "checked_at": None,
            **_pick(rows.check, CHECK_FIELDS),
            "findings": [_pick(f, FINDING_FIELDS) for f in rows.findings],
        }
    findings = session.scalars(
        select(DriftFinding).where(DriftFinding.run_pk == run.id).order_by(DriftFinding.ordinal)
    )
    return {
        "run_id": run_id,
        "stored": True,
        "checked_at": check.checked_at,
        **_pick(check, CHECK_FIELDS),
        "findings": [_pick(f, FINDING_FIELDS) for f in findings],
    }


# --- summaries ----------------------------------------------------------------------------


def _scoped(query: Select[*tuple[Any, ...]], f: DriftFilter) -> Select[*tuple[Any, ...]]:
    return filtered_runs(query, f.runs)


def summary(session: Session, f: DriftFilter) -> dict[str, Any]:
    """Comparable runs, runs with drift, rate, and counts by kind, reason, env and day."""
    dialect = session.get_bind().dialect.name
    drifted = has_drift_clause(True, f.kind)
    totals = session.execute(
        _scoped(
            select(
                func.count(Run.id).label("runs"),
                func.count(DriftCheck.run_pk).label("checked"),
                func.sum(_one_if(DriftCheck.comparable)).label("comparable"),
                func.sum(_one_if(and_(DriftCheck.comparable, drifted))).label("comparable_drift"),
                func.sum(_one_if(drifted)).label("drift"),
            ).outerjoin(DriftCheck, DriftCheck.run_pk == Run.id),
            f,
        )
    ).one()
    comparable = int(totals.comparable or 0)
    comparable_drift = int(totals.comparable_drift or 0)

    reasons = dict(
        session.execute(
            _scoped(
                select(DriftCheck.reason, func.count())
                .join(Run, Run.id == DriftCheck.run_pk)
                .where(~DriftCheck.comparable)
                .group_by(DriftCheck.reason),
                f,
            )
        ).all()
    )

    kind_query = (
        select(DriftFinding.kind, func.count(func.distinct(DriftFinding.run_pk)), func.count())
        .join(Run, Run.id == DriftFinding.run_pk)
        .group_by(DriftFinding.kind)
    )
    if f.kind is not None:
        kind_query = kind_query.where(DriftFinding.kind == f.kind)
    counted = {k: (runs, n) for k, runs, n in session.execute(_scoped(kind_query, f))}
    kinds = [f.kind] if f.kind is not None else list(DRIFT_KINDS)
    by_kind = {
        k: {"runs": counted.get(k, (0, 0))[0], "findings": counted.get(k, (0, 0))[1]} for k in kinds
    }

    drift_pk = case((drifted, Run.id))
    by_env = [
        _rated({"env_id": env}, n, d)
        for env, n, d in session.execute(
            _scoped(
                select(
                    Trajectory.env_id,
                    func.count(func.distinct(Run.id)),
                    func.count(func.distinct(drift_pk)),
                )
                .join(DriftCheck, DriftCheck.run_pk == Run.id)
                .join(Trajectory, Trajectory.run_pk == Run.id)
                .where(DriftCheck.comparable)
                .group_by(Trajectory.env_id)
                .order_by(Trajectory.env_id),
                f,
            )
        )
    ]
    day = utc_day(Run.received_at, dialect)
    by_day = [
        _rated({"day": as_date(d).isoformat()}, n, int(drift or 0))
        for d, n, drift in session.execute(
            _scoped(
                select(day, func.count(), func.sum(_one_if(drifted)))
                .join(DriftCheck, DriftCheck.run_pk == Run.id)
                .where(DriftCheck.comparable)
                .group_by(day)
                .order_by(day),
                f,
            )
        )
    ]
    return {
        "filters": f.as_dict(),
        "runs": totals.runs,
        "checked_runs": totals.checked,
        "unchecked_runs": totals.runs - totals.checked,
        "comparable_runs": comparable,
        "runs_with_drift": int(totals.drift or 0),
        "comparable_runs_with_drift": comparable_drift,
        "drift_rate": _rate(comparable_drift, comparable),
        "not_comparable": {str(r): n for r, n in sorted(reasons.items(), key=lambda x: str(x[0]))},
        "by_kind": by_kind,
        "by_env": by_env,
        "by_day": by_day,
    }


def _rated(key: dict[str, Any], comparable: int, drift: int) -> dict[str, Any]:
    return {
        **key,
        "comparable_runs": comparable,
        "runs_with_drift": drift,
        "drift_rate": _rate(drift, comparable),
    }


def _encode_cursor(run_pk: int, ordinal: int) -> str:
    data = orjson.dumps({"v": 1, "run": run_pk, "ord": ordinal})
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[int, int]:
    try:
        data = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        run_pk, ordinal = data["run"], data["ord"]
        if data.get("v") != 1 or not all(
            type(x) is int and 0 <= x < KEY_LIMIT for x in (run_pk, ordinal)
        ):
            raise ValueError
        return run_pk, ordinal
    except (ValueError, KeyError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise InvalidRequest("cursor is not one this service issued", cursor=cursor) from None


def findings_page(
    session: Session, f: DriftFilter, limit: int = 100, cursor: str | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """Findings of the filtered runs, newest run first, keyset-paged: (items, next_cursor)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {MAX_LIMIT}", limit=limit)
    query = _scoped(
        select(DriftFinding, Run.run_id, Run.received_at).join(Run, Run.id == DriftFinding.run_pk),
        f,
    )
    if f.kind is not None:
        query = query.where(DriftFinding.kind == f.kind)
    if cursor is not None:
        run_pk, ordinal = _decode_cursor(cursor)
        query = query.where(
            or_(
                DriftFinding.run_pk < run_pk,
                and_(DriftFinding.run_pk == run_pk, DriftFinding.ordinal > ordinal),
            )
        )
    rows = list(
        session.execute(
            query.order_by(DriftFinding.run_pk.desc(), DriftFinding.ordinal).limit(limit + 1)
        )
    )
    more = len(rows) > limit
    rows = rows[:limit]
    items = [
        {"run_id": r.run_id, "received_at": r.received_at, **_pick(r.DriftFinding, FINDING_FIELDS)}
        for r in rows
    ]
    last = rows[-1].DriftFinding if rows else None
    return items, (_encode_cursor(last.run_pk, last.ordinal) if more and last else None)


def worst_runs(session: Session, f: DriftFilter, limit: int = WORST_RUNS) -> list[dict[str, Any]]:
    """The runs with the most findings (of `f.kind`), each with its first findings."""
    count = func.count(DriftFinding.id)
    query = _scoped(
        select(Run.id, Run.run_id, Run.received_at, count.label("n"))
        .join(DriftFinding, DriftFinding.run_pk == Run.id)
        .group_by(Run.id, Run.run_id, Run.received_at)
        .order_by(count.desc(), Run.id.desc())
        .limit(limit),
        f,
    )
    if f.kind is not None:
        query = query.where(DriftFinding.kind == f.kind)
    runs = list(session.execute(query))
    if not runs:
        return []
    pks = [r.id for r in runs]
    envs: dict[int, list[str]] = {}
    for run_pk, env in session.execute(
        select(Trajectory.run_pk, Trajectory.env_id)
        .where(Trajectory.run_pk.in_(pks))
        .order_by(Trajectory.run_pk, Trajectory.idx)
    ):
        if env is not None and env not in envs.setdefault(run_pk, []):
            envs[run_pk].append(env)
    findings: dict[int, list[dict[str, Any]]] = {}
    finding_query = select(DriftFinding).where(DriftFinding.run_pk.in_(pks))
    if f.kind is not None:
        finding_query = finding_query.where(DriftFinding.kind == f.kind)
    for finding in session.scalars(
        finding_query.order_by(DriftFinding.run_pk, DriftFinding.ordinal)
    ):
        listed = findings.setdefault(finding.run_pk, [])
        if len(listed) < FINDINGS_PER_WORST_RUN:
            listed.append(_pick(finding, FINDING_FIELDS))
    return [
        {
            "run_id": r.run_id,
            "received_at": r.received_at,
            "env_ids": envs.get(r.id, []),
            "n_findings": r.n,
            "findings": findings.get(r.id, []),
        }
        for r in runs
    ]


# --- migration status (SPEC §7) -----------------------------------------------------------


def _phase(
    number: int, verdict: Verdict, reasons: list[str], figures: dict[str, Any]
) -> dict[str, Any]:
    return {
        "phase": number,
        "name": PHASE_NAMES[number],
        "verdict": verdict,
        "reasons": reasons,
        "figures": figures,
    }


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2%}"


def _phase1(session: Session, scope: DriftFilter, min_trace_share: float, budget: float) -> Any:
    row = session.execute(
        _scoped(
            select(
                func.count(Run.id).label("runs"),
                func.count(DriftCheck.run_pk).label("checked"),
                func.sum(_one_if(DriftCheck.usable_trace)).label("usable"),
                func.sum(_one_if(DriftCheck.dual_serialized)).label("dual"),
                func.sum(_one_if(DriftCheck.reproduces)).label("reproducing"),
            ).outerjoin(DriftCheck, DriftCheck.run_pk == Run.id),
            scope,
        )
    ).one()
    gaps = dict(
        session.execute(
            _scoped(
                select(DriftCheck.reproduce_gap, func.count())
                .join(Run, Run.id == DriftCheck.run_pk)
                .where(DriftCheck.dual_serialized, ~DriftCheck.reproduces)
                .group_by(DriftCheck.reproduce_gap),
                scope,
            )
        ).all()
    )
    checked, usable = int(row.checked), int(row.usable or 0)
    dual, reproducing = int(row.dual or 0), int(row.reproducing or 0)
    usable_share, reproduce_share = _rate(usable, checked), _rate(reproducing, dual)
    min_reproduce = 1 - budget
    figures = {
        "runs": row.runs,
        "checked_runs": checked,
        "usable_trace_runs": usable,
        "usable_trace_share": usable_share,
        "dual_serialized_runs": dual,
        "reproducing_runs": reproducing,
        "reproduce_share": reproduce_share,
        "not_reproducing": {str(g): n for g, n in sorted(gaps.items(), key=lambda x: str(x[0]))},
        "min_usable_trace_share": min_trace_share,
        "min_reproduce_share": min_reproduce,
    }
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


def _phase2(drift: dict[str, Any], budget: float) -> dict[str, Any]:
    rate = drift["drift_rate"]
    figures = {
        "comparable_runs": drift["comparable_runs"],
        "runs_with_drift": drift["comparable_runs_with_drift"],
        "drift_rate": rate,
        "budget": budget,
        "by_kind": {k: v["runs"] for k, v in drift["by_kind"].items()},
    }
    reasons = [
        f"drift rate {_percent(rate)} over {drift['comparable_runs']} comparable runs "
        f"(budget {_percent(budget)})"
    ]
    verdict: Verdict = (
        "insufficient_data" if rate is None else "ready" if rate <= budget else "not_ready"
    )
    return _phase(2, verdict, reasons, figures)


def legacy_readers(session: Session, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """Per (client, route): reads in the window, per day, and when last seen (ever)."""
    readers: dict[tuple[str, str], dict[str, Any]] = {}
    for client, route, last_seen in session.execute(
        select(LegacyRead.client, LegacyRead.route, func.max(LegacyRead.last_seen)).group_by(
            LegacyRead.client, LegacyRead.route
        )
    ):
        readers[(client, route)] = {
            "client": client,
            "route": route,
            "reads": 0,
            # max() over the column loses the type on SQLite: read it back as UTC.
            "last_seen": _utc(last_seen),
            "days": [],
        }
    for r in session.scalars(
        select(LegacyRead)
        .where(LegacyRead.day >= start.date(), LegacyRead.day <= end.date())
        .order_by(LegacyRead.day)
    ):
        entry = readers[(r.client, r.route)]
        entry["reads"] += r.reads
        entry["days"].append({"day": r.day.isoformat(), "reads": r.reads})
    return sorted(readers.values(), key=lambda e: (-e["reads"], e["client"], e["route"]))


def _utc(value: object) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _phase3(session: Session, start: datetime, end: datetime) -> dict[str, Any]:
    readers = legacy_readers(session, start, end)
    for r in readers:
        # A client is a key's name or a self-given label; `anonymous` is a person looking
        # at a run (a browser, curl without a label), which must not hold the migration.
        r["counted"] = r["client"] != UNATTRIBUTED
    counted = [r for r in readers if r["counted"]]
    reads = sum(r["reads"] for r in counted)
    unattributed = sum(r["reads"] for r in readers if not r["counted"])
    active = [r for r in counted if r["reads"]]
    tracked = session.execute(select(func.min(LegacyRead.day))).scalar()
    figures = {
        "legacy_reads": reads,
        "clients_reading": len({r["client"] for r in active}),
        "unattributed_reads": unattributed,
        "tracked_since": as_date(tracked).isoformat() if tracked is not None else None,
        "readers": readers,
    }
    if active:
        who = ", ".join(f"{r['client']} ({r['route']}: {r['reads']})" for r in active[:5])
        reasons = [f"{reads} legacy reads in the window by {who}"]
        verdict: Verdict = "not_ready"
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
    drift: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Each phase of SPEC §7 with its gate figures and verdict, over runs in the window."""
    scope = DriftFilter(RunFilter(since=start, until=end))
    drift = drift if drift is not None else summary(session, scope)
    phases = [
        _phase1(session, scope, min_trace_share, budget),
        _phase2(drift, budget),
        _phase3(session, start, end),
    ]
    safe = 0
    for phase in phases:
        if phase["verdict"] != "ready":
            break
        safe = phase["phase"]
    notes = []
    if drift["unchecked_runs"]:
        notes.append(
            f"{drift['unchecked_runs']} runs in the window have no drift check: "
            "run 'tracestore drift --recompute --stale'"
        )
    return {
        "window": {"since": start, "until": end},
        "runs": drift["runs"],
        "unchecked_runs": drift["unchecked_runs"],
        "safe_through_phase": safe,
        "phases": phases,
        "notes": notes,
    }


def report_data(
    session: Session,
    f: DriftFilter,
    *,
    budget: float,
    min_trace_share: float = DEFAULT_MIN_TRACE_SHARE,
) -> dict[str, Any]:
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
    return {
        "generated_at": datetime.now(UTC),
        "comparator_version": COMPARATOR_VERSION,
        "summary": drift,
        "worst_runs": worst_runs(session, f),
        # The status is about the whole store in the window: reuse the summary when it is.
        "status": migration_status(
            session,
            f.runs.since,
            f.runs.until,
            budget=budget,
            min_trace_share=min_trace_share,
            drift=drift if unfiltered else None,
        ),
    }


# --- recompute ----------------------------------------------------------------------------


@dataclass(slots=True)
class RecomputeResult:
    """What a recompute did."""

    selected: int = 0
    recomputed: int = 0
    with_drift: int = 0
    batches: int = 0


def _stale() -> Any:
    check = select(DriftCheck.run_pk).where(
        DriftCheck.comparator_version == COMPARATOR_VERSION,
        or_(
            DriftCheck.converter_version.is_(None),
            DriftCheck.converter_version == CONVERTER_VERSION,
        ),
    )
    return Run.id.not_in(check)


def recompute(
    engine: Engine,
    f: RunFilter,
    *,
    stale_only: bool = False,
    run_ids: Sequence[str] = (),
    batch_size: int = 100,
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
) -> RecomputeResult:
    """Recompute the drift rows of the filtered runs, one transaction per batch.

    Batches go in run key order; each commits on its own, so an interrupted run loses at
    most one batch and `stale_only` picks up where it stopped.
    """
    if batch_size < 1:
        raise InvalidRequest("batch size must be at least 1", batch_size=batch_size)

    def select_runs(query: Select[*tuple[Any, ...]]) -> Select[*tuple[Any, ...]]:
        query = filtered_runs(query, f)
        if stale_only:
            query = query.where(_stale())
        if run_ids:
            query = query.where(Run.run_id.in_(list(run_ids)))
        return query

    result = RecomputeResult()
    with read_session(engine) as session:
        result.selected = session.execute(select_runs(select(func.count(Run.id)))).scalar_one()
    if on_total is not None:
        on_total(result.selected)
    last = 0
    while True:
        with read_session(engine) as session:
            rows = list(
                session.execute(
                    select_runs(
                        select(Run.id, RunDocument.body, RunDocument.encoding)
                        .join(RunDocument, RunDocument.run_pk == Run.id)
                        .where(Run.id > last)
                    )
                    .order_by(Run.id)
                    .limit(batch_size)
                )
            )
        if not rows:
            return result
        # The comparison is pure and runs outside the write transaction (the lock is short).
        items: list[tuple[int, DriftRows]] = [
            (r.id, drift_rows(orjson.loads(decompress_document(r.body, r.encoding)))) for r in rows
        ]
        with write_session(engine) as session:
            replace_drift(session.connection(), items)
        last = rows[-1].id
        result.batches += 1
        result.recomputed += len(items)
        result.with_drift += sum(1 for _, r in items if r.findings)
        if progress is not None:
            progress(len(items))


# --- legacy reads -------------------------------------------------------------------------


def has_trajectories(session: Session, run_id: str) -> bool:
    """Whether the stored run has trajectories: reading it whole is then a legacy read."""
    n = session.connection().execute(_N_TRAJECTORIES, {"run_id": run_id}).scalar()
    return bool(n)


class LegacyReadTracker:
    """Counts legacy reads in memory; `flush` adds them to the store with one upsert each.

    The request path only takes a lock and bumps a counter: no database write per GET.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, date, str], tuple[int, datetime]] = {}

    def record(self, client: str, route: str, at: datetime | None = None) -> None:
        """Count one read of `route` by `client`."""
        at = at or datetime.now(UTC)
        key = (client, at.date(), route)
        with self._lock:
            reads, last = self._pending.get(key, (0, at))
            self._pending[key] = (reads + 1, max(last, at))

    def pending(self) -> int:
        """Reads counted but not yet flushed."""
        with self._lock:
            return sum(reads for reads, _ in self._pending.values())

    def flush(self, engine: Engine) -> int:
        """Write the pending counts (one transaction); on failure they stay pending."""
        with self._lock:
            taken, self._pending = self._pending, {}
        if not taken:
            return 0
        counts = [ReadCount(c, d, r, n, last) for (c, d, r), (n, last) in taken.items()]
        try:
            with write_session(engine) as session:
                upsert_legacy_reads(session.connection(), counts)
        except Exception:
            # Put them back (merged with reads counted meanwhile) for the next flush.
            with self._lock:
                for key, (n, last) in taken.items():
                    reads, seen = self._pending.get(key, (0, last))
                    self._pending[key] = (reads + n, max(seen, last))
            raise
        return sum(c.reads for c in counts)


# --- /metrics -----------------------------------------------------------------------------


def metric_figures(session: Session) -> tuple[dict[str, int], dict[str, int]]:
    """Findings by kind, and runs by check state, over the whole store (for /metrics)."""
    findings = dict(
        session.execute(select(DriftFinding.kind, func.count()).group_by(DriftFinding.kind)).all()
    )
    row = session.execute(
        select(
            func.count(DriftCheck.run_pk).label("checked"),
            func.sum(_one_if(DriftCheck.comparable)).label("comparable"),
            func.sum(_one_if(and_(DriftCheck.comparable, DriftCheck.n_findings > 0))).label(
                "drift"
            ),
        )
    ).one()
    total = session.execute(select(func.count(Run.id))).scalar_one()
    checked, comparable = int(row.checked), int(row.comparable or 0)
    runs = {
        "comparable": comparable,
        "comparable_with_drift": int(row.drift or 0),
        "not_comparable": checked - comparable,
        "unchecked": total - checked,
    }
    return findings, runs

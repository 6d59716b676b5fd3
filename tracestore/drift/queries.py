"""Drift queries: a run's check, summaries over filtered runs, findings, worst runs.

Functions take a `Session`, never commit, and return the typed models of drift/models.py.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import Select, and_, case, func, or_, select
from sqlalchemy.orm import Session

from tracestore.drift.models import (
    DayGroup,
    DriftSummary,
    EnvGroup,
    FindingOut,
    FindingPage,
    KindCount,
    ListedFinding,
    RunDrift,
    WorstRun,
)
from tracestore.drift.rows import drift_rows
from tracestore.errors import InvalidRequest, NotFound
from tracestore.models import Run, Trajectory
from tracestore.models.drift import DriftCheck, DriftFinding
from tracestore.store.documents import load_documents
from tracestore.store.drift import as_date, has_drift_clause, utc_day
from tracestore.store.runs import KEY_LIMIT, MAX_LIMIT, RunFilter
from tracestore.store.runs import filtered as filtered_runs  # the list's filters, reused
from tracestore.timewindow import DEFAULT_WINDOW_DAYS, check_order
from tracestore.vocabulary import DRIFT_KINDS

WORST_RUNS = 10
FINDINGS_PER_WORST_RUN = 5


def rate(part: int, whole: int) -> float | None:
    """part / whole, or None when there is no whole."""
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
    check_order(start, end)
    return start, end


def one_if(condition: Any) -> Any:
    """1 where `condition` holds, else 0 (for SUM): portable across both databases."""
    return case((condition, 1), else_=0)


# --- one run ------------------------------------------------------------------------------


# The check's own columns among RunDrift's fields.
_CHECK_FIELDS = tuple(n for n in RunDrift.model_fields if n not in ("run_id", "stored", "findings"))


def run_drift(session: Session, run_id: str) -> RunDrift:
    """A run's stored drift check and findings; computed on the fly when never checked."""
    run = session.execute(select(Run.id).where(Run.run_id == run_id)).first()
    if run is None:
        raise NotFound(f"no rollout with run_id {run_id!r}", run_id=run_id)
    check = session.get(DriftCheck, run.id)
    if check is None:
        # Stored before drift checks existed: answer from the document, say it is not stored.
        raw = load_documents(session.connection(), [run.id])[run.id]
        rows = drift_rows(orjson.loads(raw))
        return RunDrift.model_validate(
            {
                **rows.check,
                "run_id": run_id,
                "stored": False,
                "checked_at": None,
                "findings": rows.findings,
            }
        )
    findings = session.scalars(
        select(DriftFinding).where(DriftFinding.run_pk == run.id).order_by(DriftFinding.ordinal)
    )
    return RunDrift.model_validate(
        {
            **{
                name: getattr(check, name) for name in RunDrift.model_fields if hasattr(check, name)
            },
            "run_id": run_id,
            "stored": True,
            "findings": [FindingOut.model_validate(f) for f in findings],
        }
    )


# --- summaries ----------------------------------------------------------------------------


def _scoped(query: Select[*tuple[Any, ...]], f: DriftFilter) -> Select[*tuple[Any, ...]]:
    return filtered_runs(query, f.runs)


def summary(session: Session, f: DriftFilter) -> DriftSummary:
    """Comparable runs, runs with drift, rate, and counts by kind, reason, env and day."""
    drifted = has_drift_clause(True, f.kind)
    totals = session.execute(
        _scoped(
            select(
                func.count(Run.id).label("runs"),
                func.count(DriftCheck.run_pk).label("checked"),
                func.sum(one_if(DriftCheck.comparable)).label("comparable"),
                func.sum(one_if(and_(DriftCheck.comparable, drifted))).label("comparable_drift"),
                func.sum(one_if(drifted)).label("drift"),
            ).outerjoin(DriftCheck, DriftCheck.run_pk == Run.id),
            f,
        )
    ).one()
    comparable = int(totals.comparable or 0)
    comparable_drift = int(totals.comparable_drift or 0)
    return DriftSummary(
        filters=f.as_dict(),
        runs=totals.runs,
        checked_runs=totals.checked,
        unchecked_runs=totals.runs - totals.checked,
        comparable_runs=comparable,
        runs_with_drift=int(totals.drift or 0),
        comparable_runs_with_drift=comparable_drift,
        drift_rate=rate(comparable_drift, comparable),
        not_comparable=_not_comparable(session, f),
        by_kind=_by_kind(session, f),
        by_env=_by_env(session, f, drifted),
        by_day=_by_day(session, f, drifted),
    )


def _not_comparable(session: Session, f: DriftFilter) -> dict[str, int]:
    reasons = session.execute(
        _scoped(
            select(DriftCheck.reason, func.count())
            .join(Run, Run.id == DriftCheck.run_pk)
            .where(~DriftCheck.comparable)
            .group_by(DriftCheck.reason),
            f,
        )
    ).all()
    return {str(r): n for r, n in sorted(reasons, key=lambda x: str(x[0]))}


def _by_kind(session: Session, f: DriftFilter) -> dict[str, KindCount]:
    query = (
        select(DriftFinding.kind, func.count(func.distinct(DriftFinding.run_pk)), func.count())
        .join(Run, Run.id == DriftFinding.run_pk)
        .group_by(DriftFinding.kind)
    )
    if f.kind is not None:
        query = query.where(DriftFinding.kind == f.kind)
    counted = {k: (runs, n) for k, runs, n in session.execute(_scoped(query, f))}
    kinds = [f.kind] if f.kind is not None else list(DRIFT_KINDS)
    return {
        k: KindCount(runs=counted.get(k, (0, 0))[0], findings=counted.get(k, (0, 0))[1])
        for k in kinds
    }


def _by_env(session: Session, f: DriftFilter, drifted: Any) -> list[EnvGroup]:
    drift_pk = case((drifted, Run.id))
    query = (
        select(
            Trajectory.env_id,
            func.count(func.distinct(Run.id)),
            func.count(func.distinct(drift_pk)),
        )
        .join(DriftCheck, DriftCheck.run_pk == Run.id)
        .join(Trajectory, Trajectory.run_pk == Run.id)
        .where(DriftCheck.comparable)
        .group_by(Trajectory.env_id)
        .order_by(Trajectory.env_id)
    )
    return [
        EnvGroup(env_id=env, comparable_runs=n, runs_with_drift=d, drift_rate=rate(d, n))
        for env, n, d in session.execute(_scoped(query, f))
    ]


def _by_day(session: Session, f: DriftFilter, drifted: Any) -> list[DayGroup]:
    day = utc_day(Run.received_at, session.get_bind().dialect.name)
    query = (
        select(day, func.count(), func.sum(one_if(drifted)))
        .join(DriftCheck, DriftCheck.run_pk == Run.id)
        .where(DriftCheck.comparable)
        .group_by(day)
        .order_by(day)
    )
    return [
        DayGroup(
            day=as_date(d),
            comparable_runs=n,
            runs_with_drift=int(drift or 0),
            drift_rate=rate(int(drift or 0), n),
        )
        for d, n, drift in session.execute(_scoped(query, f))
    ]


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
) -> FindingPage:
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
        ListedFinding(
            **FindingOut.model_validate(r.DriftFinding).model_dump(),
            run_id=r.run_id,
            received_at=r.received_at,
        )
        for r in rows
    ]
    last = rows[-1].DriftFinding if rows else None
    next_cursor = _encode_cursor(last.run_pk, last.ordinal) if more and last else None
    return FindingPage(items=items, next_cursor=next_cursor)


def worst_runs(session: Session, f: DriftFilter, limit: int = WORST_RUNS) -> list[WorstRun]:
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
    findings: dict[int, list[FindingOut]] = {}
    finding_query = select(DriftFinding).where(DriftFinding.run_pk.in_(pks))
    if f.kind is not None:
        finding_query = finding_query.where(DriftFinding.kind == f.kind)
    for finding in session.scalars(
        finding_query.order_by(DriftFinding.run_pk, DriftFinding.ordinal)
    ):
        listed = findings.setdefault(finding.run_pk, [])
        if len(listed) < FINDINGS_PER_WORST_RUN:
            listed.append(FindingOut.model_validate(finding))
    return [
        WorstRun(
            run_id=r.run_id,
            received_at=r.received_at,
            env_ids=envs.get(r.id, []),
            n_findings=r.n,
            findings=findings.get(r.id, []),
        )
        for r in runs
    ]


def metric_figures(session: Session) -> tuple[dict[str, int], dict[str, int]]:
    """Findings by kind, and runs by check state, over the whole store (for /metrics)."""
    findings = dict(
        session.execute(select(DriftFinding.kind, func.count()).group_by(DriftFinding.kind)).all()
    )
    row = session.execute(
        select(
            func.count(DriftCheck.run_pk).label("checked"),
            func.sum(one_if(DriftCheck.comparable)).label("comparable"),
            func.sum(one_if(and_(DriftCheck.comparable, DriftCheck.n_findings > 0))).label("drift"),
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

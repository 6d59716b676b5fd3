"""What a person pastes, resolved: a run id, a cid, an inference URL or a whole log line;
and the store's headline figures."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tracestore.correlation import cid_in_text, clean_cid
from tracestore.errors import NotFound
from tracestore.inspect.models import RunLink, StoreFigures
from tracestore.inspect.run import FINDING_FIELDS
from tracestore.models import Run
from tracestore.models.drift import DriftCheck, DriftFinding
from tracestore.store.runs import runs_by_correlation


@dataclass(frozen=True, slots=True)
class Found:
    """Where a query leads: a run, the runs of a cid, or nowhere (with why)."""

    kind: Literal["run", "correlation", "none"]
    query: str
    run_id: str | None = None
    correlation_id: str | None = None
    matched_correlation_id: str | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    how: str = ""


def run_exists(session: Session, run_id: str) -> bool:
    """True when a run with this run_id is stored."""
    return session.execute(select(Run.id).where(Run.run_id == run_id)).first() is not None


def resolve(session: Session, query: str) -> Found:
    """Resolve a pasted run id, cid, inference URL or log line.

    Order: a URL's cid (when the text holds a URL with one); else the text as a run id;
    else as a cid, as stored or as synth-ai's extractor logs it (`correlation.lookup_forms`).
    A cid with one run leads to that run.
    """
    text = query.strip()
    if not text:
        return Found("none", query, how="nothing to look up")
    from_url = cid_in_text(text)
    if from_url is None and run_exists(session, text):
        return Found("run", query, run_id=text, how="run id")
    cid = from_url if from_url is not None else clean_cid(text)
    if cid is None:
        return Found("none", query, how="not a run id or a correlation id")
    try:
        matched, runs = runs_by_correlation(session, cid)
    except NotFound:
        how = f"no run has the correlation id {cid!r}"
        if from_url is not None:
            how += " (read from the URL)"
        return Found("none", query, correlation_id=cid, how=how)
    how = "correlation id read from the URL" if from_url is not None else "correlation id"
    if len(runs) == 1:
        return Found(
            "run",
            query,
            run_id=runs[0]["run_id"],
            correlation_id=cid,
            matched_correlation_id=matched,
            runs=runs,
            how=how,
        )
    return Found(
        "correlation",
        query,
        correlation_id=cid,
        matched_correlation_id=matched,
        runs=runs,
        how=how,
    )


def first_findings(session: Session, run_ids: Iterable[str]) -> dict[str, int]:
    """For each run with a per-step finding, the position of its first one."""
    ids = list(run_ids)
    if not ids:
        return {}
    query = (
        select(Run.run_id, func.min(DriftFinding.position))
        .join(Run, Run.id == DriftFinding.run_pk)
        .where(Run.run_id.in_(ids))
        .where(DriftFinding.position.is_not(None))
        .where(DriftFinding.kind.in_(list(FINDING_FIELDS)))
        .group_by(Run.run_id)
    )
    # Positions are not null here (the WHERE above), so min() found one.
    return {str(run_id): int(position or 0) for run_id, position in session.execute(query)}


def run_links(session: Session, summaries: list[dict[str, Any]]) -> list[RunLink]:
    """Run summaries as list rows, each with its first drifting step."""
    first = first_findings(session, (s["run_id"] for s in summaries))
    return [
        RunLink(
            **{k: s[k] for k in RunLink.model_fields if k in s},
            first_finding_position=first.get(s["run_id"]),
        )
        for s in summaries
    ]


def store_figures(session: Session) -> StoreFigures:
    """Runs, their formats and trace kinds, drift, bytes and the newest arrival."""
    totals = session.execute(
        select(
            func.count(Run.id).label("runs"),
            func.sum(func.coalesce(Run.doc_bytes, 0)).label("bytes"),
            func.max(Run.received_at).label("newest"),
        )
    ).one()
    with_trajectories = session.execute(
        select(func.count(Run.id)).where(Run.n_trajectories > 0)
    ).scalar_one()
    kinds = {
        kind or "none": n
        for kind, n in session.execute(
            select(Run.trace_kind, func.count()).group_by(Run.trace_kind)
        )
    }
    trace_only = session.execute(
        select(func.count(Run.id)).where(
            Run.n_trajectories == 0, Run.trace_kind.in_(["full", "wrapped"])
        )
    ).scalar_one()
    checks = session.execute(
        select(
            func.count(DriftCheck.run_pk).label("checked"),
            func.count(DriftCheck.run_pk).filter(DriftCheck.comparable).label("comparable"),
            func.count(DriftCheck.run_pk).filter(DriftCheck.n_findings > 0).label("drift"),
            func.coalesce(func.sum(DriftCheck.n_findings), 0).label("findings"),
        )
    ).one()
    newest = totals.newest
    return StoreFigures(
        runs=totals.runs,
        runs_with_trajectories=with_trajectories,
        trace_only_runs=trace_only,
        by_trace_kind={str(k): int(n) for k, n in sorted(kinds.items(), key=lambda x: -x[1])},
        checked_runs=checks.checked,
        comparable_runs=checks.comparable,
        runs_with_drift=checks.drift,
        findings=int(checks.findings or 0),
        doc_bytes=int(totals.bytes or 0),
        newest_received_at=newest,
    )

"""Recompute stored drift rows: after a comparator change, or for runs stored before drift.

One transaction per batch, in run key order: an interrupted recompute loses at most one
batch, and `stale_only` picks up where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import Engine, Select, func, or_, select
from sqlalchemy.orm import Session

from tracestore.convert import CONVERTER_VERSION
from tracestore.db.uow import read_session, write_session
from tracestore.drift.compare import COMPARATOR_VERSION
from tracestore.drift.rows import drift_rows
from tracestore.errors import InvalidRequest
from tracestore.models import Run, RunDocument
from tracestore.models.drift import DriftCheck
from tracestore.store.documents import decompress_document
from tracestore.store.drift import DriftRows, replace_drift
from tracestore.store.runs import RunFilter
from tracestore.store.runs import filtered as filtered_runs


@dataclass(slots=True)
class RecomputeResult:
    """What a recompute did."""

    selected: int = 0
    recomputed: int = 0
    with_drift: int = 0
    batches: int = 0
    # Run ids asked for (`run_ids`) that name no stored run, in the order given.
    missing: list[str] = field(default_factory=list)


def _stale() -> Any:
    check = select(DriftCheck.run_pk).where(
        DriftCheck.comparator_version == COMPARATOR_VERSION,
        or_(
            DriftCheck.converter_version.is_(None),
            DriftCheck.converter_version == CONVERTER_VERSION,
        ),
    )
    return Run.id.not_in(check)


# Run ids per look-up: well under every backend's limit on bound parameters.
_LOOKUP_CHUNK = 500


def _missing(session: Session, run_ids: Sequence[str]) -> list[str]:
    # Stored at all, whatever the filters: a run the filters leave out is not missing.
    wanted = list(dict.fromkeys(run_ids))
    found: set[str] = set()
    for at in range(0, len(wanted), _LOOKUP_CHUNK):
        chunk = wanted[at : at + _LOOKUP_CHUNK]
        found.update(session.scalars(select(Run.run_id).where(Run.run_id.in_(chunk))))
    return [run_id for run_id in wanted if run_id not in found]


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
    most one batch and `stale_only` picks up where it stopped. `run_ids` that name no
    stored run are listed in the result's `missing`.
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
        result.missing = _missing(session, run_ids)
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

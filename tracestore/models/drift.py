"""Drift checks and findings (SPEC §6) per run, and legacy-trajectory reads (SPEC §7)."""

from __future__ import annotations

from datetime import date, datetime

from sqlalchemy import Date, ForeignKey, Index, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from tracestore.db.base import Base, BigIntPK


class DriftCheck(Base):
    """The outcome of comparing one run's trajectories with its trace, and of converting it.

    One row per checked run, written in the run's ingest transaction (or by
    `tracestore drift --recompute`). A run without a row has not been checked yet (it was
    stored before drift checks existed).
    """

    __tablename__ = "drift_checks"

    run_pk: Mapped[int] = mapped_column(
        BigIntPK, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    # tracestore.drift.COMPARATOR_VERSION at the time of the check: selects stale rows.
    comparator_version: Mapped[int]
    checked_at: Mapped[datetime]
    comparable: Mapped[bool]
    # Why the run is not comparable (tracestore.drift.NOT_COMPARABLE_REASONS); NULL if it is.
    reason: Mapped[str | None]
    trajectory_steps: Mapped[int]
    environment_events: Mapped[int]
    n_findings: Mapped[int]
    # Phase 1 figures (SPEC §7): the trace is full/wrapped with an environment event; the
    # run carries both formats; and converting the trace alone gives back its steps.
    usable_trace: Mapped[bool]
    dual_serialized: Mapped[bool]
    reproduces: Mapped[bool | None]  # NULL when not dual-serialized
    # The first field that does not come back (or the trace's kind), and a readable detail.
    reproduce_gap: Mapped[str | None]
    reproduce_detail: Mapped[str | None]
    # tracestore.convert.CONVERTER_VERSION used for `reproduces` (NULL: no conversion ran).
    converter_version: Mapped[str | None]


class DriftFinding(Base):
    """One disagreement between a run's trajectories and its trace (SPEC §6)."""

    __tablename__ = "drift_findings"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    # Findings belong to their check: replacing a check (recompute) drops its findings.
    run_pk: Mapped[int] = mapped_column(
        BigIntPK, ForeignKey("drift_checks.run_pk", ondelete="CASCADE")
    )
    # Order of the finding within its run's comparison.
    ordinal: Mapped[int]
    kind: Mapped[str]
    trajectory_index: Mapped[int | None]
    step_index: Mapped[int | None]
    # Index in the aligned sequence (all trajectories' steps, in order).
    position: Mapped[int | None]
    # Both values, shortened: the trajectory (or envelope) side, and the trace side.
    expected: Mapped[str | None]
    actual: Mapped[str | None]
    message: Mapped[str]
    comparator_version: Mapped[int]

    __table_args__ = (
        UniqueConstraint("run_pk", "ordinal"),
        # Counts by kind (/metrics, summaries) and the `kind` / `has_drift` filters.
        Index("ix_drift_findings_kind_run_pk", "kind", "run_pk"),
    )


class LegacyRead(Base):
    """Successful reads of legacy trajectories by one client on one UTC day (SPEC §7 phase 3).

    `client` is a label, never a key: `key:` and the first 8 hex digits of the key's
    sha256, or `anonymous`.
    """

    __tablename__ = "legacy_reads"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    client: Mapped[str]
    day: Mapped[date] = mapped_column(Date)
    # 'trajectories' (GET /v1/rollouts/{run_id}/trajectories) or 'rollout'
    # (GET /v1/rollouts/{run_id}, whose body holds the trajectories part).
    route: Mapped[str]
    reads: Mapped[int]
    last_seen: Mapped[datetime]

    __table_args__ = (
        UniqueConstraint("client", "day", "route"),
        Index("ix_legacy_reads_day", "day"),
    )

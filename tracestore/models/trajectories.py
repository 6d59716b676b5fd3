"""Legacy trajectories and their steps (the deprecated format, stored as sent)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ForeignKey, Index, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from tracestore.db.base import Base, BigIntPK


class Trajectory(Base):
    """`trajectories[idx]` of a run."""

    __tablename__ = "trajectories"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    run_pk: Mapped[int] = mapped_column(BigIntPK, ForeignKey("runs.id", ondelete="CASCADE"))
    idx: Mapped[int]
    env_id: Mapped[str | None]
    policy_id: Mapped[str | None]
    length: Mapped[int | None]
    inference_url: Mapped[str | None]
    # The trajectory's own cid (SPEC §4: its trace_correlation_id, else its URL's).
    correlation_id: Mapped[str | None]
    correlation_source: Mapped[str | None]
    final: Mapped[Any] = mapped_column(nullable=True)
    decision_samples: Mapped[Any] = mapped_column(nullable=True)
    n_steps: Mapped[int]
    # Keys the contract does not declare (kept for converters and analysts).
    extra: Mapped[dict[str, Any] | None]

    __table_args__ = (
        UniqueConstraint("run_pk", "idx"),
        Index("ix_trajectories_correlation_id", "correlation_id"),
        Index("ix_trajectories_env_id", "env_id"),
        Index("ix_trajectories_policy_id", "policy_id"),
    )


class Step(Base):
    """`trajectories[t].steps[idx]`."""

    __tablename__ = "steps"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    # Denormalized run key: reports aggregate steps per run without a join.
    run_pk: Mapped[int] = mapped_column(BigIntPK, ForeignKey("runs.id", ondelete="CASCADE"))
    trajectory_pk: Mapped[int] = mapped_column(
        BigIntPK, ForeignKey("trajectories.id", ondelete="CASCADE")
    )
    idx: Mapped[int]
    obs: Mapped[Any] = mapped_column(nullable=True)
    tool_calls: Mapped[Any] = mapped_column(nullable=True)
    reward: Mapped[float | None]
    done: Mapped[bool | None]
    truncated: Mapped[bool | None]
    info: Mapped[Any] = mapped_column(nullable=True)
    extra: Mapped[dict[str, Any] | None]

    __table_args__ = (
        UniqueConstraint("trajectory_pk", "idx"),
        Index("ix_steps_run_pk", "run_pk"),
    )

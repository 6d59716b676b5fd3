"""The drift read side's shapes: what queries, gates and the report return.

One typed model per answer; the API serves them as they are (its response models), the
HTML report and the CLI render them. Field descriptions are the API's documentation.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Verdict = Literal["ready", "not_ready", "insufficient_data"]


class FindingOut(BaseModel):
    """One drift finding (docs/FORMAT.md §6): where, which kind, and both values (shortened)."""

    model_config = ConfigDict(from_attributes=True)

    kind: str = Field(examples=["reward_mismatch"])
    trajectory_index: int | None
    step_index: int | None
    position: int | None = Field(description="Index in all trajectories' steps, in order.")
    expected: str | None = Field(description="The trajectory (or envelope) side.")
    actual: str | None = Field(description="The trace side.")
    message: str
    comparator_version: int


class RunDrift(BaseModel):
    """A run's drift check: comparability, phase-1 reproduction, findings."""

    model_config = ConfigDict(from_attributes=True)

    run_id: str
    stored: bool = Field(
        description="False when the run was stored before drift checks existed: the check "
        "was computed for this answer ('tracestore drift --recompute' stores it)."
    )
    checked_at: datetime | None
    comparator_version: int
    comparable: bool
    reason: str | None = Field(description="Why the run is not comparable.")
    trajectory_steps: int
    environment_events: int
    usable_trace: bool
    dual_serialized: bool
    reproduces: bool | None = Field(
        description="The trace alone, converted, gives back the trajectory steps "
        "(null when the run does not carry both formats)."
    )
    reproduce_gap: str | None
    reproduce_detail: str | None
    converter_version: str | None
    findings: list[FindingOut]


class KindCount(BaseModel):
    """Runs with a kind, and its findings."""

    runs: int
    findings: int


class Rated(BaseModel):
    """Comparable runs, those with drift, and the rate, in one group."""

    comparable_runs: int
    runs_with_drift: int
    drift_rate: float | None


class EnvGroup(Rated):
    """Drift among the comparable runs of one env."""

    env_id: str | None


class DayGroup(Rated):
    """Drift among the comparable runs received on one UTC day."""

    day: date


class ListedFinding(FindingOut):
    """A finding with its run."""

    run_id: str
    received_at: datetime


class FindingPage(BaseModel):
    """One page of findings."""

    items: list[ListedFinding]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page.")


class DriftSummary(BaseModel):
    """Drift over a filtered set of runs."""

    filters: dict[str, Any]
    runs: int
    checked_runs: int
    unchecked_runs: int = Field(description="Runs stored before drift checks existed.")
    comparable_runs: int
    runs_with_drift: int = Field(description="Runs with a finding, comparable or not.")
    comparable_runs_with_drift: int
    drift_rate: float | None = Field(
        description="comparable_runs_with_drift / comparable_runs (null when none)."
    )
    not_comparable: dict[str, int] = Field(description="Runs that cannot be compared, by why.")
    by_kind: dict[str, KindCount]
    by_env: list[EnvGroup]
    by_day: list[DayGroup]


class DriftSummaryPage(DriftSummary):
    """GET /v1/drift: the summary and one page of its findings."""

    findings: FindingPage


class WorstRun(BaseModel):
    """A run with many findings, and its first ones."""

    run_id: str
    received_at: datetime
    env_ids: list[str]
    n_findings: int
    findings: list[FindingOut]


class ReadDay(BaseModel):
    """Reads on one UTC day."""

    day: date
    reads: int


class Reader(BaseModel):
    """One client's legacy reads of one route: in the window, per day, and when last seen."""

    client: str
    route: str
    reads: int
    last_seen: datetime | None
    days: list[ReadDay]
    counted: bool = Field(
        default=True,
        description="False for `anonymous` (a person looking at a run): never holds phase 3.",
    )


class Phase1Figures(BaseModel):
    """Traces usable, and traces that alone reproduce the trajectories."""

    runs: int
    checked_runs: int
    usable_trace_runs: int
    usable_trace_share: float | None
    dual_serialized_runs: int
    reproducing_runs: int
    reproduce_share: float | None
    not_reproducing: dict[str, int]
    min_usable_trace_share: float
    min_reproduce_share: float


class Phase2Figures(BaseModel):
    """The drift rate against the budget."""

    comparable_runs: int
    runs_with_drift: int
    drift_rate: float | None
    budget: float
    by_kind: dict[str, int]


class Phase3Figures(BaseModel):
    """Who still reads legacy trajectories."""

    legacy_reads: int
    clients_reading: int
    unattributed_reads: int
    tracked_since: date | None = Field(
        description="The first day a legacy read was recorded; null when none ever was, and "
        "then phase 3 has no verdict (insufficient_data)."
    )
    readers: list[Reader]


class Phase(BaseModel):
    """One migration phase (docs/FORMAT.md §7): its gate figures and verdict."""

    phase: int
    name: str
    verdict: Verdict
    reasons: list[str]
    figures: Phase1Figures | Phase2Figures | Phase3Figures


class Window(BaseModel):
    """A time window: [since, until)."""

    since: datetime
    until: datetime


class MigrationStatus(BaseModel):
    """GET /v1/migration/status."""

    window: Window
    runs: int
    unchecked_runs: int
    safe_through_phase: int = Field(
        description="The highest phase whose gate and every earlier one say ready (0: none)."
    )
    phases: list[Phase]
    notes: list[str]


class DriftReport(BaseModel):
    """Everything the drift report shows: summary, worst runs, migration status."""

    generated_at: datetime
    comparator_version: int
    summary: DriftSummary
    worst_runs: list[WorstRun]
    status: MigrationStatus

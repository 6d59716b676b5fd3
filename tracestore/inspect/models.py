"""The inspector's answers: one typed model per panel of the run page.

The API serves them as they are (`GET /v1/inspect/{run_id}`) and the pages render them,
so every panel a person sees has its JSON. Field descriptions are the API's documentation.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from tracestore.drift.models import RunDrift

Panel = Literal["all", "header", "parts", "drift", "rewards", "steps"]
PANELS: tuple[str, ...] = ("all", "header", "parts", "drift", "rewards", "steps")


class ToolCall(BaseModel):
    """A tool call in one shape, whatever the producer's dialect (docs/FORMAT.md §5)."""

    name: str | None
    arguments: Any


class ChatMessage(BaseModel):
    """One message of a time step, read as a chat turn."""

    role: str = Field(description="The payload's `role`, else the message type.")
    message_type: str | None
    text: str | None = Field(description="The text a person reads (content, or its parts).")
    tool_calls: list[ToolCall]
    value: Any = Field(
        default=None,
        description="The content as JSON when it is not a chat turn (an observation, an "
        "action list).",
    )


class LmCall(BaseModel):
    """One LM call event: the model, its token usage and latency, the calls it made."""

    model: str | None
    provider: str | None
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    latency_ms: float | None
    cost_usd: float | None
    tool_calls: list[ToolCall]


class TrajectoryStep(BaseModel):
    """The trajectory side of one decision step: `trajectories[t].steps[s]`."""

    trajectory_index: int
    step_index: int
    obs: Any
    reward: Any
    done: Any
    truncated: Any
    tool_calls: list[ToolCall]
    info: Any
    extra: dict[str, Any] | None = Field(description="Undeclared step keys.")


class TraceStep(BaseModel):
    """The trace side of one decision step: its environment event and its time step."""

    step_id: str | None
    time_step: int | None = Field(description="Index in session_time_steps, when in one.")
    timestamp: datetime | None
    reward: Any
    terminated: Any
    truncated: Any
    observation: Any = Field(description="What the policy saw (docs/FORMAT.md §5).")
    observation_source: str | None
    state_after: Any
    tool_calls: list[ToolCall] | None = Field(
        description="The time step's tool calls; null when the trace says nothing."
    )
    lm_calls: list[LmCall]
    messages: list[ChatMessage]
    event: dict[str, Any] = Field(description="The environment event as stored.")


class StepFinding(BaseModel):
    """A drift finding marked on a step, with the field it concerns."""

    kind: str
    field: str
    expected: str | None
    actual: str | None
    message: str


class StepRow(BaseModel):
    """One decision step: the trajectory step and the trace's event at the same position."""

    position: int = Field(description="Index in all trajectories' steps, in order.")
    trajectory: TrajectoryStep | None
    trace: TraceStep | None
    findings: list[StepFinding]
    fields: list[str] = Field(description="The fields a finding marks on this step.")


class StepsPage(BaseModel):
    """One page of steps."""

    offset: int
    limit: int
    total: int
    items: list[StepRow]


class RewardSeries(BaseModel):
    """Reward per decision step, on each side, and the steps with a finding."""

    trajectory: list[float | None]
    trace: list[float | None]
    drift_positions: list[int]


class PartInfo(BaseModel):
    """Where one format of the run comes from: stored, converted (with its loss report), or
    neither."""

    part: Literal["trace", "trajectories"]
    source: Literal["stored", "converted", "none"]
    detail: str
    report: dict[str, Any] | None = Field(
        default=None, description="The conversion's loss report and provenance."
    )


class CidLocation(BaseModel):
    """Where a run's correlation id was found (docs/FORMAT.md §4)."""

    source: str
    path: str
    url: str | None = Field(description="The URL the id was read from, for URL sources.")


class RunHeader(BaseModel):
    """What a run is: ids, where its cid came from, when, env, policy, metrics, sizes."""

    run_id: str
    correlation_id: str | None
    correlation: CidLocation | None
    trajectory_cids: list[str | None]
    received_at: datetime
    env_ids: list[str]
    policy_ids: list[str]
    trace_kind: str | None
    session_id: str | None
    trace_created_at: datetime | None
    metrics: dict[str, Any]
    mean_return: float | None
    n_trajectories: int
    n_steps: int
    step_source: str
    n_time_steps: int
    n_events: int
    n_messages: int
    doc_bytes: int
    aborted: bool
    drift_kinds: list[str]


class RunInspection(BaseModel):
    """GET /v1/inspect/{run_id}: the panels of the run page (those not asked for are null)."""

    run_id: str
    header: RunHeader | None = None
    parts: list[PartInfo] | None = None
    drift: RunDrift | None = None
    rewards: RewardSeries | None = None
    steps: StepsPage | None = None


class RunLink(BaseModel):
    """A run in a list: its summary and the first step with a finding."""

    run_id: str
    correlation_id: str | None
    correlation_source: str | None
    received_at: datetime
    trace_kind: str | None
    n_steps: int
    env_ids: list[str]
    policy_ids: list[str]
    mean_return: float | None
    drift_kinds: list[str]
    first_finding_position: int | None = None


class StoreFigures(BaseModel):
    """The home page's headline figures over the whole store."""

    runs: int
    runs_with_trajectories: int
    trace_only_runs: int
    by_trace_kind: dict[str, int]
    checked_runs: int
    comparable_runs: int
    runs_with_drift: int
    findings: int
    doc_bytes: int
    newest_received_at: datetime | None

"""Pydantic models of a RolloutResponse (SPEC §1): validation, and the OpenAPI schema.

They validate what typed columns need and allow every undeclared key. They are never
used to re-serialize a document: the store keeps the document as received.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# Values bound for BIGINT columns: a larger integer is refused rather than overflowing.
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
RunId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=1024, pattern=r"^[^\x00]*\S[^\x00]*$"),
    Field(
        description="The rollout's id: non-empty, not only whitespace, no NUL character.",
        examples=["run-1001-00003-626fda73"],
    ),
]


class WireModel(BaseModel):
    """Strict types (no string-to-number coercion), undeclared keys allowed and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)


class StepIn(WireModel):
    """One step of a legacy trajectory."""

    obs: Any = None
    tool_calls: list[Any] | None = None
    reward: float | None = None
    done: bool = False
    truncated: bool | None = None
    info: dict[str, Any] | None = None


class TrajectoryIn(WireModel):
    """A legacy trajectory (deprecated format)."""

    env_id: str | None = None
    policy_id: str | None = None
    steps: list[StepIn]
    length: Int64 | None = None
    inference_url: str | None = None
    final: dict[str, Any] | None = None
    decision_samples: list[Any] | None = None
    trace: dict[str, Any] | None = None


class MetricsIn(WireModel):
    """Rollout metrics."""

    episode_returns: list[float]
    mean_return: float
    num_steps: Int64
    num_episodes: Int64 = 0
    outcome_score: float | None = None
    events_score: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)


class RolloutIn(WireModel):
    """A RolloutResponse as producers send it (SPEC §1); unknown keys anywhere survive."""

    model_config = ConfigDict(
        extra="allow",
        strict=True,
        json_schema_extra={
            "description": (
                "A RolloutResponse. Stored as received: GET /v1/rollouts/{run_id} returns "
                "a JSON value equal to the posted document."
            )
        },
    )

    run_id: RunId
    trajectories: list[TrajectoryIn]
    metrics: MetricsIn
    branches: dict[str, list[str]] = Field(default_factory=dict)
    aborted: bool = False
    ops_executed: Int64 = 0
    trace_correlation_id: str | None = None
    trace: dict[str, Any] | None = None
    pipeline_metadata: dict[str, Any] = Field(default_factory=dict)

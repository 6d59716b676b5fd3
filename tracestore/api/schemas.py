"""Wire models of what the API returns (and of its error shape), for OpenAPI and tests."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ErrorDetail(BaseModel):
    """The error object; routes add details beside code and message."""

    model_config = ConfigDict(extra="allow")
    code: str = Field(description="Stable snake_case error code.", examples=["not_found"])
    message: str = Field(description="A readable sentence saying what is wrong.")


class ErrorBody(BaseModel):
    """Every non-2xx response body."""

    error: ErrorDetail


class Accepted(BaseModel):
    """Outcome of one rollout (201 created, 200 duplicate)."""

    run_id: str
    status: Literal["created", "duplicate"]
    correlation_id: str | None
    correlation_source: str | None
    trace_kind: str | None


class BatchItem(BaseModel):
    """Outcome of one rollout of a batch."""

    model_config = ConfigDict(extra="allow")
    index: int
    run_id: str | None
    status: Literal["created", "duplicate", "conflict", "invalid"]
    http_status: int
    correlation_id: str | None = None
    correlation_source: str | None = None
    trace_kind: str | None = None
    error: ErrorDetail | None = None


class BatchSummary(BaseModel):
    """Counts of a batch's outcomes."""

    total: int
    created: int
    duplicate: int
    conflict: int
    invalid: int


class BatchResult(BaseModel):
    """207 body of POST /v1/rollouts/batch."""

    results: list[BatchItem]
    summary: BatchSummary


class RunSummary(BaseModel):
    """One run, as lists and correlation look-ups return it."""

    run_id: str
    correlation_id: str | None
    correlation_source: str | None
    received_at: datetime
    trace_kind: str | None
    n_trajectories: int
    n_steps: int = Field(
        description="Decision steps: the trajectories' steps or, for a run without any, the "
        "environment events of its trace (`step_source` says which)."
    )
    step_source: Literal["trajectory", "trace"]
    n_events: int
    n_messages: int
    env_ids: list[str] = Field(
        description="Its trajectories' env_ids, then the one its trace's metadata names when "
        "its first trajectory names none (as in a run without trajectories)."
    )
    policy_ids: list[str] = Field(
        description="Its trajectories' policy_ids, then the one its trace's metadata names "
        "when its first trajectory names none (as in a run without trajectories)."
    )
    mean_return: float | None
    aborted: bool
    doc_bytes: int
    drift_kinds: list[str]


class RunList(BaseModel):
    """A page of GET /v1/rollouts."""

    items: list[RunSummary]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null at the end."
    )


class CorrelationRuns(BaseModel):
    """GET /v1/correlations/{cid}."""

    correlation_id: str
    matched_correlation_id: str = Field(
        description="The stored id that matched: `correlation_id`, or the id it names."
    )
    runs: list[RunSummary]


class Health(BaseModel):
    """GET /health."""

    model_config = ConfigDict(extra="allow")
    healthy: bool
    database: str
    schema_revision: str | None
    expected_revision: str


class Info(BaseModel):
    """GET /info."""

    service: str
    version: str
    backend: str
    schema_revision: str | None
    expected_revision: str
    auth_required: bool
    limits: dict[str, Any]


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for error statuses, all with the error shape."""
    text = {
        400: "Not JSON (`invalid_json`) or a corrupt gzip body.",
        401: "Missing or wrong API key (`unauthorized`).",
        404: "Not found (`not_found`).",
        409: "Same run_id, other content (`conflict`); `differing_parts` lists the top-level keys.",
        413: "Body over TRACESTORE_MAX_BODY_BYTES after decompression (`payload_too_large`).",
        415: "Unsupported Content-Type or Content-Encoding (`unsupported_media_type`).",
        422: "Not a valid RolloutResponse (`invalid_rollout`, with `errors`) or bad parameters.",
        503: "Database unreachable or schema not at the expected revision.",
    }
    return {s: {"model": ErrorBody, "description": text.get(s, "Error.")} for s in statuses}

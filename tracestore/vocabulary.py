"""The format's words that every layer uses (docs/FORMAT.md §3, §6): pure constants.

Drift kinds and not-comparable reasons are named by the comparison (drift/), stored and
queried by the store (store/), counted by metrics and listed by the API; they live here,
below all of them, so no layer imports upward to learn them.
"""

from __future__ import annotations

from typing import Literal

DriftKind = Literal[
    "step_count_mismatch",
    "reward_mismatch",
    "done_mismatch",
    "truncated_mismatch",
    "obs_mismatch",
    "tool_calls_mismatch",
    "return_mismatch",
    "correlation_conflict",
]
DRIFT_KINDS: tuple[DriftKind, ...] = (
    "step_count_mismatch",
    "reward_mismatch",
    "done_mismatch",
    "truncated_mismatch",
    "obs_mismatch",
    "tool_calls_mismatch",
    "return_mismatch",
    "correlation_conflict",
)

NotComparableReason = Literal[
    "no_trace",
    "summary_trace",
    "db_row_trace",
    "empty_trace",
    "unknown_trace",
    "no_trajectories",
    "no_environment_events",
]
NOT_COMPARABLE_REASONS: tuple[NotComparableReason, ...] = (
    "no_trace",
    "summary_trace",
    "db_row_trace",
    "empty_trace",
    "unknown_trace",
    "no_trajectories",
    "no_environment_events",
)

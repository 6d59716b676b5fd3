"""Drift detection between a rollout's trajectories and its v3 trace (SPEC §6)."""

from tracestore.drift.compare import (
    COMPARATOR_VERSION,
    MAX_VALUE_CHARS,
    RETURN_TOLERANCE,
    REWARD_TOLERANCE,
    Comparison,
    Finding,
    compare_rollout,
    shorten,
    summarize,
)
from tracestore.vocabulary import (
    DRIFT_KINDS,
    NOT_COMPARABLE_REASONS,
    DriftKind,
    NotComparableReason,
)

__all__ = [
    "COMPARATOR_VERSION",
    "DRIFT_KINDS",
    "MAX_VALUE_CHARS",
    "NOT_COMPARABLE_REASONS",
    "RETURN_TOLERANCE",
    "REWARD_TOLERANCE",
    "Comparison",
    "DriftKind",
    "Finding",
    "NotComparableReason",
    "compare_rollout",
    "shorten",
    "summarize",
]

"""Shared by the drift tests: ingest the examples, and the figures their labels imply."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from sqlalchemy import Engine

from tests.conftest import Example
from tracestore.convert import trace_to_trajectories
from tracestore.ingest.service import ingest_bytes
from tracestore.toolcalls import normalize_tool_calls

PER_STEP_KINDS = {
    "step_count_mismatch",
    "reward_mismatch",
    "done_mismatch",
    "truncated_mismatch",
    "obs_mismatch",
    "tool_calls_mismatch",
}


def ingest_examples(engine: Engine, examples: list[Example]) -> None:
    """Ingest every example line in order; each gets its labelled status."""
    for ex in examples:
        assert ingest_bytes(engine, ex.raw).status == ex.label["expect_status"], ex.label


def created(examples: list[Example]) -> list[Example]:
    """The lines that create a run (not retries or conflicts)."""
    return [e for e in examples if e.label["expect_status"] == "created"]


def clean_example(examples: list[Example], kind: str, trace_kind: str) -> dict[str, Any]:
    """A deep copy of the first drift-free example of a kind."""
    for ex in created(examples):
        label = ex.label
        if (label["kind"], label["trace_kind"], label["drift"]) == (kind, trace_kind, []):
            return copy.deepcopy(ex.doc)
    raise AssertionError(f"no clean {kind} example")


def _step_key(step: dict[str, Any]) -> tuple[Any, ...]:
    return (
        step.get("obs"),
        float(step.get("reward") or 0),
        bool(step.get("done")),
        bool(step.get("truncated")),
        normalize_tool_calls(step.get("tool_calls")),
    )


def trace_reproduces(doc: dict[str, Any]) -> bool:
    """The test's own reading of issue 3: converted trace steps equal the stored ones."""
    stored = [s for t in doc["trajectories"] for s in t["steps"]]
    converted = [s for t in trace_to_trajectories(doc).data for s in t["steps"]]
    return len(stored) == len(converted) and all(
        _step_key(a) == _step_key(b) for a, b in zip(stored, converted, strict=True)
    )


def label_figures(examples: list[Example]) -> dict[str, Any]:
    """The summary and phase figures, computed from the labels (and, for reproduction, from
    the documents with the test's own comparison)."""
    runs = created(examples)
    has_trace = [e for e in runs if e.label["trace_kind"] in ("full", "wrapped")]
    trace_only = {e.label["run_id"] for e in runs if e.label["kind"] == "trace_only"}
    comparable = [e for e in has_trace if e.label["run_id"] not in trace_only]
    drifted = [e for e in comparable if e.label["drift"]]
    dual = [
        e for e in runs if e.label["trace_kind"] is not None and e.label["run_id"] not in trace_only
    ]
    reproducing = [
        e for e in dual if e.label["trace_kind"] in ("full", "wrapped") and trace_reproduces(e.doc)
    ]
    # A per-step drift label and a reproducing trace cannot go together.
    assert not [e for e in reproducing if PER_STEP_KINDS & set(e.label["drift"])]
    kinds = Counter(k for e in runs for k in e.label["drift"])
    reasons = Counter(
        "no_trace"
        if e.label["trace_kind"] is None
        else "no_trajectories"
        if e.label["run_id"] in trace_only
        else f"{e.label['trace_kind']}_trace"
        for e in runs
        if e not in comparable
    )
    return {
        "runs": len(runs),
        "comparable_runs": len(comparable),
        "comparable_runs_with_drift": len(drifted),
        "runs_with_drift": sum(1 for e in runs if e.label["drift"]),
        "drift_rate": len(drifted) / len(comparable),
        "kinds": dict(kinds),
        "not_comparable": dict(reasons),
        "usable_trace_runs": len(has_trace),
        "dual_serialized_runs": len(dual),
        "reproducing_runs": len(reproducing),
    }

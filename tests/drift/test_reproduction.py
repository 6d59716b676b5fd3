"""The phase-1 reproduction check (pure): does the trace alone give back the trajectory steps?"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.conftest import Example
from tests.drift.helpers import clean_example, created
from tests.unit.test_drift_compare import GenStep, obs, set_state, simple_rollout
from tracestore.drift.rows import drift_rows, reproduction


def _trace_only(examples: list[Example]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    out = [
        (copy.deepcopy(e.doc), e.label["expected_steps"])
        for e in created(examples)
        if e.label["kind"] == "trace_only"
    ]
    assert out, "the examples have trace-only lines with expected_steps"
    return out


def _dual(doc: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """A trace-only line given back the trajectory its producer had (label expected_steps)."""
    return dict(doc, trajectories=[{"env_id": "e", "policy_id": "p", "steps": steps}])


def test_labelled_steps_are_reproduced_by_their_trace(examples: list[Example]) -> None:
    for doc, steps in _trace_only(examples):
        result = reproduction(_dual(doc, steps))
        assert (result.dual_serialized, result.reproduces, result.gap) == (True, True, None)


@pytest.mark.parametrize("field", ["obs", "reward", "done", "truncated", "tool_calls"])
def test_a_changed_field_is_the_gap(examples: list[Example], field: str) -> None:
    doc, steps = _trace_only(examples)[0]
    steps = copy.deepcopy(steps)
    k = len(steps) // 2
    step = steps[k]
    step[field] = {
        "obs": {"changed": True},
        "reward": float(step["reward"] or 0) + 1,
        "done": not step["done"],
        "truncated": not step["truncated"],
        "tool_calls": [{"tool_name": "other", "arguments": {}}],
    }[field]
    result = reproduction(_dual(doc, steps))
    assert (result.reproduces, result.gap) == (False, field)
    assert f"at position {k}" in (result.detail or "")


def test_a_missing_step_is_a_step_count_gap(examples: list[Example]) -> None:
    doc, steps = _trace_only(examples)[0]
    result = reproduction(_dual(doc, steps[:-1]))
    assert (result.reproduces, result.gap) == (False, "step_count")


def test_a_reward_within_tolerance_still_reproduces(examples: list[Example]) -> None:
    doc, steps = _trace_only(examples)[0]
    steps = copy.deepcopy(steps)
    steps[0]["reward"] = float(steps[0]["reward"] or 0) + 1e-12
    assert reproduction(_dual(doc, steps)).reproduces is True


def test_summary_trace_is_dual_but_cannot_reproduce(examples: list[Example]) -> None:
    doc = clean_example(examples, "crafter_compact", "summary")
    result = reproduction(doc)
    assert (result.dual_serialized, result.reproduces, result.gap) == (
        True,
        False,
        "summary_trace",
    )
    assert result.converter_version is None  # no conversion was attempted


def test_observation_messages_reproduce_the_obs(examples: list[Example]) -> None:
    # The Sokoban producer's wrapped trace has no system_state_before: its observations are
    # `observation` messages, which give the trajectories' obs back.
    doc = clean_example(examples, "sokoban", "wrapped")
    rows = drift_rows(doc)
    assert rows.findings == []
    assert (rows.check["reproduces"], rows.check["reproduce_gap"]) == (True, None)


def test_trace_without_observations_does_not_reproduce(examples: list[Example]) -> None:
    doc = copy.deepcopy(clean_example(examples, "sokoban", "wrapped"))
    session = doc["trace"]["session_trace"]
    for step in session["session_time_steps"]:
        step["markov_blanket_messages"] = [
            m for m in step["markov_blanket_messages"] if m["message_type"] != "observation"
        ]
    session["markov_blanket_message_history"] = [
        m for m in session["markov_blanket_message_history"] if m["message_type"] != "observation"
    ]
    rows = drift_rows(doc)
    # No observation anywhere in the trace: nothing to compare (no drift), nothing to give back.
    assert rows.findings == []
    assert (rows.check["reproduces"], rows.check["reproduce_gap"]) == (False, "obs")


def test_single_format_runs_are_not_dual(examples: list[Example]) -> None:
    legacy = next(e.doc for e in created(examples) if e.label["kind"] == "legacy_only")
    trace_only = _trace_only(examples)[0][0]
    for doc, usable in ((legacy, False), (trace_only, True)):
        check = drift_rows(doc).check
        assert (check["dual_serialized"], check["reproduces"]) == (False, None)
        assert check["usable_trace"] is usable


def test_a_boolean_given_back_as_a_number_is_not_reproduced() -> None:
    # The trace says 1 where the trajectory said true (obs), and true where it said 1
    # (a tool call's argument): as JSON values neither comes back (QA session 18, #3).
    doc = simple_rollout(
        GenStep(obs(0), calls=[("a", {"x": 1})], trace_source="message"),
        GenStep(obs(1), calls=[("a", {"confirm": True})], trace_source="message"),
    )
    steps = doc["trajectories"][0]["steps"]
    steps[0]["obs"] = {"door_open": True}
    set_state(doc, 0, {"door_open": 1})
    steps[1]["tool_calls"] = [{"tool_name": "a", "arguments": {"confirm": 1}}]
    result = reproduction(doc)
    assert (result.dual_serialized, result.reproduces, result.gap) == (True, False, "obs")
    assert result.detail == (
        "obs first differs at position 0; steps differing per field: obs 1, tool_calls 1"
    )

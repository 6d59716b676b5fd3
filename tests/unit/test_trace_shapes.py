"""Trace kinds, event-type inference, and each event/message placed once (SPEC §3)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import load_examples
from tracestore.wire.trace import classify_trace, infer_event_type, view_trace


@pytest.mark.parametrize(
    ("trace", "kind"),
    [
        (None, None),
        ({}, "empty"),
        ({"session_id": "s", "session_time_steps": []}, "full"),
        ({"event_history": []}, "full"),
        ({"version": 3, "session_trace": {"session_id": "s"}}, "wrapped"),
        ({"session_trace": {"created_at": None}}, "wrapped"),
        ({"session_id": "x", "events_count": 2, "lm_calls": []}, "summary"),
        ({"decision_rewards": [1.0]}, "summary"),
        ({"session_id": "s", "timesteps": [{"step_id": "a"}]}, "db_row"),
        ({"whatever": 1}, "unknown"),
        ([1, 2], "unknown"),
    ],
)
def test_classify(trace: Any, kind: str | None) -> None:
    assert classify_trace(trace) == kind


@pytest.mark.parametrize(
    ("event", "kind"),
    [
        ({"actions": [1], "reward": 1.0}, "runtime"),
        ({"reward": 0.0}, "environment"),
        ({"terminated": True}, "environment"),
        ({"truncated": False, "model_name": "m"}, "environment"),
        ({"model_name": "m"}, "lm_call"),
        ({"call_records": []}, "lm_call"),
        ({"provider": "p"}, "lm_call"),
        ({"system_instance_id": "x"}, "plain"),
        ({"event_type": "custom", "reward": 1.0}, "custom"),
    ],
)
def test_infer_event_type(event: dict[str, Any], kind: str) -> None:
    assert infer_event_type(event) == kind


def test_each_event_once_when_listed_twice() -> None:
    e0 = {"reward": 1.0, "metadata": {"step_id": "decision_0"}, "time_record": {"event_time": 1}}
    e1 = {"reward": 2.0, "metadata": {"step_id": "decision_1"}, "time_record": {"event_time": 2}}
    trace = {
        "event_history": [dict(e0), dict(e1)],
        "session_time_steps": [{"events": [dict(e0)]}, {"events": [dict(e1)]}],
    }
    view = view_trace(trace)
    assert [p.item["reward"] for p in view.events] == [1.0, 2.0]
    assert [(p.step_position, p.history_position) for p in view.events] == [(0, 0), (1, 1)]
    assert sum(e["reward"] for e in view.environment_events()) == 3.0


def test_steps_are_the_source_when_history_is_empty() -> None:
    trace = {"event_history": [], "session_time_steps": [{"events": [{"reward": 1.0}]}]}
    assert [(p.step_position, p.history_position) for p in view_trace(trace).events] == [(0, None)]


def test_history_only_events_are_kept() -> None:
    trace = {"event_history": [{"reward": 1.0}, {"reward": 2.0}], "session_time_steps": []}
    assert [p.history_position for p in view_trace(trace).events] == [0, 1]


def test_differing_copies_are_both_kept() -> None:
    trace = {
        "event_history": [{"reward": 1.0, "metadata": {"step_id": "a"}}],
        "session_time_steps": [{"events": [{"reward": 9.0, "metadata": {"step_id": "a"}}]}],
    }
    assert sorted(p.item["reward"] for p in view_trace(trace).events) == [1.0, 9.0]


def test_examples_environment_events_equal_label_steps() -> None:
    for ex in load_examples():
        if ex.label.get("trace_kind") not in ("full", "wrapped") or ex.label["kind"] == "retry":
            continue
        view = view_trace(ex.doc["trace"])
        n_env = len(list(view.environment_events()))
        history = view.session.get("event_history") or []
        # Every event of these producers appears twice and is kept once.
        assert len(view.events) == len(history)
        assert all(
            p.step_position is not None and p.history_position is not None for p in view.events
        )
        if not ex.doc["trajectories"]:
            assert n_env == ex.label["n_steps"]

"""serve_trace of a run whose stored trace has nothing in it (QA session 18, finding 5)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tracestore.convert import trace_to_trajectories
from tracestore.errors import NotFound
from tracestore.store.served import StoredRun, holds_nothing, serve_trace

RECEIVED = datetime(2025, 11, 20, 12, 0, tzinfo=UTC)
EMPTY_FULL: dict[str, Any] = {
    "session_id": "s",
    "created_at": None,
    "session_time_steps": [],
    "event_history": [],
    "markov_blanket_message_history": [],
    "metadata": {},
}
# Traces with nothing in them: `session_trace: null` (FORMAT.md §8: a wrapped, empty
# trace), a wrapped or full trace whose members are null or empty but for its ids.
EMPTY_TRACES: dict[str, Any] = {
    "wrapped_null": {"version": 3, "session_trace": None},
    "wrapped_empty_object": {"version": 3, "session_trace": {}},
    "wrapped_empty_full": {"version": 3, "session_trace": EMPTY_FULL},
    "full_empty": EMPTY_FULL,
    "full_nulls": {**EMPTY_FULL, "metadata": None, "session_metadata": None},
}


def _doc(trace: object, *, steps: int = 1) -> dict[str, Any]:
    return {
        "run_id": "run-empty-trace",
        "trajectories": [
            {
                "env_id": "e",
                "policy_id": "p",
                "steps": [
                    {"obs": {"k": k}, "tool_calls": [], "reward": 1.0, "done": k == steps - 1}
                    for k in range(steps)
                ],
            }
        ]
        if steps
        else [],
        "metrics": {"episode_returns": [float(steps)], "mean_return": 1.0, "num_steps": steps},
        "trace": trace,
    }


@pytest.mark.parametrize("name", list(EMPTY_TRACES))
def test_an_empty_trace_is_served_converted_from_the_trajectories(name: str) -> None:
    doc = _doc(EMPTY_TRACES[name], steps=2)
    served = serve_trace(doc, RECEIVED)
    assert served.source == "converted"
    assert served.conversion is not None
    assert len(served.data["session_time_steps"]) == 2
    assert trace_to_trajectories(served.data).data == doc["trajectories"]
    # Anything recorded is something: the same trace with it is served as stored.
    event = {"reward": 1.0, "terminated": True, "system_state_before": {"k": 0}}
    message = {"content": {"text": "hi"}, "message_type": "user"}
    for holds in (
        {"event_history": [event]},
        {"markov_blanket_message_history": [message]},
        {"session_time_steps": [{"step_id": "decision_0", "events": [event]}]},
        {"session_time_steps": [{"step_id": "decision_0", "events": []}]},
        {"metadata": {"env_name": "e"}},
    ):
        session = {**EMPTY_FULL, **holds}
        assert not holds_nothing(session)
        wrapped = "session_trace" in EMPTY_TRACES[name]
        trace = {"version": 3, "session_trace": session} if wrapped else session
        served = serve_trace(_doc(trace, steps=2), RECEIVED)
        assert (served.source, served.data) == ("stored", session)


def test_without_trajectories_an_empty_full_shape_is_served_and_no_shape_is_404() -> None:
    for name in ("wrapped_empty_full", "full_empty", "full_nulls"):
        trace = EMPTY_TRACES[name]
        served = serve_trace(_doc(trace, steps=0), RECEIVED)
        assert served.source == "stored"
        assert served.data == (EMPTY_FULL if name == "wrapped_empty_full" else trace)
    for name in ("wrapped_null", "wrapped_empty_object"):
        # `{}` and null are no trace: never served as one.
        with pytest.raises(NotFound, match="nothing in it"):
            serve_trace(_doc(EMPTY_TRACES[name], steps=0), RECEIVED)


def test_a_stored_run_with_an_empty_trace_is_charged_a_conversion() -> None:
    def run(kind: str | None, events: int, messages: int, trajectories: int) -> StoredRun:
        return StoredRun(b"{}", RECEIVED, kind, 1, trajectories, events, messages)

    # Whether serve_trace may convert, from the run row's columns: a trace without events
    # and messages may be empty (its metadata is not in the row), so it is charged so.
    assert run("wrapped", 0, 0, 1).converts("trace")
    assert run("full", 0, 0, 1).converts("trace")
    assert not run("wrapped", 0, 0, 0).converts("trace")
    assert not run("wrapped", 2, 0, 1).converts("trace")
    assert not run("full", 0, 1, 1).converts("trace")
    assert run("summary", 0, 0, 1).converts("trace")

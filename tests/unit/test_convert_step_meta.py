"""trajectories -> trace from a step's `info.meta`: the LM event's typed fields, and the
tool calls of a raw response the step did not make (QA session 18, findings 8 and 2)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tracestore.convert import convert_document, trace_to_trajectories, trajectories_to_trace
from tracestore.drift import compare_rollout
from tracestore.ingest.project import project_trace_document
from tracestore.wire.trace import infer_event_type, view_trace


def _doc(step: dict[str, Any]) -> dict[str, Any]:
    return {
        "run_id": "run-meta",
        "trajectories": [
            {
                "env_id": "e",
                "policy_id": "p",
                "steps": [step],
                "final": None,
                "length": 1,
                "inference_url": "",
            }
        ],
        "metrics": {"episode_returns": [1.0], "mean_return": 1.0, "num_steps": 1},
    }


def _step(meta: dict[str, Any], **over: Any) -> dict[str, Any]:
    step: dict[str, Any] = {
        "obs": {"x": 1},
        "tool_calls": [],
        "reward": 1.0,
        "done": True,
        "info": {"meta": meta},
    }
    step.update(over)
    return step


def _lm_event(trace: dict[str, Any]) -> dict[str, Any]:
    events: list[dict[str, Any]] = trace["event_history"]
    (event,) = [e for e in events if infer_event_type(e) == "lm_call"]
    return event


def _exact_round_trip(doc: dict[str, Any]) -> None:
    back = trace_to_trajectories(trajectories_to_trace(doc).data)
    assert back.method == "carry"
    # The JSON text, not only the value: `[]` and `null` differ, and so do 1 and 1.0.
    assert json.dumps(back.data) == json.dumps(doc["trajectories"])


# --- finding 8: what ingest refuses in a typed field is not written there -------------------


@pytest.mark.parametrize("latency", [True, False, "12", [12], {"ms": 12}])
def test_a_non_number_inference_ms_is_no_latency_and_is_reported(latency: object) -> None:
    doc = _doc(_step({"inference_ms": latency, "model": "m"}))
    conversion = trajectories_to_trace(doc)
    assert _lm_event(conversion.data)["latency_ms"] is None
    (entry,) = [e for e in conversion.losses if e.path.endswith("info.meta.inference_ms")]
    assert (entry.path, entry.kind) == (
        "trajectories[0].steps[*].info.meta.inference_ms",
        "carried",
    )
    # Carried (info is kept whole), so nothing is lost: the way back is exact.
    assert conversion.lossless
    _exact_round_trip(doc)
    # tracestore's own ingest takes the trace (it refused `latency_ms: true`).
    project_trace_document(conversion.data)


def test_token_counts_ingest_would_refuse_are_null_and_reported() -> None:
    usage = {"prompt_tokens": True, "completion_tokens": 2**70, "total_tokens": 2**63 - 1}
    doc = _doc(_step({"usage": usage, "inference_ms": 2**70, "model": "m"}))
    conversion = trajectories_to_trace(doc)
    lm = _lm_event(conversion.data)
    assert (lm["input_tokens"], lm["output_tokens"]) == (None, None)
    # What a typed field takes stays: a 64-bit count, and any number as the latency.
    assert (lm["total_tokens"], lm["latency_ms"]) == (2**63 - 1, 2**70)
    paths = {e.path for e in conversion.losses if e.kind == "carried" and "info.meta" in e.path}
    assert paths == {
        f"trajectories[0].steps[*].info.meta.usage.{key}"
        for key in ("prompt_tokens", "completion_tokens")
    }
    project_trace_document(conversion.data)
    _exact_round_trip(doc)


# --- finding 2: calls a raw response proposed that the step did not make --------------------

_RAW_RESPONSE = {
    "model": "m",
    "choices": [
        {
            "message": {
                "role": "assistant",
                "tool_calls": [
                    {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            }
        }
    ],
}
_META = {
    "inference_request": {"messages": [{"role": "user", "content": "hi"}]},
    "raw_response": _RAW_RESPONSE,
}


def _unmade_calls_doc(tool_calls: object) -> dict[str, Any]:
    # Two steps whose raw responses propose a call: the first made it, the second not.
    made = _step(copy.deepcopy(_META), tool_calls=[{"tool_name": "f", "arguments": {}}])
    step = _step(copy.deepcopy(_META), obs={"x": 2})
    if tool_calls == "absent":
        del step["tool_calls"]
    else:
        step["tool_calls"] = tool_calls
    doc = _doc(made)
    doc["trajectories"][0]["steps"].append(step)
    doc["metrics"] = {"episode_returns": [2.0], "mean_return": 2.0, "num_steps": 2}
    return doc


@pytest.mark.parametrize("tool_calls", [[], None, "absent"])
def test_a_step_without_calls_has_none_in_the_trace_when_its_raw_response_has_some(
    tool_calls: object,
) -> None:
    doc = _unmade_calls_doc(tool_calls)
    conversion = trajectories_to_trace(doc)
    assert conversion.lossless
    _exact_round_trip(doc)
    # Read as a producer's trace (no carry), as the drift check reads it: the step that
    # made the call has it, the other none, which is what each step says.
    made, unmade = view_trace(conversion.data).environment_steps()
    assert [c["tool_name"] for c in made.tool_calls or []] == ["f"]
    assert not unmade.tool_calls
    records = [
        e["call_records"][0]
        for e in conversion.data["event_history"]
        if infer_event_type(e) == "lm_call"
    ]
    assert [len(r["output_tool_calls"]) for r in records] == [1, 0]
    (entry,) = [e for e in conversion.losses if e.path.endswith("raw_response")]
    assert (entry.kind, entry.steps) == ("carried", (1,))


@pytest.mark.parametrize("tool_calls", [[], None, "absent"])
def test_the_converted_trace_does_not_drift_from_its_source(tool_calls: object) -> None:
    doc = _unmade_calls_doc(tool_calls)
    dual, _ = convert_document(doc, to="trace")
    comparison = compare_rollout(dual)
    assert comparison.comparable
    assert comparison.findings == []
    # Trace-only, it still gives the step back as it was (the drift check's phase 1).
    trace_only = {**dual, "trajectories": []}
    assert trace_to_trajectories(trace_only).data == doc["trajectories"]

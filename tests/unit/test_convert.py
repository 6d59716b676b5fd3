"""Tests for tracestore.convert: examples, the trace shape, loss reports, provenance."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from tracestore.convert import (
    CARRY_KEY,
    CONVERTER_VERSION,
    PROVENANCE_KEY,
    Conversion,
    convert_document,
    source_sha256,
    trace_to_trajectories,
    trajectories_to_trace,
)
from tracestore.drift import compare_rollout
from tracestore.toolcalls import normalize_tool_calls, trajectory_tool_call
from tracestore.wire.trace import classify_trace, infer_event_type, view_trace

# --------------------------------------------------------------------------- examples

EXAMPLES_DIR = Path(
    os.environ.get("TRACESTORE_EXAMPLES_DIR", Path(__file__).resolve().parents[2] / "examples")
)


def _load() -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    # A missing examples directory is a collection error, not a silent skip: these tests
    # are the converters' contact with real producer output.
    docs = (EXAMPLES_DIR / "rollouts.jsonl").read_bytes().splitlines()
    labels = (EXAMPLES_DIR / "labels.jsonl").read_bytes().splitlines()
    assert len(docs) == len(labels) > 0
    pairs = enumerate(zip(docs, labels, strict=True))
    return [(i, orjson.loads(d), orjson.loads(lab)) for i, (d, lab) in pairs]


EXAMPLES = _load()
STEP_DRIFT = ("reward_mismatch", "done_mismatch", "tool_calls_mismatch")
PER_STEP_FINDINGS = {
    "step_count_mismatch",
    "reward_mismatch",
    "done_mismatch",
    "truncated_mismatch",
    "obs_mismatch",
    "tool_calls_mismatch",
}


def _ids(cases: list[tuple[int, dict[str, Any], dict[str, Any]]]) -> list[str]:
    return [f"line{i}-{label['kind']}" for i, _, label in cases]


def _select(pred: Any) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    return [case for case in EXAMPLES if pred(case[2], case[1])]


ALL = EXAMPLES
WITH_TRAJECTORIES = _select(lambda lab, doc: bool(doc["trajectories"]))
CLEAN_CRAFTER = _select(
    lambda lab, doc: (
        lab["kind"] == "crafter" and lab.get("trace_kind") == "full" and lab.get("drift") == []
    )
)
DRIFTED = [
    (case, kind)
    for case in EXAMPLES
    for kind in case[2].get("drift") or []
    if kind in STEP_DRIFT and case[2]["kind"] == "crafter"
]
TRACE_ONLY = _select(lambda lab, doc: lab["kind"] == "trace_only")
NOT_CONVERTIBLE = _select(lambda lab, doc: classify_trace(doc["trace"]) not in ("full", "wrapped"))
FULL_OR_WRAPPED = _select(lambda lab, doc: classify_trace(doc["trace"]) in ("full", "wrapped"))
SOKOBAN = _select(lambda lab, doc: lab["kind"] == "sokoban")


def test_example_selections_are_not_empty() -> None:
    # Guards the parametrizations below against a label format change selecting nothing.
    assert len(CLEAN_CRAFTER) >= 10
    assert {kind for _, kind in DRIFTED} == set(STEP_DRIFT)
    assert len(TRACE_ONLY) >= 5
    assert len(SOKOBAN) >= 3
    assert any(classify_trace(doc["trace"]) is None for _, doc, _ in NOT_CONVERTIBLE)
    assert any(classify_trace(doc["trace"]) == "summary" for _, doc, _ in NOT_CONVERTIBLE)


def _steps(trajectories: list[Any]) -> list[Any]:
    return [step for t in trajectories for step in t["steps"]]


def _view(step: Mapping[str, Any]) -> dict[str, Any]:
    """The fields SPEC §6 compares, in the form it compares them."""
    return {
        "obs": step.get("obs"),
        "reward": float(step.get("reward") or 0),
        "done": bool(step.get("done")),
        "truncated": bool(step.get("truncated")),
        "tool_calls": normalize_tool_calls(step.get("tool_calls")),
    }


@pytest.mark.parametrize(("i", "doc", "label"), ALL, ids=_ids(ALL))
def test_round_trip_law_on_every_example(i: int, doc: dict[str, Any], label: Any) -> None:
    trace = trajectories_to_trace(doc)
    back = trace_to_trajectories(trace.data)
    assert back.method == "carry"
    assert back.losses == []
    assert back.data == doc["trajectories"]
    # Same key order and number types too: the JSON text is identical.
    assert orjson.dumps(back.data) == orjson.dumps(doc["trajectories"])
    assert all(PROVENANCE_KEY not in t for t in back.data)


@pytest.mark.parametrize(("i", "doc", "label"), CLEAN_CRAFTER, ids=_ids(CLEAN_CRAFTER))
def test_clean_crafter_trace_gives_stored_trajectories(
    i: int, doc: dict[str, Any], label: Any
) -> None:
    conv = trace_to_trajectories(doc)
    assert conv.method == "trace"
    (traj,) = conv.data
    stored = doc["trajectories"][0]
    assert [_view(s) for s in traj["steps"]] == [_view(s) for s in stored["steps"]]
    assert traj["length"] == len(stored["steps"]) == label["n_steps"]
    assert traj["final"] == stored["final"]
    assert (traj["env_id"], traj["policy_id"]) == (stored["env_id"], stored["policy_id"])
    assert traj["trace_correlation_id"] == label["correlation_id"]


@pytest.mark.parametrize(("case", "kind"), DRIFTED, ids=[f"line{c[0]}-{k}" for c, k in DRIFTED])
def test_drifted_line_differs_on_its_labelled_field(case: Any, kind: str) -> None:
    _, doc, _ = case
    (traj,) = trace_to_trajectories(doc).data
    field = {
        "reward_mismatch": "reward",
        "done_mismatch": "done",
        "tool_calls_mismatch": "tool_calls",
    }[kind]
    converted = [_view(s)[field] for s in traj["steps"]]
    stored = [_view(s)[field] for s in _steps(doc["trajectories"])]
    assert converted != stored


@pytest.mark.parametrize(("i", "doc", "label"), TRACE_ONLY, ids=_ids(TRACE_ONLY))
def test_trace_only_line_gives_expected_steps(i: int, doc: dict[str, Any], label: Any) -> None:
    conv = trace_to_trajectories(doc)
    (traj,) = conv.data
    expected = label["expected_steps"]
    got = [
        {
            "obs": s["obs"],
            "reward": s["reward"],
            "done": s["done"],
            "truncated": s["truncated"],
            "tool_calls": normalize_tool_calls(s["tool_calls"]),
        }
        for s in traj["steps"]
    ]
    want = [{**e, "tool_calls": normalize_tool_calls(e["tool_calls"])} for e in expected]
    assert got == want
    assert traj["trace_correlation_id"] == label["correlation_id"]
    assert traj["inference_url"] == doc["pipeline_metadata"]["inference_url"]


@pytest.mark.parametrize(("i", "doc", "label"), NOT_CONVERTIBLE, ids=_ids(NOT_CONVERTIBLE))
def test_summary_and_null_traces_give_no_trajectories(
    i: int, doc: dict[str, Any], label: Any
) -> None:
    conv = trace_to_trajectories(doc)
    assert conv.data == []
    assert conv.method == "none"
    (entry,) = conv.losses
    assert entry.path == "trace"
    assert entry.kind == "lost"
    kind = classify_trace(doc["trace"])
    assert ("null" if kind is None else kind) in entry.detail


@pytest.mark.parametrize(("i", "doc", "label"), SOKOBAN, ids=_ids(SOKOBAN))
def test_wrapped_hand_built_trace(i: int, doc: dict[str, Any], label: Any) -> None:
    conv = trace_to_trajectories(doc)
    (traj,) = conv.data
    stored = doc["trajectories"][0]["steps"]
    for got, want in zip(traj["steps"], stored, strict=True):
        # Observations come from the `observation` messages (no system_state_before here).
        assert _view(got) == _view(want)
        # This producer keeps the step's info in the event metadata: recovered, not lost,
        # with the meta a trainer reads added (inference URL from the envelope).
        assert {k: v for k, v in got["info"].items() if k != "meta"} == want["info"]
        assert got["info"]["meta"]["inference_url"] == traj["inference_url"] != ""
    paths = {(e.path, e.kind) for e in conv.losses}
    assert not any(e.path.endswith(".obs") for e in conv.losses)
    assert not any(e.path.endswith(".info") for e in conv.losses)
    assert traj["env_id"] == "sokoban"  # from metadata.env_name
    assert ("trajectories[0].env_id", "default") in paths


# ----------------------------------------------------------------- the trace we produce


@pytest.mark.parametrize(("i", "doc", "label"), WITH_TRAJECTORIES, ids=_ids(WITH_TRAJECTORIES))
def test_produced_trace_has_the_producer_shape(i: int, doc: dict[str, Any], label: Any) -> None:
    trace = trajectories_to_trace(doc).data
    steps = _steps(doc["trajectories"])
    assert classify_trace(trace) == "full"
    assert trace["session_id"] == trace["metadata"]["run_id"] == doc["run_id"]
    view = view_trace(trace)
    assert len(view.time_steps) == len(steps)
    # Each event and message is in its time step and in the history list, paired once.
    for placed in [*view.events, *view.messages]:
        assert placed.step_position is not None
        assert placed.history_position is not None
        sid = placed.item["metadata"]["step_id"]
        assert view.time_steps[placed.step_position]["step_id"] == sid
    envs = list(view.environment_events())
    assert len(envs) == len(steps)
    for k, (time_step, event, step) in enumerate(zip(view.time_steps, envs, steps, strict=True)):
        assert time_step["step_id"] == f"decision_{k}"
        assert time_step["step_index"] == k
        assert infer_event_type(event) == "environment"
        assert event["system_state_before"] == step["obs"]
        assert event["reward"] == float(step["reward"] or 0)
        assert event["terminated"] is bool(step["done"])
        assert event["truncated"] is bool(step["truncated"])
        # A user message (the observation stands in for the prompt), then the tool calls.
        user, assistant = time_step["markov_blanket_messages"]
        prompt = orjson.loads(user["content"]["json_payload"])
        obs = step["obs"]
        text = obs["text"] if isinstance(obs.get("text"), str) else orjson.dumps(obs).decode()
        assert prompt == {"role": "user", "content": text}
        assert user["metadata"]["tracestore_stand_in"] == "obs"
        assert assistant["metadata"]["is_tool_call"] is True
        payload = assistant["content"]["json_payload"]
        assert isinstance(payload, str)
        # Arguments are JSON text in a trace, written as the producer writes them.
        expected = [
            {**c, "arguments": json.dumps(c["arguments"])}
            if isinstance(c.get("arguments"), dict)
            else c
            for c in step["tool_calls"]
        ]
        assert orjson.loads(payload) == {"role": "assistant", "tool_calls": expected}
        assert normalize_tool_calls(expected) == normalize_tool_calls(step["tool_calls"])
        # The LM call the step's info.meta describes: its usage and timing.
        lm_events = [e for e in time_step["events"] if infer_event_type(e) == "lm_call"]
        meta = (step.get("info") or {}).get("meta") or {}
        usage = meta.get("usage") or {}
        if usage or "inference_ms" in meta:
            (lm,) = lm_events
            assert lm["input_tokens"] == usage.get("prompt_tokens")
            assert lm["output_tokens"] == usage.get("completion_tokens")
            assert lm["total_tokens"] == usage.get("total_tokens")
            assert lm["latency_ms"] == meta.get("inference_ms")
        else:
            assert lm_events == []
    assert trace["metadata"]["env_name"] == doc["trajectories"][0]["env_id"]
    assert trace["metadata"]["policy_name"] == doc["trajectories"][0]["policy_id"]
    for traj_steps, traj in [(t["steps"], t) for t in doc["trajectories"]]:
        if traj_steps:
            first = steps.index(traj_steps[0]) if traj_steps else 0
            afters = [e["system_state_after"] for e in envs[first : first + len(traj_steps)]]
            final = traj["final"]["observation"] if traj["final"] else None
            assert afters == [s["obs"] for s in traj_steps[1:]] + [final]


@pytest.mark.parametrize(("i", "doc", "label"), WITH_TRAJECTORIES, ids=_ids(WITH_TRAJECTORIES))
def test_produced_trace_shows_no_drift(i: int, doc: dict[str, Any], label: Any) -> None:
    new_doc, _ = convert_document(doc, to="trace", replace=True)
    comparison = compare_rollout(new_doc)
    assert comparison.comparable
    assert not comparison.kinds & PER_STEP_FINDINGS


@pytest.mark.parametrize(("i", "doc", "label"), WITH_TRAJECTORIES, ids=_ids(WITH_TRAJECTORIES))
def test_produced_trace_read_as_a_producer_trace(i: int, doc: dict[str, Any], label: Any) -> None:
    trace = trajectories_to_trace(doc).data
    # Without the carry, the trace alone must still say what the trajectories said.
    stripped = {**trace, "metadata": {k: v for k, v in trace["metadata"].items() if k != CARRY_KEY}}
    conv = trace_to_trajectories(stripped)
    assert conv.method == "trace"
    (traj,) = conv.data
    assert [_view(s) for s in traj["steps"]] == [_view(s) for s in _steps(doc["trajectories"])]


@pytest.mark.parametrize(("i", "doc", "label"), FULL_OR_WRAPPED, ids=_ids(FULL_OR_WRAPPED))
def test_converted_trajectories_show_no_drift(i: int, doc: dict[str, Any], label: Any) -> None:
    new_doc, _ = convert_document(doc, to="trajectories", replace=True)
    comparison = compare_rollout(new_doc)
    assert comparison.comparable
    assert not comparison.kinds & PER_STEP_FINDINGS


def test_created_at_is_taken_from_the_document_and_deterministic() -> None:
    _, doc, _ = CLEAN_CRAFTER[0]
    first = trajectories_to_trace(doc)
    assert first.data["created_at"] == doc["trace"]["created_at"]
    assert orjson.dumps(trajectories_to_trace(doc).data) == orjson.dumps(first.data)
    legacy = {**doc, "trace": None}
    conv = trajectories_to_trace(legacy)
    assert conv.data["created_at"] is None
    assert "trace.created_at" in {e.path for e in conv.losses if e.kind == "missing"}
    # Nothing of the source is lost: an absent creation time does not make it lossy.
    assert conv.lossless
    given = trajectories_to_trace(legacy, created_at="2025-11-20T12:00:00+00:00")
    assert given.data["created_at"] == "2025-11-20T12:00:00+00:00"
    assert "trace.created_at" in {e.path for e in given.losses if e.kind == "stand_in"}
    # The document's own creation time wins over a given one.
    assert (
        trajectories_to_trace(doc, created_at="2000-01-01").data["created_at"]
        == (doc["trace"]["created_at"])
    )
    wrapped = {**doc, "trace": {"session_trace": {"created_at": "2025-11-20 11:59:59+00:00"}}}
    assert trajectories_to_trace(wrapped).data["created_at"] == "2025-11-20 11:59:59+00:00"
    garbage = {**doc, "trace": {"created_at": "not a date", "events_count": 0}}
    assert trajectories_to_trace(garbage).data["created_at"] is None


# ---------------------------------------------------------------- hand-built documents


def _step(k: int, **over: Any) -> dict[str, Any]:
    step: dict[str, Any] = {
        "obs": {"k": k},
        "tool_calls": [{"tool_name": "act", "arguments": {"a": k}}],
        "reward": float(k),
        "done": False,
        "truncated": False,
        "info": {"i": k},
    }
    step.update(over)
    return step


def _traj(n: int, **over: Any) -> dict[str, Any]:
    traj: dict[str, Any] = {
        "env_id": "env-a",
        "policy_id": "pol-a",
        "steps": [_step(k) for k in range(n)],
        "final": {"observation": {"k": n}},
        "length": n,
        "inference_url": "https://h/v1/chat?cid=trace_a",
        "decision_samples": None,
    }
    traj.update(over)
    return traj


def _doc(*trajectories: Any, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "run_id": "run-x",
        "trajectories": list(trajectories),
        "metrics": {"episode_returns": [0.0], "mean_return": 0.0, "num_steps": 0},
        "trace_correlation_id": None,
        "trace": None,
        "pipeline_metadata": {},
    }
    doc.update(over)
    return doc


def _round_trip(doc: Mapping[str, Any]) -> Conversion[list[Any]]:
    back = trace_to_trajectories(trajectories_to_trace(doc).data)
    assert back.method == "carry"
    assert back.data == doc["trajectories"]
    # Same key order and number types: the JSON text is identical (stdlib: ints > 64 bits).
    assert json.dumps(back.data) == json.dumps(doc["trajectories"])
    return back


def test_producer_trace_loss_report_and_provenance() -> None:
    _, doc, _ = CLEAN_CRAFTER[0]
    conv = trace_to_trajectories(doc)
    lost = {e.path: e for e in conv.losses if e.kind == "lost"}
    info = lost["trajectories[0].steps[*].info"]
    assert info.count == len(conv.data[0]["steps"])
    assert info.steps is None  # every step
    assert "trajectories[0].decision_samples" in lost
    expected = hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert conv.provenance.source_sha256 == expected
    assert conv.provenance.converter == "trace_to_trajectories"
    assert conv.provenance.converter_version == CONVERTER_VERSION
    assert conv.data[0][PROVENANCE_KEY] == conv.provenance.as_dict()
    report = conv.report()
    assert report["lossless"] is False
    assert orjson.loads(orjson.dumps(report)) == report


def test_trace_provenance_is_embedded_and_hashes_the_source() -> None:
    doc = _doc(_traj(2))
    conv = trajectories_to_trace(doc)
    expected = hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert conv.provenance.source_sha256 == expected == source_sha256(doc)
    assert conv.data["metadata"][PROVENANCE_KEY] == {
        "converter": "trajectories_to_trace",
        "converter_version": CONVERTER_VERSION,
        "source_sha256": expected,
    }
    # A bare trace's provenance hashes the trace itself.
    trace = conv.data
    assert trace_to_trajectories(trace).provenance.source_sha256 == source_sha256(trace)


def test_null_reward_and_truncated_are_defaults_in_the_trace_and_come_back() -> None:
    steps = [_step(0, reward=None, truncated=None), _step(1, reward=1), _step(2)]
    doc = _doc(_traj(3, steps=steps))
    conv = trajectories_to_trace(doc)
    events = conv.data["event_history"]
    assert [e["reward"] for e in events] == [0.0, 1.0, 2.0]
    assert all(type(e["reward"]) is float for e in events)
    assert events[0]["truncated"] is False
    by_path = {e.path: e for e in conv.losses}
    assert by_path["trajectories[0].steps[*].reward"].steps == (0,)
    assert by_path["trajectories[0].steps[*].truncated"].detail.startswith("null")
    back = _round_trip(doc)
    assert back.data[0]["steps"][0]["reward"] is None
    assert back.data[0]["steps"][0]["truncated"] is None
    assert type(back.data[0]["steps"][1]["reward"]) is int


def test_several_trajectories_are_concatenated_and_split_back() -> None:
    doc = _doc(_traj(2), _traj(0, final=None), _traj(3, env_id="env-b", extra=[1]))
    trace = trajectories_to_trace(doc).data
    ids = [ts["step_id"] for ts in trace["session_time_steps"]]
    assert ids == [f"decision_{k}" for k in range(5)]
    assert [ts["turn_number"] for ts in trace["session_time_steps"]] == [0, 1, 0, 1, 2]
    carries = [e["metadata"][CARRY_KEY] for e in trace["event_history"]]
    assert [(c["trajectory"], c["step"]) for c in carries] == [
        (0, 0),
        (0, 1),
        (2, 0),
        (2, 1),
        (2, 2),
    ]
    entries = trace["metadata"][CARRY_KEY]["trajectories"]
    assert [e["n_steps"] for e in entries] == [2, 0, 3]
    # The state after a trajectory's last step is its own final, never the next one's obs.
    assert trace["event_history"][1]["system_state_after"] == {"k": 2}
    assert trace["event_history"][1]["system_state_before"] == {"k": 1}
    assert trace["metadata"]["env_id"] == "env-a"
    assert trace["event_history"][2]["system_instance_id"] == "environment:env-b"
    _round_trip(doc)


def test_absent_and_odd_keys_survive() -> None:
    step = {"reward": 0.5, "obs": {"x": "\u0000"}, "done": 1, "logprob": -0.1}  # no tool_calls
    odd = {
        "steps": [step, _step(1, tool_calls=[]), _step(2, tool_calls=None, info=None)],
        "policy_id": None,
        "length": 7,
        "final": {"observation": None, "reward": 3},
        "trace_correlation_id": "trace_z",
    }
    doc = _doc(_traj(1), odd, "not a trajectory", _traj(1, steps=["not a step"]))
    trace = trajectories_to_trace(doc).data
    first_odd = trace["session_time_steps"][1]
    # No tool_calls key: no assistant message, only the observation's user message.
    assert [m["message_type"] for m in first_odd["markov_blanket_messages"]] == ["user"]
    assert first_odd["events"][0]["terminated"] is True
    back = _round_trip(doc)
    assert "tool_calls" not in back.data[1]["steps"][0]
    assert list(back.data[1]["steps"][0]) == ["reward", "obs", "done", "logprob"]


def test_arguments_beyond_64_bits_survive() -> None:
    doc = _doc(_traj(1, steps=[_step(0, tool_calls=[{"tool": "t", "args": {"n": 2**70}}])]))
    trace = trajectories_to_trace(doc).data
    (assistant,) = [
        m for m in trace["markov_blanket_message_history"] if m["message_type"] == "assistant"
    ]
    assert str(2**70) in assistant["content"]["json_payload"]
    _round_trip(doc)


def test_a_changed_carry_falls_back_to_reading_the_trace() -> None:
    doc = _doc(_traj(3))
    trace = copy.deepcopy(trajectories_to_trace(doc).data)
    dropped = trace["session_time_steps"].pop()
    trace["event_history"].remove(dropped["events"][0])
    conv = trace_to_trajectories(trace)
    assert conv.method == "trace"
    assert any(e.path == f"trace.metadata.{CARRY_KEY}" for e in conv.losses)
    assert len(conv.data[0]["steps"]) == 2


# ------------------------------------------------------------------- producer traces


def _event(sid: str | None, **keys: Any) -> dict[str, Any]:
    meta = {"step_id": sid} if sid is not None else {}
    return {
        "system_instance_id": "env",
        "time_record": {"event_time": 1.0},
        "metadata": meta,
        **keys,
    }


def _message(sid: str, calls: list[Any]) -> dict[str, Any]:
    payload = orjson.dumps({"role": "assistant", "tool_calls": calls}).decode()
    return {
        "content": {"text": None, "json_payload": payload},
        "message_type": "assistant",
        "time_record": {"event_time": 1.0},
        "metadata": {"step_id": sid, "is_tool_call": True},
    }


def _lm(sid: str, calls: list[Any]) -> dict[str, Any]:
    return _event(sid, model_name="m", call_records=[{"output_tool_calls": calls}])


def _time_step(k: int, events: list[Any], messages: list[Any]) -> dict[str, Any]:
    return {
        "step_id": f"decision_{k}",
        "step_index": k,
        "events": events,
        "markov_blanket_messages": messages,
    }


def test_tool_call_sources_in_spec_order() -> None:
    msg = [{"tool_name": "from_message", "arguments": "{}"}]
    rec = [{"name": "from_record", "arguments_json": "{}"}]
    meta = [{"tool": "from_metadata", "args": {}}]

    def env(sid: str) -> dict[str, Any]:
        event = _event(sid, reward=1, terminated=False, system_state_before={"s": sid})
        event["metadata"]["tool_calls"] = meta
        return event

    steps = [
        _time_step(0, [_lm("decision_0", rec), env("decision_0")], [_message("decision_0", msg)]),
        _time_step(1, [_lm("decision_1", rec), env("decision_1")], [_message("decision_1", [])]),
        _time_step(2, [env("decision_2")], []),
        _time_step(3, [_event("decision_3", reward=0.0)], []),
    ]
    trace = {"session_time_steps": steps, "event_history": [], "metadata": {"env_id": "e"}}
    conv = trace_to_trajectories(trace)
    got = [s["tool_calls"] for s in conv.data[0]["steps"]]
    # One shape whatever the source's dialect; an empty message list falls through.
    assert got == [[trajectory_tool_call(c) for c in x] for x in (msg, rec, meta, [])]
    assert got[1] == [{"tool_name": "from_record", "arguments": {}}]
    defaults = {e.path: e for e in conv.losses if e.kind == "default"}
    assert defaults["trajectories[0].steps[*].tool_calls"].steps == (3,)
    assert conv.data[0]["steps"][0]["reward"] == 1.0
    assert type(conv.data[0]["steps"][0]["reward"]) is float


def test_history_only_and_steps_only_traces() -> None:
    events = [
        _event("decision_0", reward=0.0, terminated=False, system_state_before={"a": 0}),
        _event("decision_1", reward=1.0, terminated=True, system_state_before={"a": 1}),
    ]
    history_only = {"event_history": events, "metadata": {}}
    steps_only = {
        "session_time_steps": [_time_step(k, [e], []) for k, e in enumerate(events)],
        "event_history": [],
    }
    duplicated = {**steps_only, "event_history": copy.deepcopy(events)}
    for trace in (history_only, steps_only, duplicated):
        (traj,) = trace_to_trajectories(trace).data
        assert [s["obs"] for s in traj["steps"]] == [{"a": 0}, {"a": 1}]
        assert [s["done"] for s in traj["steps"]] == [False, True]
        assert traj["final"] is None


def test_bare_trace_uses_the_envelope_argument() -> None:
    _, doc, label = TRACE_ONLY[0]
    bare = trace_to_trajectories(doc["trace"])
    assert "trace_correlation_id" not in bare.data[0]
    assert bare.data[0]["inference_url"] == ""
    assert any(e.path == "trajectories[0].inference_url" for e in bare.losses)
    with_env = trace_to_trajectories(doc["trace"], envelope=doc)
    assert with_env.data[0]["trace_correlation_id"] == label["correlation_id"]
    url = with_env.data[0]["inference_url"]
    assert url == doc["pipeline_metadata"]["inference_url"]
    for plain, enveloped in zip(bare.data[0]["steps"], with_env.data[0]["steps"], strict=True):
        # The envelope lends each step's info.meta its inference URL; nothing else differs.
        assert "inference_url" not in plain["info"]["meta"]
        assert enveloped["info"]["meta"].pop("inference_url") == url
        assert enveloped == plain


def test_trace_without_environment_events() -> None:
    trace = {"session_time_steps": [_time_step(0, [_lm("decision_0", [])], [])]}
    conv = trace_to_trajectories(trace)
    assert conv.data == []
    assert conv.method == "none"
    assert [e.path for e in conv.losses] == ["trace"]
    assert trace_to_trajectories({"session_trace": None, "version": 3}).data == []


# ------------------------------------------------------------------- whole documents


def test_convert_document_both_ways_without_touching_the_input() -> None:
    _, doc, _ = CLEAN_CRAFTER[0]
    before = source_sha256(doc)
    with_trace, conv = convert_document(doc, to="trace", replace=True)
    assert with_trace["trace"] is conv.data
    assert with_trace["trajectories"] is doc["trajectories"]
    assert conv.action == "replaced"
    assert any(e.kind == "replaced" and e.path == "trace" for e in conv.losses)
    again, back = convert_document({**with_trace, "trajectories": []}, to="trajectories")
    assert (back.method, back.action) == ("carry", "filled")
    assert again["trajectories"] == doc["trajectories"]
    assert not any(e.kind == "replaced" for e in back.losses)
    _, replaced = convert_document(doc, to="trajectories", replace=True)
    assert any(e.kind == "replaced" and e.path == "trajectories" for e in replaced.losses)
    assert source_sha256(doc) == before
    with pytest.raises(ValueError, match="unknown conversion target"):
        convert_document(doc, to="parquet")


@pytest.mark.parametrize("to", ["trace", "trajectories"])
def test_by_default_a_part_the_document_has_is_kept(to: str) -> None:
    _, doc, _ = CLEAN_CRAFTER[0]
    new_doc, conv = convert_document(doc, to=to)
    assert new_doc == doc
    assert new_doc[to] is doc[to]
    assert (conv.action, conv.method, conv.losses) == ("kept", "none", [])
    assert "kept as sent" in conv.warnings[0]
    assert conv.report()["warnings"] == list(conv.warnings)


def test_a_conversion_that_gives_nothing_never_replaces_a_real_part() -> None:
    # Trajectories with a summary trace: the trace gives no trajectories, replace or not.
    _, summary_doc, _ = next(x for x in ALL if x[2].get("trace_kind") == "summary")
    for replace in (False, True):
        new_doc, conv = convert_document(summary_doc, to="trajectories", replace=replace)
        assert new_doc["trajectories"] == summary_doc["trajectories"] != []
        assert conv.action == "kept"
    # A trace-only rollout: its empty trajectories make no trace; its real one is kept.
    _, trace_only, _ = TRACE_ONLY[0]
    new_doc, to_trace = convert_document(trace_only, to="trace", replace=True)
    assert new_doc["trace"] is trace_only["trace"]
    assert to_trace.action == "kept"
    assert "no steps" in to_trace.warnings[0]
    # Filling a missing part from a source with nothing: empty, and said.
    legacy_empty = {**trace_only, "trace": None}
    filled, to_trace = convert_document(legacy_empty, to="trace")
    assert filled["trace"]["session_time_steps"] == []
    assert (to_trace.action, bool(to_trace.warnings)) == ("filled", True)


def test_a_legacy_only_rollout_converts_losslessly() -> None:
    _, doc, _ = next(x for x in ALL if x[2]["kind"] == "legacy_only")
    new_doc, conv = convert_document(doc, to="trace", created_at="2025-11-20T12:00:00+00:00")
    assert conv.action == "filled"
    assert conv.lossless, conv.report()["losses"]
    assert new_doc["trace"]["created_at"] == "2025-11-20T12:00:00+00:00"


@pytest.mark.parametrize(("i", "doc", "label"), ALL[:12], ids=_ids(ALL[:12]))
def test_converters_do_not_mutate_their_input(i: int, doc: dict[str, Any], label: Any) -> None:
    before = orjson.dumps(doc)
    trace = trajectories_to_trace(doc).data
    trace_bytes = orjson.dumps(trace)
    trace_to_trajectories(doc)
    trace_to_trajectories(trace)
    assert orjson.dumps(doc) == before
    assert orjson.dumps(trace) == trace_bytes


def test_a_kept_model_request_gives_the_real_prompts_and_call_record() -> None:
    # The grpo-crafter task app keeps each step's model request and raw response in info.
    meta = {
        "inference_url": "http://h/v1/chat/completions?cid=c1",
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        "inference_ms": 12,
        "inference_request": {
            "messages": [
                {"role": "system", "content": "You play Crafter."},
                {"role": "user", "content": [{"type": "text", "text": "You see grass."}]},
            ]
        },
        "raw_response": {
            "id": "chatcmpl-1",
            "model": "qwen-stub",
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_0",
                                "type": "function",
                                "function": {"name": "act", "arguments": '{"a": 1}'},
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        },
    }
    doc = _doc(_traj(1, steps=[_step(0, info={"meta": meta})]))
    conv = trajectories_to_trace(doc)
    (time_step,) = conv.data["session_time_steps"]
    kinds = [m["message_type"] for m in time_step["markov_blanket_messages"]]
    assert kinds == ["system", "user", "assistant"]
    user = orjson.loads(time_step["markov_blanket_messages"][1]["content"]["json_payload"])
    assert user == {"role": "user", "content": "You see grass."}
    (lm,) = [e for e in time_step["events"] if infer_event_type(e) == "lm_call"]
    assert (lm["model_name"], lm["input_tokens"], lm["latency_ms"]) == ("qwen-stub", 7, 12)
    (record,) = lm["call_records"]
    assert record["output_tool_calls"] == [
        {"name": "act", "arguments_json": '{"a": 1}', "call_id": "call_0", "index": 0}
    ]
    assert [m["role"] for m in record["input_messages"]] == ["system", "user"]
    assert conv.data["metadata"]["model"] == "qwen-stub"
    # The prompts are real: no stand-in entry; the round trip is still exact.
    assert not any(e.kind == "stand_in" for e in conv.losses)
    assert conv.lossless
    assert trace_to_trajectories(conv.data).data == doc["trajectories"]

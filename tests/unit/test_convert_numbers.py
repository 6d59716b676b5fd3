"""Numbers in conversions: integers whole, fractions no double holds reported (QA session 18,
finding 1)."""

from __future__ import annotations

import json
from typing import Any

from tracestore.convert import convert_document, trace_to_trajectories
from tracestore.convert.numbers import report_rounded
from tracestore.jsontext import RoundedFloat, dumps, loads_whole

BIG = 123456789012345678901234567891  # past 64 bits, and no double holds it
ODD = 2**70 + 1  # past 64 bits and past a double's 53-bit mantissa


def _raw(tiny: str = "1e-400") -> bytes:
    return (
        '{"run_id":"run-n","trajectories":[{"env_id":"e","policy_id":"p","steps":[{"obs":'
        f'{{"id":{BIG},"tiny":{tiny},"half":0.5}},"tool_calls":[{{"tool_name":"t","arguments":'
        f'{{"n":{BIG}}}}}],"reward":{ODD},"done":true}}]}}],"metrics":{{"episode_returns":'
        f'[{tiny}],"mean_return":0.0,"num_steps":1}},"pipeline_metadata":{{"seed":{BIG}}}}}'
    ).encode()


def test_loads_whole_keeps_integers_and_marks_only_what_a_double_cannot_hold() -> None:
    value = loads_whole(b"[123456789012345678901234567891, 1e-400, 0.1, 1.50, 1E5, -0.0, 2.5e-8]")
    assert value[0] == BIG
    assert type(value[0]) is int
    assert isinstance(value[1], RoundedFloat)
    assert value[1].text == "1e-400"
    assert value[1] == 0.0
    assert [type(v) for v in value[2:]] == [float] * 5
    # Written by the standard library (orjson writes no integer past 64 bits), exactly.
    assert json.loads(dumps(value)) == [BIG, 0.0, 0.1, 1.5, 1e5, -0.0, 2.5e-8]
    assert dumps(value).startswith(b"[123456789012345678901234567891,0.0,")


def test_integers_past_a_double_stay_whole_through_both_converters() -> None:
    doc = loads_whole(_raw("0.25"))
    new_doc, conversion = convert_document(doc, to="trace")
    trace = new_doc["trace"]
    (event,) = trace["event_history"]
    assert event["reward"] == ODD
    assert type(event["reward"]) is int
    assert event["system_state_before"]["id"] == BIG
    assert trace["metadata"]["seed"] == BIG
    assert report_rounded(conversion, new_doc) is conversion  # nothing rounded
    assert conversion.lossless
    text = dumps(new_doc).decode()
    assert str(float(BIG)) not in text
    assert str(float(ODD)) not in text
    # The way back, through the carry and reading the trace as a producer's.
    back = trace_to_trajectories(trace)
    assert json.dumps(back.data) == json.dumps(doc["trajectories"])
    lm = {"model_name": "m", "latency_ms": ODD, "input_tokens": 3}
    producer = {
        "session_time_steps": [
            {"step_id": "decision_0", "events": [lm, {**event, "metadata": {}}]}
        ],
        "metadata": {},
    }
    (step,) = trace_to_trajectories(producer).data[0]["steps"]
    assert step["reward"] == ODD
    assert type(step["reward"]) is int
    assert step["obs"]["id"] == BIG
    assert step["info"]["meta"]["inference_ms"] == ODD


def test_a_number_no_double_holds_is_a_loss_wherever_the_output_writes_it() -> None:
    doc = loads_whole(_raw())
    new_doc, conversion = convert_document(doc, to="trace")
    assert conversion.lossless  # the converter alone cannot see it
    reported = report_rounded(conversion, new_doc)
    assert not reported.lossless
    rounded = {e.path: e for e in reported.losses if "no double holds" in e.detail}
    assert set(rounded) == {
        "trajectories[0].steps[0].obs.tiny",
        "metrics.episode_returns[0]",
        "trace.session_time_steps[0].events[0].system_state_before.tiny",
        "trace.event_history[0].system_state_before.tiny",
    }
    assert all(e.kind == "default" and "1e-400 as 0.0" in e.detail for e in rounded.values())
    assert reported.warnings[-1].startswith("4 numbers no double holds")


def test_rounded_numbers_of_many_steps_are_grouped_by_path() -> None:
    trace: dict[str, Any] = {
        "session_time_steps": [],
        "event_history": [
            {"reward": 1.0, "terminated": k == 2, "system_state_before": {"t": k}} for k in range(3)
        ],
        "metadata": {},
    }
    tiny = loads_whole(b"[1e-400]")[0]
    for event in trace["event_history"][1:]:
        event["system_state_before"]["t"] = tiny
    conversion = trace_to_trajectories(trace)
    reported = report_rounded(conversion, conversion.data, "trajectories")
    (entry,) = [e for e in reported.losses if "no double holds" in e.detail]
    assert (entry.path, entry.count) == ("trajectories[*].steps[*].obs.t", 2)

"""Converted output keeps every integer whole and says what it rounds: POST /v1/convert,
served reads and `tracestore convert` (QA session 18, finding 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tracestore.convert import trajectories_to_trace
from tracestore.convert.numbers import report_rounded
from tracestore.jsontext import loads_whole

TRACESTORE = str(Path(sys.executable).parent / "tracestore")
SEED = 302196855289634516346049727356289862417  # numpy's SeedSequence().entropy: 128 bits
BIG = 123456789012345678901234567891


def _legacy(run_id: str, tiny: str = "0.25") -> bytes:
    # As posted: numbers written as text (orjson would read BIG as a float, 1e-400 as 0.0).
    return (
        f'{{"run_id":"{run_id}","trajectories":[{{"env_id":"e","policy_id":"p","steps":[{{'
        f'"obs":{{"id":{BIG},"tiny":{tiny}}},"tool_calls":[{{"tool_name":"t","arguments":'
        f'{{"n":{BIG}}}}}],"reward":1.0,"done":true}}]}}],"metrics":{{"episode_returns":[1.0],'
        f'"mean_return":1.0,"num_steps":1}},"pipeline_metadata":{{"seed":{SEED}}}}}'
    ).encode()


def _trace_only(run_id: str) -> bytes:
    event = (
        f'{{"reward":{BIG},"terminated":true,"system_state_before":{{"id":{BIG}}},'
        '"metadata":{"step_id":"decision_0"}}'
    )
    return (
        f'{{"run_id":"{run_id}","trajectories":[],"metrics":{{"episode_returns":[1.0],'
        f'"mean_return":1.0,"num_steps":1}},"trace":{{"session_time_steps":[{{"step_id":'
        f'"decision_0","events":[{event}]}}],"event_history":[{event}],"metadata":{{}}}}}}'
    ).encode()


def _exact(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return json.loads(response.content)  # the standard library: integers whole


def test_post_convert_keeps_integers_past_64_bits(http: httpx.Client) -> None:
    body = _exact(http.post("/v1/convert", params={"to": "trace"}, content=_legacy("n-1")))
    document = body["document"]
    assert document["pipeline_metadata"]["seed"] == SEED  # a part the conversion only keeps
    assert document["trace"]["metadata"]["seed"] == SEED
    (step,) = document["trajectories"][0]["steps"]
    assert step["obs"]["id"] == step["tool_calls"][0]["arguments"]["n"] == BIG
    (event,) = document["trace"]["event_history"]
    assert event["system_state_before"]["id"] == BIG
    assert body["lossless"] is True
    # A part kept as sent is kept exactly too.
    kept = _exact(http.post("/v1/convert", params={"to": "trajectories"}, content=_legacy("n-1")))
    assert kept["action"] == "kept"
    assert kept["document"]["trajectories"][0]["steps"][0]["obs"]["id"] == BIG
    assert kept["document"]["pipeline_metadata"]["seed"] == SEED


def test_post_convert_reports_a_number_no_double_holds(http: httpx.Client) -> None:
    raw = _legacy("n-2", tiny="1e-400")
    for to in ("trace", "trajectories"):
        body = _exact(http.post("/v1/convert", params={"to": to}, content=raw))
        assert body["lossless"] is False
        paths = {loss["path"] for loss in body["losses"] if loss["kind"] == "default"}
        assert "trajectories[0].steps[0].obs.tiny" in paths
        assert body["document"]["trajectories"][0]["steps"][0]["obs"]["id"] == BIG
        assert any("no double holds" in w for w in body["warnings"])


def test_served_converted_parts_keep_integers_past_64_bits(http: httpx.Client) -> None:
    for raw in (_legacy("n-3"), _legacy("n-4", tiny="1e-400"), _trace_only("n-5")):
        assert http.post("/v1/rollouts", content=raw).status_code == 201
    trace = http.get("/v1/rollouts/n-3/trace")
    assert trace.headers["X-Tracestore-Source"] == "converted"
    served = _exact(trace)
    assert served["metadata"]["seed"] == SEED
    assert served["event_history"][0]["system_state_before"]["id"] == BIG

    # The loss count of a converted part counts the numbers it writes rounded.
    rounded = http.get("/v1/rollouts/n-4/trace")
    expected = trajectories_to_trace(loads_whole(_legacy("n-4", tiny="1e-400")))
    without = len(expected.losses)
    with_rounded = len(report_rounded(expected, expected.data, "trace").losses)
    assert with_rounded > without
    assert rounded.headers["X-Tracestore-Converter"].endswith(f"losses={with_rounded}")
    assert _exact(rounded)["event_history"][0]["system_state_before"]["id"] == BIG

    trajectories = http.get("/v1/rollouts/n-5/trajectories")
    assert trajectories.headers["X-Tracestore-Source"] == "converted"
    (step,) = _exact(trajectories)[0]["steps"]
    assert step["obs"]["id"] == step["reward"] == BIG


def _convert(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TRACESTORE, "convert", *args], capture_output=True, text=True, check=False
    )


def test_the_convert_command_keeps_integers_and_says_what_it_rounds(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(_legacy("n-6") + b"\n")
    done = _convert("to-trace", str(source))
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["pipeline_metadata"]["seed"] == document["trace"]["metadata"]["seed"] == SEED
    assert "1 converted (1 lossless" in done.stderr

    # A document kept as sent (it has trajectories) is not "written unchanged" when it
    # holds a number no double holds.
    source.write_bytes(_legacy("n-7", tiny="1e-400") + b"\n")
    done = _convert("to-trajectories", str(source))
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["trajectories"][0]["steps"][0]["obs"]["id"] == BIG
    assert "1 with numbers written rounded" in done.stderr
    assert "no double holds" in done.stderr

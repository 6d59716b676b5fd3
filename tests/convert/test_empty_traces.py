"""GET .../trace of a run whose stored trace has nothing in it (QA session 18, finding 5)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import minimal_rollout
from tracestore.convert import trace_to_trajectories

EMPTY_INNER: dict[str, Any] = {
    "session_id": "s",
    "created_at": None,
    "session_time_steps": [],
    "event_history": [],
    "markov_blanket_message_history": [],
}
EMPTY_TRACES: dict[str, Any] = {
    "wrapped_null": {"version": 3, "session_trace": None},
    "wrapped_empty": {"version": 3, "session_trace": EMPTY_INNER},
}


def _post(http: httpx.Client, doc: dict[str, Any], suffix: bytes = b"") -> None:
    raw = json.dumps(doc).encode()
    if suffix:
        # A number orjson reads as 0.0 somewhere else in the document: it used to make
        # the same run's trace `null` instead of `{}`.
        raw = raw[:-1] + b', "extra": ' + suffix + b"}"
    assert http.post("/v1/rollouts", content=raw).status_code == 201


@pytest.mark.parametrize("name", list(EMPTY_TRACES))
@pytest.mark.parametrize("suffix", [b"", b"1e-400"], ids=["plain", "inexact_number"])
def test_an_empty_stored_trace_is_served_converted_from_the_trajectories(
    http: httpx.Client, name: str, suffix: bytes
) -> None:
    doc = minimal_rollout(f"empty-{name}", trace=EMPTY_TRACES[name])
    _post(http, doc, suffix)
    response = http.get(f"/v1/rollouts/{doc['run_id']}/trace")
    assert response.status_code == 200, response.text
    assert response.headers["X-Tracestore-Source"] == "converted"
    trace = json.loads(response.content)
    assert isinstance(trace, dict)
    assert len(trace["session_time_steps"]) == 1
    assert trace_to_trajectories(trace).data == doc["trajectories"]
    # The trajectories are still the stored ones.
    trajectories = http.get(f"/v1/rollouts/{doc['run_id']}/trajectories")
    assert trajectories.headers["X-Tracestore-Source"] == "stored"


def test_without_trajectories_null_is_never_served_as_a_trace(http: httpx.Client) -> None:
    for suffix in (b"", b"1e-400"):
        doc = minimal_rollout(
            f"null-trace-{len(suffix)}", trajectories=[], trace=EMPTY_TRACES["wrapped_null"]
        )
        _post(http, doc, suffix)
        response = http.get(f"/v1/rollouts/{doc['run_id']}/trace")
        assert response.status_code == 404, response.text
        assert "nothing in it" in response.json()["error"]["message"]
    # An empty trace in the full shape is still the producer's: served as stored.
    doc = minimal_rollout(
        "empty-full-no-steps", trajectories=[], trace=EMPTY_TRACES["wrapped_empty"]
    )
    _post(http, doc)
    response = http.get("/v1/rollouts/empty-full-no-steps/trace")
    assert response.headers["X-Tracestore-Source"] == "stored"
    assert response.json() == EMPTY_INNER

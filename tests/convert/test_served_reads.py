"""Served reads: every example run's trace and trajectories, stored or converted."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.conftest import Example
from tracestore.convert import source_sha256, trace_to_trajectories
from tracestore.toolcalls import normalize_tool_calls
from tracestore.wire.trace import classify_trace, unwrap_trace

STEP_FIELDS = ("obs", "reward", "done", "truncated")


@pytest.fixture
def stored(http: httpx.Client, examples: list[Example]) -> list[Example]:
    created = []
    for ex in examples:
        if http.post("/v1/rollouts", content=ex.raw).status_code == 201:
            created.append(ex)
    return created


def test_both_routes_serve_every_example_run(http: httpx.Client, stored: list[Example]) -> None:
    for ex in stored:
        doc = ex.doc
        kind = classify_trace(doc["trace"])
        trace = http.get(f"/v1/rollouts/{doc['run_id']}/trace")
        assert trace.status_code == 200, (doc["run_id"], trace.text)
        trajectories = http.get(f"/v1/rollouts/{doc['run_id']}/trajectories")
        assert trajectories.status_code == 200, (doc["run_id"], trajectories.text)

        if kind in ("full", "wrapped"):
            assert trace.headers["X-Tracestore-Source"] == "stored"
            own = unwrap_trace(doc["trace"])[0] if kind == "wrapped" else doc["trace"]
            assert orjson.loads(trace.content) == own
        else:
            # Legacy-only and summary-trace runs: converted from the trajectories, and the
            # conversion gives them back exactly (the round-trip law, through HTTP).
            assert trace.headers["X-Tracestore-Source"] == "converted"
            assert trace.headers["X-Tracestore-Converter"].startswith("trajectories_to_trace/")
            served = orjson.loads(trace.content)
            assert trace_to_trajectories(served).data == doc["trajectories"]

        if doc["trajectories"]:
            assert trajectories.headers["X-Tracestore-Source"] == "stored"
            assert orjson.loads(trajectories.content) == doc["trajectories"]
        else:
            assert trajectories.headers["X-Tracestore-Source"] == "converted"
            served_steps = orjson.loads(trajectories.content)[0]["steps"]
            expected = ex.label["expected_steps"]
            assert len(served_steps) == len(expected)
            for got, want in zip(served_steps, expected, strict=True):
                assert {k: got[k] for k in STEP_FIELDS} == {k: want[k] for k in STEP_FIELDS}
                assert normalize_tool_calls(got["tool_calls"]) == normalize_tool_calls(
                    want["tool_calls"]
                )


def test_neither_source_is_404(http: httpx.Client) -> None:
    doc = {
        "run_id": "run-summary-only",
        "trajectories": [],
        "metrics": {"episode_returns": [], "mean_return": 0.0, "num_steps": 0},
        "trace": {"session_id": "s", "events_count": 0, "lm_calls": []},
    }
    assert http.post("/v1/rollouts", content=orjson.dumps(doc)).status_code == 201
    for part in ("trace", "trajectories"):
        response = http.get(f"/v1/rollouts/run-summary-only/{part}")
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["code"] == "not_found"
        assert "summary" in error["message"]
    assert http.get("/v1/rollouts/no-such-run/trace").status_code == 404


def test_convert_does_not_store(http: httpx.Client, examples: list[Example]) -> None:
    legacy = next(e for e in examples if e.label["kind"] == "legacy_only")
    response = http.post("/v1/convert", params={"to": "trace"}, content=legacy.raw)
    assert response.status_code == 200, response.text
    body = response.json()
    assert classify_trace(body["document"]["trace"]) == "full"
    assert body["document"]["trajectories"] == legacy.doc["trajectories"]
    assert body["provenance"]["source_sha256"] == source_sha256(legacy.doc)
    assert body["method"] == "trajectories"
    assert (body["action"], body["lossless"], body["warnings"]) == ("filled", True, [])
    # Not stored: the request's time stands in for the trace's creation time.
    assert body["document"]["trace"]["created_at"] is not None
    assert http.get(f"/v1/rollouts/{legacy.label['run_id']}").status_code == 404

    only_trace = next(e for e in examples if e.label["kind"] == "trace_only")
    body = http.post("/v1/convert", params={"to": "trajectories"}, content=only_trace.raw).json()
    assert len(body["document"]["trajectories"][0]["steps"]) == only_trace.label["n_steps"]
    assert any(loss["path"].endswith(".info") for loss in body["losses"])
    assert body["lossless"] is False


def test_convert_never_replaces_real_data_with_nothing(
    http: httpx.Client, examples: list[Example]
) -> None:
    # Trajectories beside a summary trace: the trace gives none; the real ones stay.
    summary = next(e for e in examples if e.label.get("trace_kind") == "summary")
    for params in ({"to": "trajectories"}, {"to": "trajectories", "replace": "true"}):
        body = http.post("/v1/convert", params=params, content=summary.raw).json()
        assert body["document"]["trajectories"] == summary.doc["trajectories"] != []
        assert body["action"] == "kept"
        assert body["warnings"]
    # A trace-only rollout: to=trace keeps its trace, replace or not.
    only_trace = next(e for e in examples if e.label["kind"] == "trace_only")
    for params in ({"to": "trace"}, {"to": "trace", "replace": "true"}):
        body = http.post("/v1/convert", params=params, content=only_trace.raw).json()
        assert body["document"]["trace"] == only_trace.doc["trace"]
        assert body["action"] == "kept"
    # replace=true with something to put in place: replaced, and the report says so.
    crafter = next(
        e for e in examples if e.label["kind"] == "crafter" and e.label.get("trace_kind") == "full"
    )
    body = http.post("/v1/convert", params={"to": "trace", "replace": "true"}, content=crafter.raw)
    report = body.json()
    assert report["action"] == "replaced"
    assert report["lossless"] is False
    assert any(loss["kind"] == "replaced" for loss in report["losses"])


@pytest.mark.parametrize(
    ("params", "body", "status"),
    [
        ({"to": "yaml"}, b"{}", 422),
        ({}, b"{}", 422),
        ({"to": "trace"}, b"{", 400),
        ({"to": "trace"}, b'{"run_id": "x"}', 422),
    ],
)
def test_convert_refusals(
    http: httpx.Client, params: dict[str, str], body: bytes, status: int
) -> None:
    response = http.post("/v1/convert", params=params, content=body)
    assert response.status_code == status
    assert "code" in response.json()["error"]

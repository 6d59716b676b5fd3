"""Every example line posted in order over real HTTP: labels hold, read-back is equal."""

from __future__ import annotations

import gzip
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import orjson

from tests.conftest import Example

STATUS_CODE = {"created": 201, "duplicate": 200, "conflict": 409}


def test_examples_in_order(http: Any, examples: list[Example]) -> None:
    stored: dict[str, Example] = {}
    for ex in examples:
        label = ex.label
        response = http.post(
            "/v1/rollouts", content=ex.raw, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == STATUS_CODE[label["expect_status"]], response.text
        body = response.json()
        if label["expect_status"] == "conflict":
            assert body["error"]["code"] == "conflict"
            assert body["error"]["differing_parts"]
            continue
        assert body["status"] == label["expect_status"]
        assert body["run_id"] == label["run_id"]
        if label["expect_status"] == "created":
            stored[label["run_id"]] = ex
            assert (
                body["correlation_id"],
                body["correlation_source"],
                body["trace_kind"],
            ) == (label["correlation_id"], label["correlation_source"], label["trace_kind"])
    for run_id, ex in stored.items():
        response = http.get(f"/v1/rollouts/{run_id}")
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert orjson.loads(response.content) == orjson.loads(ex.raw)


def test_gzip_body_is_accepted(http: Any, examples: list[Example]) -> None:
    ex = next(e for e in examples if e.label["kind"] == "crafter")
    response = http.post(
        "/v1/rollouts",
        content=gzip.compress(ex.raw),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert response.status_code == 201, response.text
    assert orjson.loads(http.get(f"/v1/rollouts/{ex.label['run_id']}").content) == ex.doc


def test_lookup_by_canonical_and_trajectory_cid(http: Any, examples: list[Example]) -> None:
    # The correlation_conflict example names one cid at the top and another in a trajectory.
    ex = next(e for e in examples if "correlation_conflict" in (e.label.get("drift") or []))
    assert http.post("/v1/rollouts", content=ex.raw).status_code == 201
    canonical = ex.label["correlation_id"]
    trajectory_cids = {t.get("trace_correlation_id") for t in ex.doc["trajectories"]} - {
        None,
        canonical,
    }
    assert trajectory_cids, "the example must carry a second cid in a trajectory"
    for cid in [canonical, *trajectory_cids]:
        response = http.get(f"/v1/correlations/{cid}")
        assert response.status_code == 200, cid
        body = response.json()
        assert body["correlation_id"] == cid
        assert [r["run_id"] for r in body["runs"]] == [ex.label["run_id"]]
        listed = http.get("/v1/rollouts", params={"correlation_id": cid}).json()
        assert [r["run_id"] for r in listed["items"]] == [ex.label["run_id"]]
    missing = http.get("/v1/correlations/trace_nobody")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


def test_lookup_by_url_cid_of_every_example(http: Any, examples: list[Example]) -> None:
    for ex in examples:
        http.post("/v1/rollouts", content=ex.raw)
    for ex in examples:
        cid = ex.label.get("correlation_id")
        if ex.label["expect_status"] != "created" or cid is None:
            continue
        runs = http.get(f"/v1/correlations/{cid}").json()["runs"]
        assert ex.label["run_id"] in {r["run_id"] for r in runs}


def test_the_id_synth_ai_logs_for_a_malformed_url_finds_the_run(
    http: Any, examples: list[Example]
) -> None:
    # `?cid=trace_x/v1/chat/completions`: synth-ai's extract_trace_correlation_id keeps
    # the path (it logs `trace_x/v1/chat/completions`); tracestore stores `trace_x`.
    malformed = [e for e in examples if e.label.get("url_style") == "malformed"]
    assert malformed
    for ex in malformed:
        assert http.post("/v1/rollouts", content=ex.raw).status_code in (200, 201)
        url = ex.doc["pipeline_metadata"]["inference_url"]
        logged = parse_qs(urlsplit(url).query)["cid"][0].strip()
        cid = ex.label["correlation_id"]
        assert logged == f"{cid}/v1/chat/completions"
        response = http.get(f"/v1/correlations/{quote(logged, safe='')}")
        assert response.status_code == 200, response.text
        body = response.json()
        assert (body["correlation_id"], body["matched_correlation_id"]) == (logged, cid)
        assert ex.label["run_id"] in {r["run_id"] for r in body["runs"]}
    # An id that names nothing stays a 404, with or without a path.
    assert http.get(f"/v1/correlations/{quote('trace_nobody/v1/x', safe='')}").status_code == 404

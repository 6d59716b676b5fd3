"""Query parameters: unknown ones refused on every route, one time grammar, sane cursors."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import minimal_rollout

UNKNOWN = "tracestore_unknown"
# A value for each path parameter of the API (any value: the check comes first).
PATH_VALUES = {"run_id": "r", "cid": "c", "name": "returns"}


def _operations(http: httpx.Client) -> list[tuple[str, str, set[str]]]:
    """(method, path with parameters filled, declared query names) of every operation."""
    schema = http.get("/openapi.json").json()
    out = []
    for template, operations in schema["paths"].items():
        path = template.format(**PATH_VALUES)
        for method, op in operations.items():
            names = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
            out.append((method.upper(), path, names))
    return out


def test_every_route_refuses_an_unknown_query_parameter(http: httpx.Client) -> None:
    operations = _operations(http)
    assert len(operations) >= 15
    for method, path, declared in operations:
        response = http.request(method, path, params={UNKNOWN: "1"})
        # Before: ignored (the answer looked like an unfiltered one).
        assert response.status_code == 422, (method, path, response.text[:300])
        error = response.json()["error"]
        assert error["code"] == "invalid_request", (method, path)
        assert error["unknown"] == [UNKNOWN]
        # The names it lists are the ones the API documents for that route.
        assert set(error["known"]) == declared, (method, path)
        assert UNKNOWN in error["message"]


@pytest.mark.parametrize(
    ("path", "params", "named"),
    [
        ("/v1/rollouts", {"env": "e"}, "env_id"),
        ("/v1/rollouts", {"envid": "e", "limit": "5"}, "env_id"),
        ("/v1/drift", {"has_drifts": "true"}, "has_drift"),
        ("/v1/drift", {"env": "e"}, "env_id"),
        ("/v1/correlations/c", {"limit": "1"}, None),
    ],
)
def test_a_misspelt_filter_is_refused_naming_the_real_ones(
    http: httpx.Client, path: str, params: dict[str, str], named: str | None
) -> None:
    http.post("/v1/rollouts", content=orjson.dumps(minimal_rollout("q-1")))
    response = http.get(path, params=params)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    if named is None:
        assert error["known"] == []
        assert "takes no query parameters" in error["message"]
    else:
        assert named in error["known"]
        assert named in error["message"]


def test_declared_parameters_still_work(http: httpx.Client) -> None:
    http.post("/v1/rollouts", content=orjson.dumps(minimal_rollout("q-2")))
    response = http.get("/v1/rollouts", params={"env_id": "e", "limit": "5"})
    assert response.status_code == 200, response.text
    assert [i["run_id"] for i in response.json()["items"]] == ["q-2"]
    assert http.get("/health").status_code == 200


# --- since / until: one grammar on every route ------------------------------------------------

WINDOWED = ["/v1/rollouts", "/v1/drift"]


@pytest.mark.parametrize("path", WINDOWED)
def test_durations_work_on_every_windowed_route(http: httpx.Client, path: str) -> None:
    http.post("/v1/rollouts", content=orjson.dumps(minimal_rollout("w-1")))

    def runs(**params: str) -> int:
        response = http.get(path, params=params)
        # Before: 422 for `1h` (only ISO times were read here; the reports took both).
        assert response.status_code == 200, (params, response.text)
        body = response.json()
        return len(body["items"]) if "items" in body else int(body["runs"])

    assert runs(since="1h") == 1
    assert runs(since="2w", until="30m") == 0
    assert runs(until="1.5d") == 0
    assert runs(since=(datetime.now(UTC) - timedelta(days=1)).date().isoformat()) == 1
    assert runs(since="0001-01-01T00:00:00+14:00") == 1  # clamped, not an error
    assert runs(since="9999999999d") == 1


@pytest.mark.parametrize("path", [*WINDOWED, "/v1/migration/status", "/reports/drift"])
@pytest.mark.parametrize("name", ["since", "until"])
def test_an_unreadable_time_names_the_parameter_and_the_grammar(
    http: httpx.Client, path: str, name: str
) -> None:
    response = http.get(path, params={name: "last tuesday"})
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert message.startswith(f"{name}: cannot read 'last tuesday'")
    assert "7d" in message


@pytest.mark.parametrize("path", ["/v1/migration/status", "/reports/drift"])
def test_the_window_routes_take_durations(http: httpx.Client, path: str) -> None:
    response = http.get(path, params={"since": "2w", "until": "1m"})
    assert response.status_code == 200, response.text


def test_a_since_not_before_until_is_refused_on_every_route_that_takes_both(
    http: httpx.Client,
) -> None:
    # The reports and the drift window refused it; the list (and through it datasets and
    # the inspector) answered nothing without a word.
    windowed = [path for method, path, names in _operations(http) if {"since", "until"} <= names]
    assert {"/v1/rollouts", "/v1/drift", "/v1/reports/returns"} <= set(windowed)
    for path in windowed:
        for since, until in [("1d", "2d"), ("2025-01-02", "2025-01-02")]:
            response = http.get(path, params={"since": since, "until": until})
            assert response.status_code == 422, (path, since, until, response.text)
            error = response.json()["error"]
            assert error["code"] == "invalid_request"
            assert "must be before until" in error["message"], (path, error)
        assert http.get(path, params={"since": "2d", "until": "1d"}).status_code == 200, path


# --- cursors past 64 bits ----------------------------------------------------------------------


def _cursor(data: dict[str, Any]) -> str:
    # The stdlib: orjson refuses integers past 64 bits, which is the point here.
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("path", "cursor"),
    [
        ("/v1/rollouts", {"v": 1, "before": 2**63}),
        ("/v1/rollouts", {"v": 1, "before": 2**64 - 1}),
        ("/v1/rollouts", {"v": 1, "before": -1}),
        ("/v1/drift", {"v": 1, "run": 2**63, "ord": 0}),
        ("/v1/drift", {"v": 1, "run": 1, "ord": 2**63}),
    ],
)
def test_a_cursor_past_64_bits_is_a_4xx(
    http: httpx.Client, path: str, cursor: dict[str, Any]
) -> None:
    response = http.get(path, params={"cursor": _cursor(cursor)})
    # Before: 500 internal_error on both databases (the driver could not bind it).
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_request"


def test_a_report_name_longer_than_a_file_name_is_not_found(http: httpx.Client) -> None:
    response = http.get("/v1/reports/" + "x" * 5000)
    # Before: 500 (the file look-up raised OSError: file name too long).
    assert response.status_code == 404, response.text[:300]
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("path", ["/v1/rollouts", "/v1/drift", "/v1/drift/report"])
@pytest.mark.parametrize("kind", ["bogus", "FULL", "NULL", "none"])
def test_an_unknown_trace_kind_is_refused_naming_the_kinds(
    http: httpx.Client, path: str, kind: str
) -> None:
    # It selected no run without a word: an empty list or summary for a mistyped kind.
    response = http.get(path, params={"trace_kind": kind})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert "full, wrapped, summary, db_row, empty, unknown, null" in error["message"]
    assert http.get(path, params={"trace_kind": "full"}).status_code == 200


def test_trace_kind_null_selects_the_runs_sent_without_a_trace(http: httpx.Client) -> None:
    # Before: refused, and no other filter told traceless runs apart.
    bare = minimal_rollout("no-trace")
    summary = minimal_rollout("summary-trace", trace={"events_count": 1})
    nulled = minimal_rollout("null-trace", trace=None)
    for doc in (bare, summary, nulled):
        assert http.post("/v1/rollouts", json=doc).status_code == 201
    listed = http.get("/v1/rollouts", params={"trace_kind": "null"})
    assert listed.status_code == 200, listed.text
    assert {r["run_id"] for r in listed.json()["items"]} == {"no-trace", "null-trace"}
    assert all(r["trace_kind"] is None for r in listed.json()["items"])
    others = http.get("/v1/rollouts", params={"trace_kind": "summary"}).json()["items"]
    assert [r["run_id"] for r in others] == ["summary-trace"]
    drift = http.get("/v1/drift", params={"trace_kind": "null"})
    assert drift.status_code == 200, drift.text


def test_a_cid_holding_a_nul_is_found_by_its_own_text(http: httpx.Client) -> None:
    # PostgreSQL's typed columns hold a NUL as U+2400: the look-up compared the rows with
    # the cid as given and answered 404 for the cid the post had just returned.
    doc = minimal_rollout("nul-cid", trace_correlation_id="c\u0000d")
    posted = http.post("/v1/rollouts", json=doc)
    assert posted.status_code == 201, posted.text
    assert posted.json()["correlation_id"] == "c\u0000d"
    found = http.get("/v1/correlations/c%00d")
    assert found.status_code == 200, found.text
    assert [r["run_id"] for r in found.json()["runs"]] == ["nul-cid"]


def test_an_offset_whose_plus_became_a_space_says_to_escape_it(http: httpx.Client) -> None:
    # `?since=2025-11-20T00:00:00+05:00` unescaped: the '+' arrives as a space, and the
    # refusal quoted the space without saying why.
    response = http.get("/v1/rollouts?since=2025-11-20T00:00:00+05:00")
    assert response.status_code == 422
    message = response.json()["error"]["message"]
    assert "%2B" in message, message
    escaped = http.get("/v1/rollouts?since=2025-11-20T00:00:00%2B05:00")
    assert escaped.status_code == 200, escaped.text

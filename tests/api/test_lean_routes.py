"""POST /v1/rollouts, GET /v1/correlations/{cid} and GET /v1/rollouts/{run_id} are served
by lean routes (reached through LeanShortcut), below FastAPI's dependency machinery (issue
19): they answer every kind of request exactly as the documented FastAPI routes do."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine

from tests.conftest import Database, LiveServer, minimal_rollout
from tracestore.api.app import create_app
from tracestore.api.lane import IngestLane
from tracestore.api.routes.rollouts import (
    CorrelationRoute,
    IngestRoute,
    LeanRoute,
    LeanShortcut,
    RolloutRoute,
)
from tracestore.ingest.parse import RUN_SUBRESOURCES
from tracestore.settings import Settings

KEY = "k-ingest-route"


@pytest.fixture(params=["open", "keyed"])
def servers(
    request: pytest.FixtureRequest, database: Database, engine: Engine
) -> Iterator[tuple[httpx.Client, httpx.Client, bool]]:
    """(lean, documented, keyed): two servers over one store, with and without the lean
    routes."""
    keyed = request.param == "keyed"
    settings = Settings(database_url=database.url, api_keys=[f"ci:{KEY}"] if keyed else [])
    lean, documented = LiveServer(settings), LiveServer(settings)
    app = documented.server.config.app
    assert isinstance(app, FastAPI)
    routes = app.router.routes
    # Installed first, ahead of every route.
    assert [type(r) for r in routes[:3]] == [IngestRoute, CorrelationRoute, RolloutRoute]
    innermost: object = app.user_middleware[-1].cls
    assert innermost is LeanShortcut
    # The FastAPI routes answer instead (the stack is built at the first request), and no
    # ingest lane serves posts before them (api/lane.py; tests/api/test_ingest_lane.py).
    del routes[:3]
    assert not [r for r in routes if isinstance(r, LeanRoute)]
    app.user_middleware.pop()
    lane: object = IngestLane
    app.user_middleware[:] = [m for m in app.user_middleware if m.cls is not lane]
    headers = {"X-API-Key": KEY} if keyed else {}
    with (
        lean,
        documented,
        httpx.Client(base_url=lean.url, headers=headers, timeout=60) as a,
        httpx.Client(base_url=documented.url, headers=headers, timeout=60) as b,
    ):
        yield a, b, keyed


def _cases(run_id: str) -> list[tuple[str, dict[str, Any]]]:
    doc = minimal_rollout(run_id)
    raw = orjson.dumps(doc)
    other = orjson.dumps(minimal_rollout(run_id, reward=0.5))
    return [
        ("created", {"content": raw}),
        ("duplicate", {"content": raw}),
        ("conflict", {"content": other}),
        (
            "gzip",
            {
                "content": gzip.compress(orjson.dumps(minimal_rollout(run_id + "-gz"))),
                "headers": {"Content-Encoding": "gzip"},
            },
        ),
        ("bad gzip", {"content": b"\x1f\x8b not gzip", "headers": {"Content-Encoding": "gzip"}}),
        ("brotli", {"content": raw, "headers": {"Content-Encoding": "br"}}),
        ("not json", {"content": b"{nope"}),
        ("not a rollout", {"content": b'{"run_id": 5}'}),
        ("repeated key", {"content": b'{"run_id": "a", "run_id": "b"}'}),
        ("text/plain", {"content": raw, "headers": {"Content-Type": "text/plain"}}),
        ("ndjson", {"content": raw, "headers": {"Content-Type": "application/x-ndjson"}}),
        ("empty", {"content": b""}),
        ("query", {"content": raw, "params": {"dry_run": "1"}}),
    ]


def _comparable(response: httpx.Response, run_id: str) -> tuple[int, Any, str | None]:
    body = response.content.replace(run_id.encode(), b"RUN")
    auth = response.headers.get("www-authenticate")
    return response.status_code, orjson.loads(body) if body else None, auth


def test_the_ingest_route_answers_as_the_documented_route(
    servers: tuple[httpx.Client, httpx.Client, bool],
) -> None:
    lean, documented, _keyed = servers
    for name, request in _cases("lean-1"):
        a = lean.post("/v1/rollouts", **request)
        b = documented.post("/v1/rollouts", **_cases("doc-1")[_index(name)][1])
        assert _comparable(a, "lean-1") == _comparable(b, "doc-1"), name
        assert a.headers["content-type"] == b.headers["content-type"], name
    # Both stored what they acknowledged.
    assert lean.get("/v1/rollouts/lean-1").json() == minimal_rollout("lean-1")
    assert documented.get("/v1/rollouts/doc-1").json() == minimal_rollout("doc-1")


def _index(name: str) -> int:
    return [n for n, _ in _cases("x")].index(name)


def test_keys_are_checked_as_on_every_route(
    servers: tuple[httpx.Client, httpx.Client, bool],
) -> None:
    lean, documented, keyed = servers
    raw = orjson.dumps(minimal_rollout("key-1"))
    for client in (lean, documented):
        for headers in ({"X-API-Key": "wrong"}, {"X-API-Key": ""}):
            response = client.post("/v1/rollouts", content=raw, headers=headers)
            if keyed:
                assert response.status_code == 401, response.text
                assert response.json()["error"]["code"] == "unauthorized"
                assert response.headers["www-authenticate"].startswith("Bearer")
            else:
                assert response.status_code in (200, 201), response.text


def test_its_requests_are_counted_under_the_route_template(
    servers: tuple[httpx.Client, httpx.Client, bool],
) -> None:
    lean, _documented, _keyed = servers
    lean.post("/v1/rollouts", content=orjson.dumps(minimal_rollout("metric-1")))
    lean.post("/v1/rollouts", content=b"{nope")
    metrics = lean.get("/metrics").text
    assert 'route="/v1/rollouts",status="201"' in metrics
    assert 'route="/v1/rollouts",status="400"' in metrics
    assert 'route="unmatched"' not in metrics


# --- GET /v1/correlations/{cid} --------------------------------------------------------


def _look_ups() -> list[tuple[str, str, str]]:
    """(name, method, path) of every kind of look-up request."""
    return [
        ("found", "GET", "/v1/correlations/corr-shared"),
        ("found by a trajectory's cid", "GET", "/v1/correlations/corr-traj"),
        ("named before a slash", "GET", "/v1/correlations/corr-shared%2Fv1%2Fchat%2Fcompletions"),
        ("absent", "GET", "/v1/correlations/corr-absent"),
        ("line break", "GET", "/v1/correlations/corr%0Ashared"),
        ("no cid", "GET", "/v1/correlations/"),
        ("query", "GET", "/v1/correlations/corr-shared?limit=1"),
        ("HEAD", "HEAD", "/v1/correlations/corr-shared"),
        ("POST", "POST", "/v1/correlations/corr-shared"),
    ]


def test_the_correlation_route_answers_as_the_documented_route(
    servers: tuple[httpx.Client, httpx.Client, bool],
) -> None:
    lean, documented, _keyed = servers
    trajectory = minimal_rollout("x")["trajectories"][0]
    trajectory["trace_correlation_id"] = "corr-traj"
    for doc in (
        minimal_rollout("corr-1", trace_correlation_id="corr-shared"),
        minimal_rollout("corr-2", trace_correlation_id="corr-shared", trajectories=[trajectory]),
    ):
        assert lean.post("/v1/rollouts", content=orjson.dumps(doc)).status_code == 201
    statuses = set()
    for name, method, path in _look_ups():
        a, b = lean.request(method, path), documented.request(method, path)
        assert (a.status_code, a.content) == (b.status_code, b.content), name
        assert a.headers.get("content-type") == b.headers.get("content-type"), name
        assert a.headers.get("allow") == b.headers.get("allow"), name
        statuses.add(a.status_code)
    assert statuses == {200, 404, 405, 422}
    found = lean.get("/v1/correlations/corr-shared%2Fv1%2Fchat%2Fcompletions").json()
    assert found["matched_correlation_id"] == "corr-shared"
    assert [r["run_id"] for r in found["runs"]] == ["corr-2", "corr-1"]


def test_look_ups_check_keys_and_are_counted_under_the_route_template(
    servers: tuple[httpx.Client, httpx.Client, bool],
) -> None:
    lean, documented, keyed = servers
    for client in (lean, documented):
        answer = client.get("/v1/correlations/corr-absent", headers={"X-API-Key": "wrong"})
        if keyed:
            assert answer.status_code == 401, answer.text
            assert answer.json()["error"]["code"] == "unauthorized"
        else:
            assert answer.status_code == 404, answer.text
    lean.get("/v1/correlations/corr-absent")
    metrics = lean.get("/metrics").text
    assert 'route="/v1/correlations/{cid}",status="404"' in metrics
    assert 'route="unmatched"' not in metrics


# --- GET /v1/rollouts/{run_id} ---------------------------------------------------------


def test_the_rollout_route_answers_as_the_documented_route(
    servers: tuple[httpx.Client, httpx.Client, bool],
) -> None:
    lean, documented, _keyed = servers
    docs = [minimal_rollout("fetch-1"), minimal_rollout("fetch/2"), minimal_rollout("fetch-3")]
    docs[2]["trajectories"] = []  # trace only: not a legacy read
    for doc in docs:
        assert lean.post("/v1/rollouts", content=orjson.dumps(doc)).status_code == 201
    cases = [
        ("found", "GET", "/v1/rollouts/fetch-1"),
        ("a slash in the id", "GET", "/v1/rollouts/fetch%2F2"),
        ("trace only", "GET", "/v1/rollouts/fetch-3"),
        ("absent", "GET", "/v1/rollouts/fetch-absent"),
        ("line break", "GET", "/v1/rollouts/fetch%0A1"),
        ("query", "GET", "/v1/rollouts/fetch-1?fields=run_id"),
        ("HEAD", "HEAD", "/v1/rollouts/fetch-1"),
        ("POST", "POST", "/v1/rollouts/fetch-1"),
        ("DELETE absent", "DELETE", "/v1/rollouts/fetch-absent"),
        ("the list", "GET", "/v1/rollouts?limit=1"),
        ("batch", "GET", "/v1/rollouts/batch"),
        *((f"under a run: {s}", "GET", f"/v1/rollouts/fetch-1{s}") for s in RUN_SUBRESOURCES),
        ("under an absent run", "GET", "/v1/rollouts/fetch-absent/trace"),
    ]
    statuses = set()
    for name, method, path in cases:
        a, b = lean.request(method, path), documented.request(method, path)
        assert (a.status_code, a.content) == (b.status_code, b.content), name
        assert a.headers.get("content-type") == b.headers.get("content-type"), name
        assert a.headers.get("allow") == b.headers.get("allow"), name
        statuses.add(a.status_code)
    assert statuses >= {200, 404, 405, 422}  # keyed, DELETE is 403 (not an admin's key)
    for doc in docs:
        path = "/v1/rollouts/" + doc["run_id"].replace("/", "%2F")
        assert lean.get(path).content == orjson.dumps(doc)
    # Fetching a run with trajectories is a legacy read (migration phase 3); a trace-only
    # run's is not.
    before = _legacy_rollout_reads(lean)
    lean.get("/v1/rollouts/fetch-3")
    assert _legacy_rollout_reads(lean) == before
    lean.get("/v1/rollouts/fetch-1")
    assert _legacy_rollout_reads(lean) == before + 1
    assert 'route="/v1/rollouts/{run_id}",status="200"' in lean.get("/metrics").text


def _legacy_rollout_reads(client: httpx.Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("tracestore_legacy_reads_total{") and 'route="rollout"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_no_path_under_a_run_is_taken_for_a_run_id() -> None:
    # The run route defers every path ending in a sub-resource to the routes that serve
    # them: each route under a run must be one of those (and ingest refuses such run_ids).
    paths = create_app(check_schema=False).openapi()["paths"]
    under = [p.removeprefix("/v1/rollouts/{run_id}") for p in paths]
    assert {u for u, p in zip(under, paths, strict=True) if u != p and u} == set(RUN_SUBRESOURCES)


def test_a_plain_function_handler_answers_for_a_lean_route(
    database: Database, engine: Engine
) -> None:
    """A handler that is a plain function runs as Starlette runs it (in its thread pool):
    the lean routes take the app's handlers as the routing table does. The handlers are
    read at the first error, so one added once the server started is used."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from tracestore.errors import InvalidJSON

    calls: list[str] = []

    def plain(request: Request, exc: Exception) -> JSONResponse:
        calls.append(type(exc).__name__)
        return JSONResponse({"error": {"code": "plain", "message": str(exc)}}, status_code=418)

    with LiveServer(Settings(database_url=database.url)) as live:
        app = live.server.config.app
        assert isinstance(app, FastAPI)
        app.add_exception_handler(InvalidJSON, plain)
        with httpx.Client(base_url=live.url, timeout=60) as client:
            response = client.post("/v1/rollouts", content=b"{")
    assert response.status_code == 418, response.text
    assert response.json()["error"]["code"] == "plain"
    assert calls == ["InvalidJSON"]

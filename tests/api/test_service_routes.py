"""/health, /info, the error shape for FastAPI's own errors, and the OpenAPI document."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import Example
from tracestore.db import migrate


def test_health(http: httpx.Client) -> None:
    response = http.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["healthy"] is True
    assert body["schema_revision"] == migrate.head_revision()


def test_info(http: httpx.Client, backend: str) -> None:
    body = http.get("/info").json()
    assert body["backend"] == backend
    assert body["schema_revision"] == body["expected_revision"] == migrate.head_revision()
    assert body["limits"]["max_body_bytes"] == 64 * 1024 * 1024
    assert body["auth_required"] is False


def test_unknown_route_and_method_use_the_error_shape(http: httpx.Client) -> None:
    missing = http.get("/v2/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    wrong = http.delete("/v1/rollouts")
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    not_stored = http.get("/v1/rollouts/nope")
    assert not_stored.status_code == 404
    assert not_stored.json()["error"] == {
        "code": "not_found",
        "message": "no rollout with run_id 'nope'",
        "run_id": "nope",
    }


def test_head_answers_every_get_route_as_its_get_without_the_body(
    http: httpx.Client, examples: list[Example]
) -> None:
    # Load balancers' health checks and `curl -I` send HEAD; FastAPI's GET routes said 405.
    ex = next(e for e in examples if e.label["expect_status"] == "created")
    assert http.post("/v1/rollouts", content=ex.raw).status_code == 201
    run_id, cid = ex.label["run_id"], ex.label["correlation_id"]
    paths = [
        "/health",
        "/info",
        "/openapi.json",
        f"/v1/rollouts/{run_id}",  # a lean route
        f"/v1/correlations/{cid}",  # a lean route
        f"/v1/rollouts/{run_id}/trace",
        "/v1/rollouts?limit=1",
        "/v1/rollouts/no-such-run",
    ]
    for path in paths:
        get, head = http.get(path), http.head(path)
        assert head.status_code == get.status_code, path
        assert head.content == b"", path
        assert head.headers["content-type"] == get.headers["content-type"], path
        assert int(head.headers["content-length"]) == len(get.content), path
    assert http.head("/v1/rollouts/no-such-run").status_code == 404
    # Labelled HEAD in the metrics; a HEAD of trajectories sent none: no legacy read.
    before = http.get("/metrics").text
    assert http.head(f"/v1/rollouts/{run_id}/trajectories").status_code == 200
    metrics = http.get("/metrics").text
    assert 'method="HEAD",route="/v1/rollouts/{run_id}/trajectories",status="200"' in metrics
    assert _legacy_reads(metrics) == _legacy_reads(before)
    assert http.get(f"/v1/rollouts/{run_id}/trajectories").status_code == 200
    assert _legacy_reads(http.get("/metrics").text) != _legacy_reads(before)  # a GET counts


def _legacy_reads(metrics: str) -> list[str]:
    return [x for x in metrics.splitlines() if x.startswith("tracestore_legacy_reads_total")]


def test_a_405_names_every_method_of_its_path(http: httpx.Client) -> None:
    # Starlette named only the first route of a path: GET and POST on /v1/rollouts said
    # `Allow: POST`, and the run route left out DELETE.
    cases = {
        ("DELETE", "/v1/rollouts"): "GET, HEAD, POST",
        ("PUT", "/v1/rollouts/some-run"): "DELETE, GET, HEAD",
        ("POST", "/v1/correlations/some-cid"): "GET, HEAD",
        ("POST", "/health"): "GET, HEAD",
        ("GET", "/v1/convert"): "POST",
    }
    for (method, path), allow in cases.items():
        answer = http.request(method, path)
        assert answer.status_code == 405, (method, path)
        assert answer.headers["allow"] == allow, (method, path)
        assert answer.json()["error"]["code"] == "method_not_allowed"


def test_openapi_describes_every_route_and_its_errors(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()
    paths = schema["paths"]
    for path, method in [
        ("/health", "get"),
        ("/info", "get"),
        ("/v1/rollouts", "post"),
        ("/v1/rollouts/batch", "post"),
        ("/v1/rollouts/{run_id}", "get"),
        ("/v1/rollouts", "get"),
        ("/v1/correlations/{cid}", "get"),
    ]:
        operation = paths[path][method]
        assert operation.get("summary"), (path, method)
        for status, response in operation["responses"].items():
            if status.startswith(("4", "5")):
                ref = response["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorBody"), (path, status)
    post = paths["/v1/rollouts"]["post"]
    assert {"400", "409", "413", "422"} <= set(post["responses"])
    assert "RolloutIn" in schema["components"]["schemas"]
    assert http.get("/docs").status_code == 200


def test_health_does_not_read_the_migration_scripts_each_time(
    http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reading them took ~20 ms, on the event loop: every request of the worker waited.
    from alembic.script import ScriptDirectory

    http.get("/health")
    reads: list[object] = []
    real = ScriptDirectory.from_config

    def counted(*args: Any, **kwargs: Any) -> ScriptDirectory:
        reads.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(ScriptDirectory, "from_config", counted)
    for _ in range(3):
        assert http.get("/health").json()["healthy"] is True
        assert http.get("/info").status_code == 200
    assert reads == []

"""Bad input gets the right 4xx, a clear message in the error shape, and writes nothing."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import Engine

from tests.conftest import Database, Example, LiveServer, minimal_rollout, row_counts
from tracestore.settings import Settings

SMALL_LIMIT = 64 * 1024


def _valid() -> dict[str, Any]:
    return minimal_rollout("run-bad-input")


def _without(key: str) -> dict[str, Any]:
    doc = _valid()
    doc.pop(key)
    return doc


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = _valid()
    target: Any = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return doc


CASES: list[tuple[str, bytes, int, str, str]] = [
    ("invalid JSON", b'{"run_id": "x",', 400, "invalid_json", "not valid JSON"),
    ("NaN token", b'{"run_id": "x", "metrics": {"mean_return": NaN}}', 400, "invalid_json", "JSON"),
    ("array where an object belongs", b"[1, 2]", 422, "invalid_rollout", "JSON object"),
    ("missing run_id", orjson.dumps(_without("run_id")), 422, "invalid_rollout", "run_id"),
    ("missing metrics", orjson.dumps(_without("metrics")), 422, "invalid_rollout", "metrics"),
    (
        "trajectories not a list",
        orjson.dumps(_with(("trajectories",), {"a": 1})),
        422,
        "invalid_rollout",
        "trajectories",
    ),
    (
        "non-numeric reward",
        orjson.dumps(_with(("trajectories", 0, "steps", 0, "reward"), "high")),
        422,
        "invalid_rollout",
        "trajectories[0].steps[0].reward",
    ),
    ("empty run_id", orjson.dumps(_with(("run_id",), "")), 422, "invalid_rollout", "run_id"),
    ("blank run_id", orjson.dumps(_with(("run_id",), "  ")), 422, "invalid_rollout", "run_id"),
    (
        "non-numeric trace reward",
        orjson.dumps(_with(("trace",), {"event_history": [{"reward": "x"}]})),
        422,
        "invalid_rollout",
        "trace.event_history[0].reward",
    ),
    (
        "100,000-deep nesting",
        b'{"run_id": "deep", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        400,
        "invalid_json",
        "depth limit",
    ),
]


@pytest.mark.parametrize(
    ("body", "status", "code", "needle"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_refused_with_the_right_error_and_nothing_written(
    http: httpx.Client, engine: Engine, body: bytes, status: int, code: str, needle: str
) -> None:
    response = http.post("/v1/rollouts", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert needle in error["message"] or any(
        needle in e.get("path", "") for e in error.get("errors", [])
    ), error
    assert set(row_counts(engine).values()) == {0}


def test_wrong_content_type_is_415(http: httpx.Client, engine: Engine) -> None:
    response = http.post(
        "/v1/rollouts", content=orjson.dumps(_valid()), headers={"Content-Type": "text/plain"}
    )
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert set(row_counts(engine).values()) == {0}


def test_unknown_content_encoding_is_415(http: httpx.Client, engine: Engine) -> None:
    response = http.post(
        "/v1/rollouts",
        content=orjson.dumps(_valid()),
        headers={"Content-Type": "application/json", "Content-Encoding": "br"},
    )
    assert response.status_code == 415


def test_corrupt_gzip_is_400(http: httpx.Client, engine: Engine) -> None:
    response = http.post(
        "/v1/rollouts",
        content=b"\x1f\x8b\x08\x00garbage",
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert response.status_code in (400, 422)
    assert response.json()["error"]["message"].startswith("the gzip body")


@pytest.fixture(scope="module")
def small_server(database: Database) -> Iterator[LiveServer]:
    settings = Settings(database_url=database.url, max_body_bytes=SMALL_LIMIT)
    with LiveServer(settings) as live:
        yield live


def _padded(size: int) -> bytes:
    doc = _valid()
    doc["padding"] = "x" * size
    return orjson.dumps(doc)


@pytest.mark.parametrize("encoding", ["plain", "gzip"])
def test_over_limit_body_is_413(small_server: LiveServer, engine: Engine, encoding: str) -> None:
    body = _padded(SMALL_LIMIT * 4)
    headers = {"Content-Type": "application/json"}
    if encoding == "gzip":
        # A small body that expands past the limit (a gzip bomb in miniature).
        body = gzip.compress(body)
        assert len(body) < SMALL_LIMIT
        headers["Content-Encoding"] = "gzip"
    with httpx.Client(base_url=small_server.url) as client:
        response = client.post("/v1/rollouts", content=body, headers=headers)
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "payload_too_large"
    assert str(SMALL_LIMIT) in error["message"]
    assert set(row_counts(engine).values()) == {0}


def test_just_under_limit_is_accepted(small_server: LiveServer, engine: Engine) -> None:
    body = _padded(SMALL_LIMIT - 1000)
    assert len(body) <= SMALL_LIMIT
    with httpx.Client(base_url=small_server.url) as client:
        response = client.post("/v1/rollouts", content=body)
    assert response.status_code == 201


def test_over_limit_without_content_length_is_413(small_server: LiveServer, engine: Engine) -> None:
    body = _padded(SMALL_LIMIT * 2)

    def chunks() -> Iterator[bytes]:
        # A streamed (chunked) upload declares no length: the limit is enforced as it arrives.
        for i in range(0, len(body), 8192):
            yield body[i : i + 8192]

    with httpx.Client(base_url=small_server.url) as client:
        response = client.post(
            "/v1/rollouts", content=chunks(), headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 413
    assert set(row_counts(engine).values()) == {0}


def test_failure_mid_rollout_rolls_back_whole(http: httpx.Client, engine: Engine) -> None:
    # Valid envelope and trajectories, but the trace holds a bad value after steps were
    # projected: the whole rollout is refused and no row of it remains.
    doc = _valid()
    doc["trace"] = {
        "session_time_steps": [
            {"events": [{"reward": 1.0}]},
            {"events": [{"reward": 1.0, "input_tokens": "many"}]},
        ]
    }
    response = http.post("/v1/rollouts", content=orjson.dumps(doc))
    assert response.status_code == 422
    assert "input_tokens" in response.json()["error"]["message"]
    assert set(row_counts(engine).values()) == {0}
    assert http.get("/v1/rollouts/run-bad-input").status_code == 404


def test_examples_still_ingest_after_refusals(http: httpx.Client, examples: list[Example]) -> None:
    assert http.post("/v1/rollouts", content=b"{").status_code == 400
    assert http.post("/v1/rollouts", content=examples[0].raw).status_code == 201

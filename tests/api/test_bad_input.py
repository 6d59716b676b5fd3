"""Bad input gets the right 4xx, a clear message in the error shape, and writes nothing."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import Engine

from tests.conftest import (
    Database,
    Example,
    LiveServer,
    minimal_rollout,
    row_counts,
    write_fault,
)
from tracestore.db.bulk import PADDED_MAX_ROWS
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
    # A full trace's list that is not one was read as no items: stored as a full trace
    # with nothing in it.
    (
        "a full trace's list that is not a list",
        orjson.dumps(dict(_valid(), trace={"session_time_steps": [], "event_history": 5})),
        422,
        "invalid_rollout",
        "trace.event_history",
    ),
    # Valid JSON no double holds: it was called "not valid JSON".
    (
        "a number past a double",
        b'{"run_id": "x", "x": 1e400}',
        400,
        "invalid_json",
        "past a double",
    ),
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
        # Valid envelope and trajectories; the bad value is the trace's last: validation
        # reads the whole document before anything is written.
        "bad value late in the trace",
        orjson.dumps(
            _with(
                ("trace",),
                {
                    "session_time_steps": [
                        {"events": [{"reward": 1.0}]},
                        {"events": [{"reward": 1.0, "input_tokens": "many"}]},
                    ]
                },
            )
        ),
        422,
        "invalid_rollout",
        "input_tokens",
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


def test_messages_name_json_types_not_python_ones(http: httpx.Client) -> None:
    # They said "got NoneType", "got str": Python's names for JSON's null and strings.
    cases = [
        (b'"a string"', "a RolloutResponse is a JSON object, not a string"),
        (b"null", "a RolloutResponse is a JSON object, not null"),
        (
            orjson.dumps(_with(("trace",), {"event_history": [{"reward": "x"}]})),
            "expected a number or null, got a string",
        ),
        (
            orjson.dumps(_with(("trace",), {"event_history": [{"terminated": [1]}]})),
            "expected true, false or null, got an array",
        ),
    ]
    for body, needle in cases:
        response = http.post("/v1/rollouts", content=body)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        messages = [error["message"], *(e["message"] for e in error.get("errors", []))]
        assert any(needle in m for m in messages), (needle, messages)
        for python_name in ("NoneType", " str", " list", " dict", " bool", " int", " float"):
            assert not any(m.endswith(python_name) for m in messages), messages


def test_wrong_content_type_is_415(http: httpx.Client, engine: Engine) -> None:
    response = http.post(
        "/v1/rollouts", content=orjson.dumps(_valid()), headers={"Content-Type": "text/plain"}
    )
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert set(row_counts(engine).values()) == {0}


def test_unknown_content_encoding_is_415(http: httpx.Client, engine: Engine) -> None:
    for encoding in ("br", "gzip, br", "gzip, gzip"):
        response = http.post(
            "/v1/rollouts",
            content=orjson.dumps(_valid()),
            headers={"Content-Type": "application/json", "Content-Encoding": encoding},
        )
        assert response.status_code == 415, encoding


def test_identity_beside_gzip_is_gzip(http: httpx.Client) -> None:
    # A list of codings in the order applied: identity is none, so this body is gzip's.
    # It was refused 415, naming the whole header as one unknown coding.
    doc = dict(_valid(), run_id="identity-gzip")
    for n, encoding in enumerate(("identity, gzip", "gzip, identity", "GZIP ,")):
        body = dict(doc, run_id=f"identity-gzip-{n}")
        response = http.post(
            "/v1/rollouts",
            content=gzip.compress(orjson.dumps(body)),
            headers={"Content-Type": "application/json", "Content-Encoding": encoding},
        )
        assert response.status_code == 201, (encoding, response.text)


# A body that cannot be decoded is malformed, like one that is not JSON: 400 `invalid_json`
# (the OpenAPI text of 400 says "or a corrupt gzip body"), not 422, which this API keeps for
# well-formed input that is not a valid rollout or request.
@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + b"\xff" * 16, "corrupt"),  # bad deflate
        (gzip.compress(orjson.dumps(_valid()))[:-10], "truncated"),
        (orjson.dumps(_valid()), "corrupt"),  # plain JSON labelled gzip
    ],
    ids=["garbage", "truncated", "not gzip"],
)
@pytest.mark.parametrize("path", ["/v1/rollouts", "/v1/rollouts/batch"])
def test_corrupt_gzip_is_400(
    http: httpx.Client, engine: Engine, body: bytes, problem: str, path: str
) -> None:
    response = http.post(
        path,
        content=body,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    error = response.json()["error"]
    assert error["message"].startswith(f"the gzip body is {problem}"), error
    assert response.status_code == 400, response.text
    assert error["code"] == "invalid_json"
    assert set(row_counts(engine).values()) == {0}


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


# Every table a rollout with trajectories and a full trace writes, in write order.
ROLLOUT_TABLES = (
    "runs",
    "run_documents",
    "trajectories",
    "steps",
    "traces",
    "trace_time_steps",
    "trace_events",
    "trace_messages",
)


@pytest.mark.parametrize("shape", ["as sent", "steps past a padded INSERT"])
def test_failure_mid_rollout_rolls_back_whole(
    http: httpx.Client, engine: Engine, examples: list[Example], shape: str
) -> None:
    # A crafter rollout: trajectories and a full trace with messages, the last rows written.
    ex = min(
        (e for e in examples if e.label["kind"] == "crafter" and e.label["trace_kind"] == "full"),
        key=lambda e: len(e.raw),
    )
    doc = dict(ex.doc, run_id="rollback-probe")
    if shape != "as sent":
        # On PostgreSQL a small rollout's rows go in one statement (db/bulk.py
        # combined_insert), which fails whole: more steps than a padded INSERT takes send
        # each table in a statement of its own, so the messages fail after the run, its
        # steps and the rest were written by earlier statements of the transaction.
        first = dict(doc["trajectories"][0])
        first["steps"] = first["steps"] * (PADDED_MAX_ROWS // len(first["steps"]) + 1)
        doc["trajectories"] = [first, *doc["trajectories"][1:]]
    raw = orjson.dumps(doc)
    with write_fault(engine, "trace_messages", "rollback-probe"):
        # The run, its document, trajectories, steps, trace, time steps and events are
        # written when the first message fails: the whole rollout must be undone. (On a
        # client of its own: the server closes a connection after a 500.)
        with httpx.Client(base_url=http.base_url, timeout=60) as once:
            response = once.post("/v1/rollouts", content=raw)
        assert set(row_counts(engine).values()) == {0}
        assert http.get("/v1/rollouts/rollback-probe").status_code == 404
        assert response.status_code == 500, response.text
        assert response.json()["error"]["code"] == "internal_error"
    # Without the fault the same request writes rows in every one of those tables.
    assert http.post("/v1/rollouts", content=raw).status_code == 201
    counts = row_counts(engine)
    assert {t: counts[t] > 0 for t in ROLLOUT_TABLES} == dict.fromkeys(ROLLOUT_TABLES, True)
    if shape != "as sent":
        assert counts["steps"] > PADDED_MAX_ROWS  # past the combined statement, then


@pytest.mark.parametrize("route", ["/v1/rollouts", "/v1/rollouts/batch"])
def test_a_connection_lost_mid_write_is_answered_503_and_leaves_nothing(
    backend: str, http: httpx.Client, engine: Engine, examples: list[Example], route: str
) -> None:
    """The database ending the writer's connection in the middle of a rollout's bulk write
    is a transient failure: 503 `database_unavailable` with Retry-After (not a 500), on
    the single and the batch route, nothing of the rollout stored, and the next post is
    written on a fresh connection."""
    if backend != "postgresql":
        pytest.skip("a SQLite connection is a file: no server can end it")
    ex = min(
        (e for e in examples if e.label["kind"] == "crafter" and e.label["trace_kind"] == "full"),
        key=lambda e: len(e.raw),
    )
    raw = orjson.dumps(dict(ex.doc, run_id="lost-connection-probe"))
    headers = {"content-type": "application/x-ndjson"} if route.endswith("batch") else {}
    with write_fault(engine, "trace_messages", "lost-connection-probe", disconnect=True):
        response = http.post(route, content=raw, headers=headers)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "database_unavailable"
        assert response.headers["retry-after"]
        assert set(row_counts(engine).values()) == {0}
    assert http.post(route, content=raw, headers=headers).status_code in (201, 207)
    assert http.get("/v1/rollouts/lost-connection-probe").status_code == 200


def test_examples_still_ingest_after_refusals(http: httpx.Client, examples: list[Example]) -> None:
    assert http.post("/v1/rollouts", content=b"{").status_code == 400
    assert http.post("/v1/rollouts", content=examples[0].raw).status_code == 201

"""The ingest lane (api/lane.py) serves clean single posts from the outermost middleware
(issue 19): every request answers, counts and charges exactly as on the app's whole path,
and what the lane does not take goes down that path unchanged.

Two live servers (real uvicorn, real sockets) over one store: one as `tracestore serve`
builds the app, one with the lane off."""

from __future__ import annotations

import base64
import gzip
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from tests.conftest import Database, LiveServer, minimal_rollout, write_fault
from tracestore.api.lane import IngestLane
from tracestore.api.limits import InflightLimit, Ticket
from tracestore.api.routes.rollouts import _GROUP
from tracestore.ingest.group import GroupCommit
from tracestore.settings import Settings

KEY = "k-lane"


def lane_of(live: LiveServer) -> IngestLane | None:
    """The lane in the server's built middleware stack (None before the first request,
    which builds it, or without a lane)."""
    app = live.server.config.app
    assert isinstance(app, FastAPI)
    node: Any = app.middleware_stack
    while node is not None:
        if isinstance(node, IngestLane):
            return node
        node = getattr(node, "app", None)
    return None


@contextmanager
def two_servers(settings: Settings) -> Iterator[tuple[LiveServer, LiveServer]]:
    """(with the lane, without it) over the store of `settings`."""
    with LiveServer(settings) as lane, LiveServer(settings, ingest_lane=False) as whole:
        yield lane, whole


@pytest.fixture(params=["open", "keyed"])
def pair(
    request: pytest.FixtureRequest, database: Database, engine: Engine
) -> Iterator[tuple[LiveServer, LiveServer, bool]]:
    keyed = request.param == "keyed"
    settings = Settings(
        database_url=database.url,
        api_keys=[f"ci:{KEY}"] if keyed else [],
        max_body_bytes=64 * 1024,
        # Small enough that a body of ~20 KB of `{}` passes the byte limit and not this.
        max_parsed_bytes=1_000_000,
    )
    with two_servers(settings) as (lane, whole):
        yield lane, whole, keyed


def _chunks(raw: bytes) -> Iterator[bytes]:
    yield raw[:10]
    yield raw[10:]


def _cases(run_id: str) -> list[tuple[str, dict[str, Any], bool | None]]:
    """(name, request, whether the lane answers it: None when it may or may not) for
    every kind of single post."""
    raw = orjson.dumps(minimal_rollout(run_id))
    many_objects = orjson.dumps(minimal_rollout(run_id + "-big", filler=[{}] * 12_000))
    return [
        ("created", {"content": raw}, True),
        ("duplicate", {"content": raw}, True),
        ("conflict", {"content": orjson.dumps(minimal_rollout(run_id, reward=0.5))}, True),
        (
            "charset",
            {
                "content": orjson.dumps(minimal_rollout(run_id + "-cs")),
                "headers": {"Content-Type": "application/json; charset=utf-8"},
            },
            True,
        ),
        (
            "no content type",
            {
                "content": orjson.dumps(minimal_rollout(run_id + "-nct")),
                "headers": {"Content-Type": ""},
            },
            True,
        ),
        # Refused by the ingest itself: the lane answers with the app's handlers.
        ("not json", {"content": b"{nope"}, True),
        ("NaN", {"content": raw.replace(b"1.0", b"NaN")}, True),
        ("not a rollout", {"content": b'{"run_id": 5}'}, True),
        ("repeated key", {"content": b'{"run_id": "a", "run_id": "b"}'}, True),
        # ~24 KB: over a socket it may arrive with its head or after it (either path).
        ("parsed size", {"content": many_objects}, None),
        # Refused by what the head says, or read as it streams: the whole path's.
        ("body limit", {"content": b" " * (64 * 1024 + 1)}, False),
        (
            "gzip",
            {
                "content": gzip.compress(orjson.dumps(minimal_rollout(run_id + "-gz"))),
                "headers": {"Content-Encoding": "gzip"},
            },
            False,
        ),
        ("identity", {"content": raw, "headers": {"Content-Encoding": "identity"}}, False),
        ("chunked", {"content": _chunks(orjson.dumps(minimal_rollout(run_id + "-ch")))}, False),
        ("text/plain", {"content": raw, "headers": {"Content-Type": "text/plain"}}, False),
        (
            "two content types",
            {
                "content": orjson.dumps(minimal_rollout(run_id + "-2ct")),
                "headers": [("Content-Type", "text/plain"), ("Content-Type", "application/json")],
            },
            False,
        ),
        ("ndjson", {"content": raw, "headers": {"Content-Type": "application/x-ndjson"}}, False),
        ("empty", {"content": b""}, False),
        ("query", {"content": raw, "params": {"dry_run": "1"}}, False),
    ]


def _comparable(response: httpx.Response, run_id: str) -> tuple[Any, ...]:
    body = response.content.replace(run_id.encode(), b"RUN")
    return (
        response.status_code,
        orjson.loads(body) if body else None,
        response.headers.get("content-type"),
        response.headers.get("www-authenticate"),
        response.headers.get("retry-after"),
    )


_COUNTED = re.compile(
    r'^(tracestore_http_request_duration_seconds_count\{method="POST",[^}]*\}'
    r"|tracestore_ingest_rollouts_total\{[^}]*\}) (\S+)$",
    re.M,
)


def _counted(client: httpx.Client) -> dict[str, float]:
    """Every POST's request count (by route and status) and the ingest outcomes, as
    /metrics has them."""
    return {m[1]: float(m[2]) for m in _COUNTED.finditer(client.get("/metrics").text)}


def test_every_post_answers_and_counts_as_on_the_whole_path(
    pair: tuple[LiveServer, LiveServer, bool],
) -> None:
    lane, whole, keyed = pair
    headers = {"X-API-Key": KEY} if keyed else {}
    with (
        httpx.Client(base_url=lane.url, headers=headers, timeout=60) as a,
        httpx.Client(base_url=whole.url, headers=headers, timeout=60) as b,
    ):
        answered = []
        for (name, request, takes), (_, same, _) in zip(
            _cases("lane-1"), _cases("path-1"), strict=True
        ):
            taken = lane_of(lane)
            before = 0 if taken is None else taken.served  # built at the first request
            answer_a = a.post("/v1/rollouts", **request)
            answer_b = b.post("/v1/rollouts", **same)
            assert _comparable(answer_a, "lane-1") == _comparable(answer_b, "path-1"), name
            taken = lane_of(lane)
            assert taken is not None
            if takes is not None and taken.served > before:
                answered.append(name)
        # The lane answered exactly the clean posts.
        assert answered == [name for (name, _, t) in _cases("x") if t]
        # Stored what both acknowledged.
        assert a.get("/v1/rollouts/lane-1").json() == minimal_rollout("lane-1")
        assert b.get("/v1/rollouts/path-1").json() == minimal_rollout("path-1")
        # The same requests and outcomes counted.
        assert _counted(a) == _counted(b) != {}


def test_keys_are_checked_as_on_the_whole_path(
    pair: tuple[LiveServer, LiveServer, bool],
) -> None:
    lane, whole, keyed = pair
    raw = orjson.dumps(minimal_rollout("key-1"))
    basic = base64.b64encode(f"producer:{KEY}".encode()).decode()
    wrong: list[dict[str, Any]] = [
        {"X-API-Key": "wrong"},
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": b"Basic \xe9"},  # not base64, not even ASCII: 401, never 500
        {"Authorization": "Basic !!!"},
    ]
    right = [{"Authorization": f"Bearer {KEY}"}, {"Authorization": f"Basic {basic}"}]
    answers: dict[str, list[int]] = {}
    for name, live in (("lane", lane), ("whole", whole)):
        with httpx.Client(base_url=live.url, timeout=60) as client:
            answers[name] = [
                client.post("/v1/rollouts", content=raw, headers=headers).status_code
                for headers in wrong + right
            ]
            if keyed:
                refused = client.post("/v1/rollouts", content=raw, headers=wrong[3])
                assert refused.json()["error"]["code"] == "unauthorized"
                assert refused.headers["www-authenticate"].startswith("Bearer")
    if keyed:
        assert answers["lane"] == [401] * len(wrong) + [201, 200]
        assert answers["whole"] == [401] * len(wrong) + [200, 200]
    else:
        assert answers["lane"] == [201] + [200] * (len(wrong) + len(right) - 1)
        assert answers["whole"] == [200] * (len(wrong) + len(right))
    taken = lane_of(lane)
    assert taken is not None
    # Keyed: only the posts with the key; open: every post (no key is asked for).
    assert taken.served == (len(right) if keyed else len(wrong) + len(right))


def _raw_post(url: str, raw: bytes, cuts: list[int], pause: float) -> bytes:
    """POST `raw` over a socket of our own: the head, then the body cut at `cuts`, each
    piece `pause` s after the one before; the whole answer."""
    host, port = url.removeprefix("http://").split(":")
    ends = [*cuts, len(raw)]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(_head(len(raw)))
        for begin, end in zip([0, *cuts], ends, strict=True):
            time.sleep(pause)
            sock.sendall(raw[begin:end])
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


_TIMED = re.compile(
    r'^tracestore_http_request_duration_seconds_sum\{method="POST",route="/v1/rollouts",'
    r'status="201"\} (\S+)$',
    re.M,
)


def test_a_body_after_its_head_is_served_by_the_lane(database: Database, engine: Engine) -> None:
    with LiveServer(Settings(database_url=database.url)) as live:
        raw = orjson.dumps(minimal_rollout("after-head"))
        answer = _raw_post(live.url, raw, [], pause=0.3)
        assert answer.startswith(b"HTTP/1.1 201 "), answer
        taken = lane_of(live)
        assert taken is not None
        assert taken.served == 1
        with httpx.Client(base_url=live.url, timeout=60) as client:
            assert client.get("/v1/rollouts/after-head").json() == minimal_rollout("after-head")
            # Timed from the head: the wait for the body counts.
            assert float(_TIMED.findall(client.get("/metrics").text)[0]) >= 0.3


def test_a_body_still_arriving_goes_down_the_whole_path_with_its_charge(
    database: Database, engine: Engine
) -> None:
    with two_servers(Settings(database_url=database.url)) as (lane, whole):
        answers = []
        for live, run_id in ((lane, "pieces-lane"), (whole, "pieces-path")):
            raw = orjson.dumps(minimal_rollout(run_id))
            answer = _raw_post(live.url, raw, [len(raw) // 2], pause=0.3)
            answers.append(answer.split(b"\r\n", 1)[0])
            with httpx.Client(base_url=live.url, timeout=60) as client:
                assert client.get(f"/v1/rollouts/{run_id}").json() == minimal_rollout(run_id)
                # Timed from the head on both paths: two pauses.
                assert float(_TIMED.findall(client.get("/metrics").text)[0]) >= 0.6
        assert answers == [b"HTTP/1.1 201 Created"] * 2
        taken = lane_of(lane)
        assert taken is not None
        assert taken.served == 0  # handed down the app, which answered
        bound = taken._bound()
        assert bound is not None
        assert (bound.inflight, bound.refused, bound.timed_out) == (0, 0, 0)
        assert not bound._live


def _charged(bound: InflightLimit, size: int) -> list[Ticket]:
    return [ticket for ticket in bound._live.values() if ticket.charge == size]


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_handed_down_post_keeps_the_ticket_the_lane_charged(
    database: Database, engine: Engine
) -> None:
    # The same ticket before and after the hand-down (not released and charged afresh,
    # which would lose its place as the oldest and its clock for the body's rate), and
    # the middleware counts the first half, replayed, on it.
    with LiveServer(Settings(database_url=database.url)) as live:
        with httpx.Client(base_url=live.url, timeout=60) as client:
            client.get("/health")  # builds the stack
        taken = lane_of(live)
        assert taken is not None
        bound = taken._bound()
        assert bound is not None
        raw = orjson.dumps(minimal_rollout("kept-ticket"))
        half = len(raw) // 2
        host, port = live.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(_head(len(raw)))
            # (The GET's ticket may linger a moment after its answer: the one with our charge.)
            _until(lambda: _charged(bound, len(raw)), "the lane did not charge the head")
            (charged,) = _charged(bound, len(raw))
            assert charged.received == 0
            sock.sendall(raw[:half])
            _until(lambda: charged.received == half, "the first half was not counted")
            (held,) = _charged(bound, len(raw))
            assert held is charged
            assert bound.inflight == len(raw)
            sock.sendall(raw[half:])
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 201 "), answer
        assert taken.served == 0
        assert (bound.inflight, bound._live) == (0, {})


def _group(live: LiveServer) -> GroupCommit:
    app = live.server.config.app
    assert isinstance(app, FastAPI)
    group = getattr(app.state, _GROUP, None)
    assert isinstance(group, GroupCommit)
    return group


def test_a_post_refused_before_its_submit_does_not_hold_its_group(
    database: Database, engine: Engine
) -> None:
    # A group waits (up to the group-commit wait) for a post whose body is arriving. When
    # that post is then refused before it joins (413 on its parsed size here), the group
    # is written at once, not after the wait: a minute here, so waiting it out fails.
    settings = Settings(
        database_url=database.url, max_parsed_bytes=100_000, group_commit_wait_ms=60_000
    )
    too_many = orjson.dumps(minimal_rollout("refused-late", filler=[{}] * 3_000))
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=120) as client:
        client.get("/health")  # builds the stack
        taken = lane_of(live)
        assert taken is not None
        bound = taken._bound()
        assert bound is not None
        host, port = live.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=120) as sock:
            sock.sendall(_head(len(too_many)))
            _until(lambda: _charged(bound, len(too_many)), "the lane did not take the head")
            done: list[httpx.Response] = []
            # Down the app's path (the lane takes no Content-Encoding), so that the lane
            # answers the refused post alone: `served` counts it and nothing else.
            other = threading.Thread(
                target=lambda: done.append(
                    client.post(
                        "/v1/rollouts",
                        json=minimal_rollout("joined-early"),
                        headers={"Content-Encoding": "identity"},
                    )
                )
            )
            other.start()
            # The other post joins the group, which then waits for the one arriving.
            _until(lambda: len(_group(live)._pending) == 1, "the other post did not join")
            assert _group(live)._timer is not None
            sock.sendall(too_many)  # whole, in one piece: the lane reads it, then refuses
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            refused_at = time.monotonic()
        assert answer.startswith(b"HTTP/1.1 413 "), answer
        # Refused by the lane itself (handed down, the app's own path would kick the group).
        other.join(timeout=30)
        assert taken.served == 1
        assert not other.is_alive(), "the group waited for the refused post"
        assert time.monotonic() - refused_at < 30
        assert [r.status_code for r in done] == [201]


def test_a_fault_inside_the_write_answers_as_on_the_whole_path(
    database: Database, engine: Engine
) -> None:
    with two_servers(Settings(database_url=database.url)) as (lane, whole):
        answers = []
        for live, run_id in ((lane, "fault-lane0"), (whole, "fault-path0")):
            with (
                write_fault(engine, "steps", run_id),
                httpx.Client(base_url=live.url, timeout=60) as client,
            ):
                response = client.post("/v1/rollouts", json=minimal_rollout(run_id))
                answers.append(_comparable(response, run_id))
                assert client.get(f"/v1/rollouts/{run_id}").status_code == 404
        assert answers[0] == answers[1]
        assert answers[0][0] >= 500


@contextmanager
def writes_held(engine: Engine) -> Iterator[None]:
    """While open, another connection holds the store's write lock (SQLite) or the runs
    table (PostgreSQL): a write waits."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.exec_driver_sql("BEGIN")
            conn.exec_driver_sql("LOCK TABLE runs IN EXCLUSIVE MODE")
            try:
                yield
            finally:
                conn.exec_driver_sql("ROLLBACK")
        return
    # The driver's own connection: SQLAlchemy's would have begun a transaction already.
    lock = sqlite3.connect(str(engine.url.database), isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            lock.execute("ROLLBACK")
    finally:
        lock.close()


def test_a_post_in_the_lane_holds_its_bytes_against_the_in_flight_bound(
    database: Database, engine: Engine
) -> None:
    first = orjson.dumps(minimal_rollout("held"))
    second = orjson.dumps(minimal_rollout("refused"))
    # Room for the first body, not for both: the oldest request is never refused.
    settings = Settings(database_url=database.url, max_inflight_bytes=len(first) + 10)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        assert client.post("/v1/rollouts", json=minimal_rollout("warm")).status_code == 201
        taken = lane_of(live)
        assert taken is not None
        bound = taken._bound()
        assert isinstance(bound, InflightLimit)
        results: dict[str, httpx.Response] = {}
        with writes_held(engine):
            held = threading.Thread(
                target=lambda: results.setdefault(
                    "held", client.post("/v1/rollouts", content=first)
                )
            )
            held.start()
            deadline = time.monotonic() + 10
            while bound.inflight != len(first):
                assert time.monotonic() < deadline, "the held post never charged the bound"
                time.sleep(0.01)
            with httpx.Client(base_url=live.url, timeout=60) as other:
                refused = other.post("/v1/rollouts", content=second)
        held.join(timeout=60)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "overloaded"
        assert results["held"].status_code == 201, results["held"].text
        assert bound.inflight == 0
        assert taken.served == 2  # the warm-up and the held post
        assert client.get("/v1/rollouts/refused").status_code == 404


def _head_only(url: str, size: int) -> tuple[bytes, float]:
    """Send a post's head declaring `size` body bytes and none of them; the answer, and
    how long it took."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        started = time.monotonic()
        sock.sendall(_head(size, close=False))
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer, time.monotonic() - started


def test_a_body_that_never_comes_is_cut_as_on_the_whole_path(
    database: Database, engine: Engine
) -> None:
    settings = Settings(database_url=database.url, body_timeout=1.0)
    with two_servers(settings) as (lane, whole):
        answers = []
        for live in (lane, whole):
            with httpx.Client(base_url=live.url, timeout=60) as client:
                client.get("/health")  # builds the stack
                answer, took = _head_only(live.url, 500)
                assert 1.0 <= took < 8.0, took
                head, _, body = answer.partition(b"\r\n\r\n")
                answers.append((head.split(b"\r\n")[0], orjson.loads(body)))
                assert (
                    _counted(client).get(
                        'tracestore_http_request_duration_seconds_count{method="POST",'
                        'route="/v1/rollouts",status="408"}'
                    )
                    == 1.0
                )
        assert answers[0] == answers[1]
        assert answers[0][0] == b"HTTP/1.1 408 Request Timeout"
        assert answers[0][1]["error"]["code"] == "request_timeout"
        taken = lane_of(lane)
        assert taken is not None
        bound = taken._bound()
        assert bound is not None
        assert bound.inflight == 0
        assert bound.timed_out == 1


def _exchange(url: str, data: bytes, pause_after: bytes | None = None, rest: bytes = b"") -> bytes:
    """Send `data` on a socket of our own (then, once `pause_after` was read, `rest`),
    and read until the server closes; everything it sent."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(data)
        answer = b""
        if pause_after is not None:
            while pause_after not in answer:
                chunk = sock.recv(65536)
                assert chunk, answer
                answer += chunk
            sock.sendall(rest)
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _head(size: int, *extra: str, close: bool = True) -> bytes:
    """A single post's head declaring a JSON body of `size` bytes (`extra` header lines)."""
    lines = [
        "POST /v1/rollouts HTTP/1.1",
        "Host: lane",
        "Content-Type: application/json",
        f"Content-Length: {size}",
        *extra,
        *(["Connection: close"] if close else []),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_expect_100_continue_and_pipelined_posts(database: Database, engine: Engine) -> None:
    with LiveServer(Settings(database_url=database.url)) as live:
        raw = orjson.dumps(minimal_rollout("continued"))
        # The client waits for 100 Continue before it sends the body.
        answer = _exchange(live.url, _head(len(raw), "Expect: 100-continue"), b"100 Continue", raw)
        assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 "), answer
        # Two posts in one write: answered in order, each stored.
        first, second = (orjson.dumps(minimal_rollout(f"piped-{i}")) for i in (1, 2))
        piped = _head(len(first), close=False) + first + _head(len(second)) + second
        answer = _exchange(live.url, piped)
        statuses = re.findall(rb"HTTP/1.1 (\d+) ", answer)
        assert statuses == [b"201", b"201"], answer
        assert answer.index(b"piped-1") < answer.index(b"piped-2")
        with httpx.Client(base_url=live.url, timeout=60) as client:
            for run_id in ("continued", "piped-1", "piped-2"):
                assert client.get(f"/v1/rollouts/{run_id}").json() == minimal_rollout(run_id)
        taken = lane_of(live)
        assert taken is not None
        assert taken.served == 3


def test_a_store_too_busy_answers_as_on_the_whole_path(database: Database, engine: Engine) -> None:
    url = database.url
    if engine.dialect.name == "postgresql":
        # A lock held past the lock timeout (30 s by default: db/engine.py).
        limited = make_url(url).update_query_dict({"options": "-c lock_timeout=500"})
        url = limited.render_as_string(hide_password=False)
    settings = Settings(database_url=url, db_wait=0.5)
    with two_servers(settings) as (lane, whole):
        answers = []
        for live, run_id in ((lane, "busy-lane0"), (whole, "busy-path0")):
            with httpx.Client(base_url=live.url, timeout=60) as client:
                assert client.get("/health").status_code == 200
                with writes_held(engine):
                    response = client.post("/v1/rollouts", json=minimal_rollout(run_id))
                answers.append(_comparable(response, run_id))
                assert client.get(f"/v1/rollouts/{run_id}").status_code == 404
        assert answers[0] == answers[1]
        assert answers[0][0] == 503, answers[0]
        assert answers[0][4] is not None  # Retry-After
        taken = lane_of(lane)
        assert taken is not None
        assert taken.served == 1

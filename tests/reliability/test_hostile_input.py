"""Hostile input: named attacks and hypothesis fuzzing of the ingest path, on a real server.

Nothing a client sends may produce a 500, a hang, or a partial rollout; every refusal uses
the error shape and writes nothing. Where the README decides a behaviour (NaN refused,
lone surrogates refused, ...) the exact status and code are checked; where it leaves a
choice (duplicate keys, deep nesting inside a value) any clear answer passes as long as
it is consistent: accepted means stored whole and served back byte for byte.
"""

from __future__ import annotations

import gzip
import random
import secrets
from dataclasses import dataclass, field
from http.client import HTTPConnection
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests import strategies as ts
from tests.conftest import minimal_rollout
from tests.reliability.conftest import Target
from tests.reliability.harness import (
    FIGURES,
    LOOPBACK,
    SIZE,
    count_response,
    example_docs,
    is_error_shape,
    partial_runs,
    stored_documents,
)
from tracestore.client import path_segment

MIB = 1024 * 1024
TIMEOUT_S = 60.0  # a request that takes longer is a hang
# No shrinking: a failure is reported as found, and a failing run stays bounded in time.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


def _rollout(run_id: str, **extra: Any) -> dict[str, Any]:
    return minimal_rollout(run_id, **extra)


def _with_raw(doc: dict[str, Any], raw_value: bytes) -> bytes:
    """The document's bytes with the string "@@" replaced by raw JSON text."""
    return orjson.dumps(doc).replace(b'"@@"', raw_value)


def _nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"{}" + b"}" * depth


@dataclass(frozen=True)
class Case:
    """One named attack and the answers allowed."""

    name: str
    body: bytes
    expect: tuple[int, ...]
    code: str | None = None  # the error code when refused
    run_id: str | None = None  # accepted under this run_id: served back byte for byte
    path: str = "/v1/rollouts"
    headers: dict[str, str] = field(default_factory=dict)


def _deep_step_obs(depth: int) -> bytes:
    doc = _rollout(f"deep-obs-{depth}")
    doc["trajectories"][0]["steps"][0]["obs"] = "@@"
    return _with_raw(doc, _nested(depth))


def _deep_trace_event(depth: int) -> bytes:
    doc = _rollout(f"deep-event-{depth}")
    doc["trace"] = {
        "session_time_steps": [{"events": [{"reward": 1.0, "system_state_before": "@@"}]}]
    }
    return _with_raw(doc, _nested(depth))


def _huge_id_field(name: str) -> bytes:
    # Random hex: incompressible, so it reaches an index as it is (a PostgreSQL btree
    # entry holds at most ~2.7 KB).
    value = secrets.token_hex(6000)
    doc = _rollout(f"huge-{name}")
    if name == "correlation_id":
        doc["trace_correlation_id"] = value
    elif name == "inference_url_cid":
        doc["trajectories"][0]["inference_url"] = f"https://h/v1/chat?cid={value}"
    elif name in ("session_id", "model_name", "event_type"):
        # Indexed trace columns: the session id, and an LM call event's model / type.
        event = {"model_name": "m", "provider": "p", "input_tokens": 1}
        trace: dict[str, Any] = {"session_id": "s", "session_time_steps": [{"events": [event]}]}
        (trace if name == "session_id" else event)[name] = value
        doc["trace"] = trace
    else:
        doc["trajectories"][0][name] = value
    return orjson.dumps(doc)


EDGE_DATETIMES = ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "0001-01-01 00:00:00Z"]


def _edge_datetime(when: str) -> bytes:
    doc = _rollout(f"when-{EDGE_DATETIMES.index(when)}")
    doc["trace"] = {
        "session_id": "s",
        "created_at": when,
        "session_time_steps": [{"step_id": "decision_0", "timestamp": when, "events": []}],
    }
    return orjson.dumps(doc)


# 1024 characters (the run_id limit) of 4-byte UTF-8 (CJK extension B), drawn at random
# with a fixed seed: 4 KB that do not compress, past a PostgreSQL btree entry's 2704 bytes.
_RNG = random.Random(1024)
WIDE_ID = "".join(chr(_RNG.randrange(0x20000, 0x2A6E0)) for _ in range(1024))


def _gzip_members(*parts: bytes) -> bytes:
    return b"".join(gzip.compress(p) for p in parts)


REFUSED_JSON = (400,)
ANSWER = (201, 400, 422)  # any clear answer; never 500

CASES: list[Case] = [
    # Deep nesting
    Case(
        "100k nested arrays",
        b'{"run_id":"x","d":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        REFUSED_JSON,
        "invalid_json",
    ),
    Case(
        "2000 nested objects",
        b'{"run_id":"deep-2000","d":' + _nested(2000) + b"}",
        REFUSED_JSON,
        "invalid_json",
    ),
    Case(
        "nesting 300 deep in an undeclared key",
        _with_raw(_rollout("deep-top-300", d="@@"), _nested(300)),
        ANSWER,
        run_id="deep-top-300",
    ),
    Case("nesting 300 deep in a step obs", _deep_step_obs(300), ANSWER, run_id="deep-obs-300"),
    Case(
        "nesting 300 deep in a trace event", _deep_trace_event(300), ANSWER, run_id="deep-event-300"
    ),
    # Datetimes a producer may send that do not fit once converted to UTC
    *[
        Case(f"trace created_at {when}", _edge_datetime(when), ANSWER, run_id=f"when-{i}")
        for i, when in enumerate(EDGE_DATETIMES)
    ],
    # Huge strings
    Case(
        "3 MiB string",
        orjson.dumps(_rollout("huge-string", s="x" * (3 * MIB))),
        (201,),
        run_id="huge-string",
    ),
    Case(
        "5 MiB string (over the limit)",
        orjson.dumps(_rollout("too-huge", s="x" * (5 * MIB))),
        (413,),
        "payload_too_large",
    ),
    Case("1025-character run_id", orjson.dumps(_rollout("r" * 1025)), (422,), "invalid_rollout"),
    Case(
        "1024 four-byte characters as run_id (4 KB)",
        orjson.dumps(_rollout(WIDE_ID)),
        ANSWER,
        run_id=WIDE_ID,
    ),
    Case("12 KB random env_id", _huge_id_field("env_id"), ANSWER, run_id="huge-env_id"),
    Case("12 KB random policy_id", _huge_id_field("policy_id"), ANSWER, run_id="huge-policy_id"),
    Case(
        "12 KB random correlation id",
        _huge_id_field("correlation_id"),
        ANSWER,
        run_id="huge-correlation_id",
    ),
    Case(
        "12 KB random cid in an inference URL",
        _huge_id_field("inference_url_cid"),
        ANSWER,
        run_id="huge-inference_url_cid",
    ),
    *[
        Case(f"12 KB random {name}", _huge_id_field(name), ANSWER, run_id=f"huge-{name}")
        for name in ("session_id", "model_name", "event_type")
    ],
    # Huge arrays
    Case(
        "500k-element array",
        orjson.dumps(_rollout("huge-array", a=list(range(500_000)))),
        (201,),
        run_id="huge-array",
    ),
    Case(
        "30k steps",
        orjson.dumps(
            _rollout(
                "many-steps",
                trajectories=[
                    {
                        "env_id": "e",
                        "policy_id": "p",
                        "steps": [{"obs": {}}] * 30_000,
                        "length": 30_000,
                        "inference_url": "",
                    }
                ],
            )
        ),
        (201,),
        run_id="many-steps",
    ),
    Case(
        "10001 items in a batch",
        b"\n".join([b"{}"] * 10_001),
        (413,),
        "payload_too_large",
        path="/v1/rollouts/batch",
        headers={"Content-Type": "application/x-ndjson"},
    ),
    # NaN / Infinity
    *[
        Case(
            f"{token.decode()} token",
            _with_raw(_rollout("nan", x="@@"), token),
            REFUSED_JSON,
            "invalid_json",
        )
        for token in (b"NaN", b"Infinity", b"-Infinity", b"nan", b"inf", b"1e400")
    ],
    # NUL and surrogates
    Case(
        "escaped NUL in values and keys",
        orjson.dumps(_rollout("nul-values", x={"k\u0000": "v\u0000", "e": "\u0000"})),
        (201,),
        run_id="nul-values",
    ),
    Case("escaped NUL in run_id", orjson.dumps(_rollout("a\u0000b")), (422,), "invalid_rollout"),
    Case(
        "raw control byte in a string",
        _with_raw(_rollout("ctl", x="@@"), b'"a\x00b"'),
        REFUSED_JSON,
        "invalid_json",
    ),
    Case(
        "escaped lone high surrogate",
        _with_raw(_rollout("sur", x="@@"), b'"\\ud800"'),
        REFUSED_JSON,
        "invalid_json",
    ),
    Case(
        "escaped lone low surrogate",
        _with_raw(_rollout("sur", x="@@"), b'"\\udc00x"'),
        REFUSED_JSON,
        "invalid_json",
    ),
    Case(
        "escaped surrogate pair (valid)",
        _with_raw(_rollout("pair", x="@@"), b'"\\ud83d\\ude00"'),
        (201,),
        run_id="pair",
    ),
    Case(
        "UTF-8-encoded surrogate (CESU)",
        _with_raw(_rollout("cesu", x="@@"), b'"\xed\xa0\x80"'),
        REFUSED_JSON,
        "invalid_json",
    ),
    # Invalid UTF-8
    *[
        Case(
            f"invalid UTF-8 {bad!r}",
            _with_raw(_rollout("utf8", x="@@"), b'"' + bad + b'"'),
            REFUSED_JSON,
            "invalid_json",
        )
        for bad in (b"\xff", b"\xc3\x28", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80")
    ],
    Case(
        "UTF-8 BOM before the JSON",
        b"\xef\xbb\xbf" + orjson.dumps(_rollout("bom")),
        ANSWER,
        run_id="bom",
    ),
    # Wrong Content-Type
    *[
        Case(
            f"Content-Type {ct}",
            orjson.dumps(_rollout("ctype")),
            (415,),
            "unsupported_media_type",
            headers={"Content-Type": ct},
        )
        for ct in (
            "text/plain",
            "application/xml",
            "multipart/form-data; boundary=x",
            "application/x-www-form-urlencoded",
        )
    ],
    Case(
        "batch as text/csv",
        orjson.dumps([_rollout("csv")]),
        (415,),
        "unsupported_media_type",
        path="/v1/rollouts/batch",
        headers={"Content-Type": "text/csv"},
    ),
    # gzip bombs and broken gzip
    Case(
        "gzip bomb: 10 MiB of zeros in 10 KB",
        gzip.compress(b"0" * (10 * MIB)),
        (413,),
        "payload_too_large",
        headers={"Content-Encoding": "gzip"},
    ),
    Case(
        "gzip bomb in concatenated members",
        _gzip_members(b" " * (3 * MIB), b" " * (3 * MIB)),
        (413,),
        "payload_too_large",
        headers={"Content-Encoding": "gzip"},
    ),
    Case(
        "gzip inside gzip (decoded once)",
        gzip.compress(gzip.compress(b"0" * (10 * MIB))),
        REFUSED_JSON,
        "invalid_json",
        headers={"Content-Encoding": "gzip"},
    ),
    Case(
        "gzip bomb to the batch route",
        gzip.compress(b"\n" * (10 * MIB)),
        (413,),
        "payload_too_large",
        path="/v1/rollouts/batch",
        headers={"Content-Encoding": "gzip", "Content-Type": "application/x-ndjson"},
    ),
    Case(
        "truncated gzip",
        gzip.compress(orjson.dumps(_rollout("trunc")))[:-10],
        REFUSED_JSON,
        "invalid_json",
        headers={"Content-Encoding": "gzip"},
    ),
    Case(
        "plain body labelled gzip",
        orjson.dumps(_rollout("labelled")),
        REFUSED_JSON,
        "invalid_json",
        headers={"Content-Encoding": "gzip"},
    ),
    *[
        Case(
            f"Content-Encoding {enc}",
            orjson.dumps(_rollout("enc")),
            (415,),
            "unsupported_media_type",
            headers={"Content-Encoding": enc},
        )
        for enc in ("br", "deflate", "gzip, gzip", "compress")
    ],
    # Trailing garbage
    Case(
        "trailing garbage", orjson.dumps(_rollout("tg")) + b"garbage", REFUSED_JSON, "invalid_json"
    ),
    Case(
        "two documents in one body", orjson.dumps(_rollout("two")) * 2, REFUSED_JSON, "invalid_json"
    ),
    Case(
        "trailing NUL byte", orjson.dumps(_rollout("tnul")) + b"\x00", REFUSED_JSON, "invalid_json"
    ),
    Case(
        "trailing whitespace (valid)",
        orjson.dumps(_rollout("tws")) + b" \n\t",
        (201,),
        run_id="tws",
    ),
    # Repeated keys: refused (issue 18), the stored bytes and the typed rows would disagree.
    Case(
        "duplicate run_id keys",
        b'{"run_id":"dup-first","run_id":"dup-last",' + orjson.dumps(_rollout("z"))[14:],
        (422,),
        "invalid_rollout",
    ),
    Case(
        "duplicate nested keys",
        orjson.dumps(_rollout("dup-nested"))[:-1] + b',"metrics":{"episode_returns":[2.0],'
        b'"mean_return":2.0,"num_steps":1}}',
        (422,),
        "invalid_rollout",
    ),
    Case(
        "duplicate keys deep in a batch item",
        b'[{"run_id":"dup-deep","x":{"a":[{"k":1,"k":2}]}}]',
        (207,),
        path="/v1/rollouts/batch",
    ),
    Case("dot-only run_id", orjson.dumps(_rollout("..")), (422,), "invalid_rollout"),
    Case(
        "empty batch",
        b"[]",
        (422,),
        "empty_batch",
        path="/v1/rollouts/batch",
    ),
]

SQL_AND_PATHS = [
    "'; DROP TABLE runs; --",
    "1' OR '1'='1",
    '" OR ""="',
    "x'); DELETE FROM run_documents; --",
    "%27%20OR%201%3D1",
    "../../../../etc/passwd",
    "..\\..\\windows\\win.ini",
    "run/../../admin",
    "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "~/.ssh/id_rsa",
    "$(rm -rf /)",
    "{{7*7}}",
    "<script>alert(1)</script>",
    "line\nbreak/and slash",
    "\nleading newline",
    "trailing/newline\n",
]


def _check_refusal(response: httpx.Response, code: str | None) -> None:
    body = response.json()
    assert is_error_shape(body), response.text[:300]
    if code is not None:
        assert body["error"]["code"] == code, body


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_named_attack_gets_a_clear_answer(target: Target, case: Case) -> None:
    headers = {"Content-Type": "application/json", **case.headers}
    with target.client() as http:
        response = http.post(case.path, content=case.body, headers=headers)
        count_response(f"hostile/{target.backend}", response)
        FIGURES.add(f"hostile/{target.backend}", named_cases=1)
        assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
        assert response.status_code in case.expect, response.text[:500]
        if response.status_code >= 400:
            _check_refusal(response, case.code)
            return
        if case.run_id is not None:
            assert response.json()["run_id"] == case.run_id
            stored = http.get(f"/v1/rollouts/{path_segment(case.run_id)}")
            assert stored.status_code == 200
            assert stored.content == case.body.strip() or stored.content == case.body


@pytest.mark.parametrize("run_id", SQL_AND_PATHS)
def test_sql_and_path_strings_in_run_ids_are_plain_data(target: Target, run_id: str) -> None:
    raw = orjson.dumps(_rollout(run_id))
    quoted = path_segment(run_id)
    with target.client() as http:
        first = http.post("/v1/rollouts", content=raw)
        count_response(f"hostile/{target.backend}", first)
        assert first.status_code in (200, 201), first.text
        assert first.json()["run_id"] == run_id
        stored = http.get(f"/v1/rollouts/{quoted}")
        assert stored.status_code == 200, f"{run_id!r} was stored but GET says {stored.text}"
        assert stored.content == raw
        for tail in ("/trace", "/trajectories", "/drift"):
            response = http.get(f"/v1/rollouts/{quoted}{tail}")
            count_response(f"hostile/{target.backend}", response)
            assert response.status_code == 200, (tail, response.text[:300])


@pytest.mark.parametrize("run_id", ["x/trace", "x/trajectories", "a/b/drift", "x/trace\n"])
def test_run_ids_that_end_like_a_route_under_a_run_are_refused(target: Target, run_id: str) -> None:
    # GET /v1/rollouts/x%2Ftrace is the trace of run "x": such an id could never be fetched.
    with target.client() as http:
        response = http.post("/v1/rollouts", content=orjson.dumps(_rollout(run_id)))
        count_response(f"hostile/{target.backend}", response)
        assert response.status_code == 422, response.text[:300]
        _check_refusal(response, "invalid_rollout")
        assert "must not end with" in response.json()["error"]["message"]


QUERY_ATTACKS = [
    *SQL_AND_PATHS,
    "x" * 4000,
    "\u0000",
    "a\u0000b",
    "%00",
    "\U0001f600",
    "\t\n",
]


@pytest.mark.parametrize("value", QUERY_ATTACKS, ids=range(len(QUERY_ATTACKS)))
def test_sql_and_path_strings_in_query_parameters_are_plain_data(
    target: Target, value: str
) -> None:
    section = f"hostile/{target.backend}"
    quoted = path_segment(value)
    with target.client() as http:
        before = http.get("/v1/rollouts", params={"limit": 1000}).json()["items"]
        for name in ("correlation_id", "env_id", "policy_id"):
            response = http.get("/v1/rollouts", params={name: value})
            count_response(section, response)
            assert response.status_code == 200, (name, response.text[:300])
            assert response.json()["items"] == []
        # trace_kind names one of a few kinds: anything else is refused, naming them.
        for name in ("since", "until", "cursor", "limit", "has_trajectories", "trace_kind"):
            response = http.get("/v1/rollouts", params={name: value})
            count_response(section, response)
            assert response.status_code == 422, (name, response.text[:300])
            _check_refusal(response, "invalid_request")
        response = http.get(f"/v1/correlations/{quoted}")
        count_response(section, response)
        assert response.status_code == 404, response.text[:300]
        _check_refusal(response, "not_found")
        # The same strings were stored as run_ids above: found as data, or not found.
        response = http.get(f"/v1/rollouts/{quoted}")
        count_response(section, response)
        if response.status_code == 200:
            assert orjson.loads(response.content)["run_id"] == value
        else:
            assert response.status_code == 404, response.text[:300]
            _check_refusal(response, "not_found")
        response = http.get("/v1/drift", params={"kind": value})
        count_response(section, response)
        assert response.status_code in (200, 422), response.text[:300]
        # Nothing was deleted or changed by any of it.
        assert http.get("/v1/rollouts", params={"limit": 1000}).json()["items"] == before
        FIGURES.add(section, named_cases=1)


EXTREME_WINDOWS = [
    {"until": "0001-01-01T00:00:00Z", "days": "1"},
    {"since": "9999-12-31T23:59:59Z", "days": "1"},
    {"since": "0001-01-01T00:00:00+14:00"},
    {"until": "9999-12-31T23:59:59-14:00"},
    {"days": "99999999"},
    {"days": "-1"},
    {"since": "2030-01-01T00:00:00Z", "until": "2020-01-01T00:00:00Z"},
]


def test_extreme_time_windows_on_every_route_that_takes_one(target: Target) -> None:
    """since/until/days at the ends of the calendar: a clear answer, never a 500."""
    schema = httpx.get(target.server.url + "/openapi.json", timeout=30).json()
    routes = [
        (path, {p["name"] for p in op.get("parameters", []) if p.get("in") == "query"})
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
        if method == "get" and "{" not in path
    ]
    windowed = [(path, names) for path, names in routes if names & {"since", "until", "days"}]
    assert windowed, "some route takes a time window"
    problems = []
    for path, names in windowed:
        for window in EXTREME_WINDOWS:
            params = {k: v for k, v in window.items() if k in names}
            if not params:
                continue
            with target.client() as http:  # a 500 closes the connection: one client each
                response = http.get(path, params=params)
            count_response(f"hostile/{target.backend}", response)
            FIGURES.add(f"hostile/{target.backend}", named_cases=1)
            if response.status_code >= 500:
                problems.append(f"GET {path} {params}: {response.status_code}")
            elif response.status_code >= 400 and not is_error_shape(response.json()):
                problems.append(f"GET {path} {params}: not the error shape")
    assert not problems, problems


@pytest.mark.parametrize(
    "path",
    [
        "/v1/rollouts/..%2F..%2F..%2Fetc%2Fpasswd",
        "/v1/rollouts/%2e%2e/%2e%2e/etc/passwd",
        "/reports/drift/../../etc/passwd",
        "/docs/../../etc/passwd",
        "/static/..%2f..%2fetc%2fpasswd",
        "/%2e%2e/%2e%2e/etc/passwd",
    ],
)
def test_path_traversal_in_urls_reaches_no_file(target: Target, path: str) -> None:
    # http.client sends the path as written (httpx would resolve the dot segments first).
    conn = HTTPConnection(LOOPBACK, target.server.port, timeout=TIMEOUT_S)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        status, content = answer.status, answer.read()
    finally:
        conn.close()
    FIGURES.add(f"hostile/{target.backend}", responses=1, server_errors=int(status >= 500))
    assert status in (404, 405, 422), content[:300]
    assert b"root:" not in content
    assert is_error_shape(orjson.loads(content))


# --- hypothesis fuzzing of the ingest path ----------------------------------------------

TOKENS = [
    b"NaN",
    b"Infinity",
    b"-",
    b"1e999",
    b"\\ud800",
    b"\\u0000",
    b"\x00",
    b"\xff",
    b"\xed\xa0\x80",
    b"{",
    b"}",
    b"[",
    b"]",
    b'"',
    b"\\",
    b",",
    b":",
    b"null",
    b"true",
    b"1" * 40,
    b"-0",
    b"\n",
    b'"run_id"',
    b'"trajectories"',
    b'"metrics"',
    b'"trace"',
    b"[]",
    b"{}",
    b'""',
    b"\r\n",
]
CONTENT_TYPES = [
    "application/json",
    "",
    "text/plain",
    "application/x-ndjson",
    "application/json; charset=utf-8",
    "application/vnd.tracestore+json",
    "application/octet-stream",
    "text/json",
]
_SMALL_EXAMPLES = [orjson.dumps(d) for d in example_docs() if len(orjson.dumps(d)) < 20_000][:12]


@st.composite
def _mutated(draw: st.DrawFn, base: bytes) -> bytes:
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "delete", "insert", "truncate", "repeat"]))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif op == "insert":
            data[at:at] = draw(st.sampled_from(TOKENS))
        elif op == "truncate":
            del data[at:]
        else:
            data[at:at] = data[at : at + draw(st.integers(1, 64))]
    return bytes(data)


@st.composite
def _bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "example", "generated", "json"]))
    if kind == "bytes":
        return draw(st.binary(max_size=600))
    if kind == "json":
        return orjson.dumps(draw(ts.json_values))
    base = (
        draw(st.sampled_from(_SMALL_EXAMPLES))
        if kind == "example"
        else orjson.dumps(draw(ts.rollouts()))
    )
    if draw(st.booleans()):
        return base  # valid: exercises created / duplicate / conflict too
    return draw(_mutated(base))


@dataclass(frozen=True)
class FuzzRequest:
    """One fuzzed request to an ingest route."""

    path: str
    body: bytes
    headers: dict[str, str]


@st.composite
def _requests(draw: st.DrawFn) -> FuzzRequest:
    route = draw(st.sampled_from(["single", "array", "ndjson"]))
    bodies = draw(st.lists(_bodies(), min_size=1, max_size=1 if route == "single" else 4))
    if route == "single":
        path, body = "/v1/rollouts", bodies[0]
    elif route == "array":
        path, body = "/v1/rollouts/batch", b"[" + b",".join(bodies) + b"]"
    else:
        path, body = "/v1/rollouts/batch", b"\n".join(bodies)
    headers = {"Content-Type": draw(st.sampled_from(CONTENT_TYPES))}
    encoding = draw(st.sampled_from(["", "", "gzip", "gzip-label-only", "br"]))
    if encoding == "gzip":
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    elif encoding == "gzip-label-only":
        headers["Content-Encoding"] = "gzip"
    elif encoding == "br":
        headers["Content-Encoding"] = "br"
    return FuzzRequest(path, body, headers)


def _check_answer(response: httpx.Response) -> None:
    assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    body = response.json()
    if response.status_code >= 400:
        assert is_error_shape(body), response.text[:300]
    elif response.status_code == 207:
        assert body["summary"]["total"] == len(body["results"])
        for result in body["results"]:
            assert result["status"] in ("created", "duplicate", "conflict", "invalid")
            if result["http_status"] >= 400:
                error = result["error"]
                assert isinstance(error["code"], str)
                assert isinstance(error["message"], str)
    else:
        assert body["status"] in ("created", "duplicate"), body


def test_fuzzed_ingest_requests_never_500_nor_hang(target: Target) -> None:
    section = f"hostile/{target.backend}"

    @settings(
        max_examples=SIZE.fuzz_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
        phases=NO_SHRINK,
    )
    @given(request=_requests())
    def fuzz(request: FuzzRequest) -> None:
        with target.client() as http:
            response = http.post(request.path, content=request.body, headers=request.headers)
        count_response(section, response)
        FIGURES.add(section, fuzz_cases=1)
        _check_answer(response)

    fuzz()
    assert httpx.get(target.server.url + "/health", timeout=10).status_code == 200


def test_random_run_ids_round_trip(target: Target) -> None:
    """Any run_id the server accepts can be fetched back by it, byte for byte."""
    section = f"hostile/{target.backend}"
    alphabet = st.characters(codec="utf-8", exclude_characters="\x00")

    @settings(
        max_examples=max(30, SIZE.fuzz_examples // 5),
        deadline=None,
        database=None,
        phases=NO_SHRINK,
    )
    @given(run_id=st.text(alphabet, min_size=1, max_size=40) | st.sampled_from(SQL_AND_PATHS))
    def roundtrip(run_id: str) -> None:
        raw = orjson.dumps(_rollout(run_id, nonce=random.random()))
        with target.client() as http:
            response = http.post("/v1/rollouts", content=raw)
            count_response(section, response)
            FIGURES.add(section, fuzz_cases=1)
            assert response.status_code < 500, response.text[:300]
            stored = http.get(f"/v1/rollouts/{path_segment(run_id)}")
            if response.status_code == 409:
                # The id was stored earlier (the named ids above, or drawn twice) with other
                # content: that rollout is still the one served.
                _check_refusal(response, "conflict")
                assert stored.status_code == 200, f"{run_id!r}: {stored.text[:200]}"
                assert stored.content != raw
                return
            if response.status_code not in (200, 201):
                _check_refusal(response, "invalid_rollout")  # e.g. a blank run_id
                assert stored.status_code in (404, 422), stored.text[:200]
                return
            # 200: hypothesis drew this example before (it seeds `random`, so the nonce
            # repeats too): a duplicate, and the stored bytes are these same bytes.
            assert response.json()["status"] == (
                "created" if response.status_code == 201 else "duplicate"
            )
            assert stored.status_code == 200, f"{run_id!r}: {stored.text[:200]}"
            assert stored.content == raw

    roundtrip()


def _refused_attacks(run_id: str) -> list[tuple[str, bytes, dict[str, str]]]:
    """Attacks that must be refused, each under `run_id`: (name, body, headers)."""
    late = _rollout(run_id)
    late["trace"] = {"session_time_steps": [{"events": [{"reward": 1.0, "input_tokens": "x"}]}]}
    json_type = {"Content-Type": "application/json"}
    return [
        ("NaN token", _with_raw(_rollout(run_id, x="@@"), b"NaN"), json_type),
        ("lone surrogate", _with_raw(_rollout(run_id, x="@@"), b'"\\ud800"'), json_type),
        ("trailing garbage", orjson.dumps(_rollout(run_id)) + b"garbage", json_type),
        ("deep nesting", _with_raw(_rollout(run_id, x="@@"), _nested(2000)), json_type),
        ("bad value late in the trace", orjson.dumps(late), json_type),
        (
            "repeated key",
            orjson.dumps(_rollout(run_id))[:-1] + b',"metrics":{}}',
            json_type,
        ),
        ("wrong Content-Type", orjson.dumps(_rollout(run_id)), {"Content-Type": "text/plain"}),
        (
            "truncated gzip",
            gzip.compress(orjson.dumps(_rollout(run_id)))[:-10],
            {**json_type, "Content-Encoding": "gzip"},
        ),
    ]


def test_the_store_is_intact_after_the_attacks(target: Target) -> None:
    """Attacks sent here (whatever ran before): every table is still there, every rollout
    accepted is stored whole and served byte for byte, and no refused one left a row."""
    from sqlalchemy import inspect

    from tests.conftest import row_counts
    from tracestore.db.base import Base

    nonce = secrets.token_hex(4)
    # Accepted: the examples, and run_ids that are SQL or paths (plain data).
    sent = {
        f"intact-{nonce}-{i}": orjson.dumps(dict(doc, run_id=f"intact-{nonce}-{i}"))
        for i, doc in enumerate(example_docs()[:3])
    }
    sent.update({f"{v} {nonce}": orjson.dumps(_rollout(f"{v} {nonce}")) for v in SQL_AND_PATHS})
    refused = f"refused-{nonce}"
    with target.client() as http:
        for run_id, raw in sent.items():
            response = http.post("/v1/rollouts", content=raw)
            assert response.status_code == 201, (run_id, response.text[:300])
        for name, body, headers in _refused_attacks(refused):
            response = http.post("/v1/rollouts", content=body, headers=headers)
            assert 400 <= response.status_code < 500, (name, response.text[:300])
            _check_refusal(response, None)
        for value in SQL_AND_PATHS:  # as query parameters and path segments too
            assert http.get("/v1/rollouts", params={"env_id": value}).status_code == 200
            assert http.get(f"/v1/correlations/{path_segment(value)}").status_code == 404
        for run_id, raw in sent.items():
            stored = http.get(f"/v1/rollouts/{path_segment(run_id)}")
            assert stored.status_code == 200, (run_id, stored.text[:300])
            assert stored.content == raw, run_id
    assert set(Base.metadata.tables) <= set(inspect(target.engine).get_table_names())
    documents = stored_documents(target.engine)
    assert {r: documents.get(r) for r in sent} == sent
    assert refused not in documents
    counts = row_counts(target.engine)
    assert counts["runs"] == counts["run_documents"]
    # Every stored run, these and the other tests', has exactly its document's rows.
    assert partial_runs(target.engine, documents) == []

"""What is stored is what was posted, exactly (issues 13 and 18).

JSON-array batch items are kept byte for byte, an empty batch is an error, a repeated key
is refused, idempotency compares content exactly (never through floats), and run_ids
made of dots (which URLs resolve away) are refused.
"""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest
from sqlalchemy import Engine

from tests.conftest import minimal_rollout, row_counts

BIG = b"123456789012345678901234567891"
NDJSON = {"Content-Type": "application/x-ndjson"}
JSON = {"Content-Type": "application/json"}


def _raw(run_id: str, value: bytes, **extra: Any) -> bytes:
    """A minimal rollout's bytes whose key `x` holds `value`, written as given."""
    return orjson.dumps(minimal_rollout(run_id, x="@@", **extra)).replace(b'"@@"', value)


def _spaced(run_id: str) -> bytes:
    """A rollout spelled as no serializer would: spacing, key order, escapes, numbers."""
    return (
        b'{ "metrics" : {"num_steps": 1, "mean_return": 1.0E0, "episode_returns": [1.00]},\n'
        b'  "x": [' + BIG + b", 1e-400, -0.0, 1E+2],\n"
        b'  "s": "caf\\u00e9 \\/ \\ud83d\\ude00",\n'
        b'  "run_id": "' + run_id.encode() + b'", "trajectories": [] }'
    )


def _fetch(http: httpx.Client, run_id: str) -> bytes:
    response = http.get(f"/v1/rollouts/{quote(run_id, safe='')}")
    assert response.status_code == 200, response.text
    return response.content


# --- JSON-array batches: each item byte for byte -------------------------------------------


def test_json_array_items_are_stored_byte_for_byte(http: httpx.Client) -> None:
    items = [_spaced("arr-0"), _raw("arr-1", BIG), b' {"run_id":"arr-bad"} ']
    body = b"[\n  " + b" ,\n  ".join(items) + b"\n]\n"
    response = http.post("/v1/rollouts/batch", content=body)
    assert response.status_code == 207, response.text
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["created", "created", "invalid"]
    # Before: items were re-serialized (1.2345678901234568e+29, 0.0, other spacing).
    assert _fetch(http, "arr-0") == items[0]
    assert _fetch(http, "arr-1") == items[1]
    assert results[2]["run_id"] == "arr-bad"  # a refused item still names its run


def test_the_same_item_in_an_array_and_alone_is_a_duplicate(http: httpx.Client) -> None:
    raw = _spaced("arr-dup")
    assert http.post("/v1/rollouts/batch", content=b"[" + raw + b"]").status_code == 207
    again = http.post("/v1/rollouts", content=raw)
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "duplicate"


@pytest.mark.parametrize(
    "body",
    [b"[1,]", b"[1 2]", b"[1] x", b"[", b'[{"a":1}', b"[\xff]"],
    ids=["trailing comma", "no comma", "trailing data", "open", "unclosed", "bad utf-8"],
)
def test_a_broken_array_is_invalid_json(http: httpx.Client, engine: Engine, body: bytes) -> None:
    response = http.post("/v1/rollouts/batch", content=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_json"
    assert set(row_counts(engine).values()) == {0}


# --- an empty batch is an error --------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b"", {}),
        (b"", NDJSON),
        (b"[]", {}),
        (b" [ \n ] \n", {}),
        (b"\n\n  \n", NDJSON),
        (b"  ", {"Content-Type": "application/json"}),
    ],
    ids=["empty", "empty ndjson", "[]", "spaced []", "blank lines", "blank json"],
)
def test_an_empty_batch_is_a_clear_4xx(
    http: httpx.Client, engine: Engine, body: bytes, headers: dict[str, str]
) -> None:
    response = http.post("/v1/rollouts/batch", content=body, headers=headers)
    # Before: 207 with total 0, which reads as success.
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "empty_batch"
    assert "no rollouts" in error["message"]
    assert set(row_counts(engine).values()) == {0}


# --- repeated keys are refused ---------------------------------------------------------------

REPEATED = [
    (
        b'{"run_id":"dup-a","run_id":"dup-b",' + orjson.dumps(minimal_rollout("z"))[14:],
        "run_id",
        "run_id",
    ),
    (_raw("dup-nested", b'{"k": {"a": 1, "b": [{"c": 1, "c" : 2}]}}'), "c", "x.k.b[0].c"),
    (_raw("dup-escaped", b'{"\\u0061": 1, "a": 2}'), "a", "x.a"),
]


@pytest.mark.parametrize(("raw", "key", "path"), REPEATED, ids=["run_id", "nested", "escaped"])
def test_a_repeated_key_is_refused_naming_it(
    http: httpx.Client, engine: Engine, raw: bytes, key: str, path: str
) -> None:
    response = http.post("/v1/rollouts", content=raw)
    # Before: 201, stored under the last run_id while the bytes said the first.
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_rollout"
    assert error["key"] == key
    assert repr(key) in error["message"]
    assert error["errors"] == [{"path": path, "message": "repeated key"}]
    assert set(row_counts(engine).values()) == {0}


@pytest.mark.parametrize("form", ["ndjson", "array"])
def test_a_repeated_key_in_a_batch_item_refuses_that_item(
    http: httpx.Client, engine: Engine, form: str
) -> None:
    items = [orjson.dumps(minimal_rollout(f"ok-{form}")), REPEATED[1][0]]
    if form == "ndjson":
        response = http.post("/v1/rollouts/batch", content=b"\n".join(items), headers=NDJSON)
    else:
        response = http.post("/v1/rollouts/batch", content=b"[" + b",".join(items) + b"]")
    assert response.status_code == 207, response.text
    first, second = response.json()["results"]
    assert first["status"] == "created"
    assert second["status"] == "invalid"
    assert second["http_status"] == 422
    assert second["error"]["key"] == "c"
    assert row_counts(engine)["runs"] == 1


def test_repeated_values_and_keys_in_different_objects_are_fine(http: httpx.Client) -> None:
    raw = _raw("not-dup", b'[{"a": 1}, {"a": 1}, {"a": {"a": "a:a"}}, "\\":\\":"]')
    response = http.post("/v1/rollouts", content=raw)
    assert response.status_code == 201, response.text
    assert _fetch(http, "not-dup") == raw


# --- idempotency compares content exactly ----------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (BIG, b"123456789012345678901234567892"),
        (b"1e-400", b"0"),
        (b"[1e-400]", b"[0.0]"),
        (b"true", b"1"),
        (b"9007199254740993", b"9007199254740992"),
    ],
    ids=["30-digit integers", "1e-400 and 0", "in an array", "true and 1", "past 2**53"],
)
def test_other_content_is_a_conflict_even_when_floats_agree(
    http: httpx.Client, first: bytes, second: bytes
) -> None:
    assert http.post("/v1/rollouts", content=_raw("exact", first)).status_code == 201
    response = http.post("/v1/rollouts", content=_raw("exact", second))
    # Before: 200 duplicate (the values were compared as floats).
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "conflict"
    assert error["differing_parts"] == ["x"]
    assert _fetch(http, "exact") == _raw("exact", first)


@pytest.mark.parametrize(
    ("first", "second"),
    [(b"1.0", b"1"), (b"1E2", b"100"), (b"-0", b"0"), (b'{"a":1,"b":2}', b'{ "b" : 2, "a" : 1 }')],
    ids=["1.0 and 1", "1E2 and 100", "-0 and 0", "key order and spacing"],
)
def test_the_same_value_spelled_differently_is_a_duplicate(
    http: httpx.Client, first: bytes, second: bytes
) -> None:
    assert http.post("/v1/rollouts", content=_raw("same", first)).status_code == 201
    response = http.post("/v1/rollouts", content=_raw("same", second))
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "duplicate"


# --- run_ids: dots refused, bytes kept ---------------------------------------------------------


@pytest.mark.parametrize("run_id", [".", "..", "..."])
def test_dot_only_run_ids_are_refused(http: httpx.Client, engine: Engine, run_id: str) -> None:
    response = http.post("/v1/rollouts", content=orjson.dumps(minimal_rollout(run_id)))
    # Before: stored, but GET /v1/rollouts/.. is resolved to /v1/ by clients.
    assert response.status_code == 422, response.text
    assert response.json()["error"]["errors"] == [{"path": "run_id", "message": "dots only"}]
    assert set(row_counts(engine).values()) == {0}


def test_run_ids_with_dots_and_more_are_fine(http: httpx.Client) -> None:
    for run_id in (".x", "a..b", "..z", "a/.."):
        raw = orjson.dumps(minimal_rollout(run_id))
        assert http.post("/v1/rollouts", content=raw).status_code == 201
        assert _fetch(http, run_id) == raw


def test_run_ids_are_kept_byte_for_byte_not_normalized(http: httpx.Client) -> None:
    # The decision: run_ids are compared as their code points, like any key; NFC and NFD
    # spellings of one name are two runs (tracestore never rewrites an id).
    nfc = unicodedata.normalize("NFC", "caf\u00e9")
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfc != nfd
    for run_id, reward in ((nfc, 1.0), (nfd, 2.0)):
        raw = orjson.dumps(minimal_rollout(run_id, reward=reward))
        response = http.post("/v1/rollouts", content=raw)
        assert response.status_code == 201, response.text
        assert response.json()["run_id"] == run_id
    assert orjson.loads(_fetch(http, nfc))["metrics"]["mean_return"] == 1.0
    assert orjson.loads(_fetch(http, nfd))["metrics"]["mean_return"] == 2.0


# --- one instant, several spellings (issue 11) ---------------------------------------------

REPR = "datetime.datetime(2025, 11, 20, 11, 59, 59, 123456, tzinfo=datetime.timezone.utc)"


@pytest.mark.parametrize(
    ("first", "again", "status"),
    [
        # The task app's wire (repr) and pydantic's JSON (ISO) of one instant: one rollout.
        (REPR, "2025-11-20T11:59:59.123456Z", 200),
        (REPR, "2025-11-20 11:59:59.123456+00:00", 200),
        ("2025-11-20T12:59:59.123456+01:00", "2025-11-20T11:59:59.123456Z", 200),
        # Another instant, or a string that is not a datetime form: other content.
        (REPR, "2025-11-20T11:59:59.123457Z", 409),
        ("2025-11-20", "2025-11-20T00:00:00Z", 409),
        ("datetime.datetime(oops)", "2025-11-20T11:59:59Z", 409),
    ],
)
def test_one_instant_in_another_datetime_form_is_a_duplicate(
    http: httpx.Client, first: str, again: str, status: int
) -> None:
    run_id = "dt-" + hashlib.sha256(f"{first}|{again}".encode()).hexdigest()[:12]
    trace = {"session_id": run_id, "created_at": first, "event_history": []}
    created = http.post("/v1/rollouts", content=orjson.dumps(minimal_rollout(run_id, trace=trace)))
    assert created.status_code == 201, created.text
    trace_again = {**trace, "created_at": again}
    response = http.post(
        "/v1/rollouts", content=orjson.dumps(minimal_rollout(run_id, trace=trace_again))
    )
    assert response.status_code == status, response.text
    if status == 409:
        assert response.json()["error"]["differing_parts"] == ["trace"]
    # Either way, the first document is what stays.
    assert orjson.loads(_fetch(http, run_id))["trace"]["created_at"] == first


@pytest.mark.parametrize(
    ("where", "first", "again"),
    [
        # Text that looks like a datetime outside a datetime member is text: read as an
        # instant, a changed observation or message was answered 200 duplicate and the
        # change dropped (found by a QA pass over the contract).
        ("obs", "2025-11-20T11:59:59.1234564Z", "2025-11-20T11:59:59.1234561Z"),
        ("obs", "2025-11-20T11:59:59Z", "2025-11-20T12:59:59+01:00"),
        ("message", REPR, "2025-11-20T11:59:59.123456Z"),
    ],
)
def test_datetime_text_outside_a_datetime_member_is_compared_as_text(
    http: httpx.Client, where: str, first: str, again: str
) -> None:
    run_id = "dt-text-" + hashlib.sha256(f"{where}|{first}|{again}".encode()).hexdigest()[:12]

    def doc(value: str) -> dict[str, Any]:
        if where == "obs":
            out = minimal_rollout(run_id)
            out["trajectories"][0]["steps"][0]["obs"] = {"clock": value}
            return out
        message = {"content": {"text": value, "json_payload": None}, "message_type": "user"}
        trace = {
            "session_id": run_id,
            "created_at": None,
            "markov_blanket_message_history": [message],
        }
        return minimal_rollout(run_id, trace=trace)

    assert http.post("/v1/rollouts", content=orjson.dumps(doc(first))).status_code == 201
    response = http.post("/v1/rollouts", content=orjson.dumps(doc(again)))
    assert response.status_code == 409, response.text


# --- stored parts served exactly -------------------------------------------------------------


def _exact_parts(run_id: str, wrapped: bool) -> bytes:
    """A rollout whose trajectories and trace hold numbers orjson does not read back."""
    numbers = b'{"big": ' + BIG + b', "tiny": 1e-400, "long": 1234567890.123456789, "k": 1.0}'
    trace = b'{"session_id": "s", "session_time_steps": [], "metadata": {"n": ' + numbers + b"}}"
    if wrapped:
        trace = b'{"session_trace": ' + trace + b', "x": 1}'
    return (
        b'{"run_id": "' + run_id.encode() + b'", "trajectories": [{"env_id": "e", '
        b'"policy_id": "p", "steps": [{"obs": ' + numbers + b', "reward": 1, "done": true}]}], '
        b'"metrics": {"episode_returns": [1], "mean_return": 1, "num_steps": 1}, '
        b'"trace": ' + trace + b"}"
    )


@pytest.mark.parametrize("wrapped", [False, True], ids=["full", "wrapped"])
def test_stored_parts_are_served_with_every_number_as_sent(
    http: httpx.Client, wrapped: bool
) -> None:
    # `/trajectories` (X-Tracestore-Source: stored) and a stored trace were the document
    # read through floats: a 30-digit integer came back as 1.2345678901234568e+29 and
    # 1e-400 as 0.0 (a helper's QA), while the document itself came back byte for byte.
    run_id = f"exact-parts-{'wrapped' if wrapped else 'full'}"
    raw = _exact_parts(run_id, wrapped)
    assert http.post("/v1/rollouts", content=raw, headers=JSON).status_code == 201
    trajectories = http.get(f"/v1/rollouts/{run_id}/trajectories")
    assert trajectories.headers["X-Tracestore-Source"] == "stored"
    assert trajectories.content == (
        b'[{"env_id":"e","policy_id":"p","steps":[{"obs":{"big":' + BIG + b',"tiny":1e-400,'
        b'"long":1234567890.123456789,"k":1.0},"reward":1,"done":true}]}]'
    )
    trace = http.get(f"/v1/rollouts/{run_id}/trace")
    assert trace.headers["X-Tracestore-Source"] == "stored"
    assert trace.content == (
        b'{"session_id":"s","session_time_steps":[],"metadata":{"n":{"big":'
        + BIG
        + b',"tiny":1e-400,"long":1234567890.123456789,"k":1.0}}}'
    )

"""Every route's query (and path) parameters, driven with hostile values: never a 5xx.

The routes and their parameters come from the served OpenAPI schema, so a route added
later is fuzzed too. Values: huge integers (as numbers and inside cursors), NUL, bytes
that are not UTF-8, calendar edges, durations past the calendar, and random text; plus
parameters no route declares. Refusals must use the error shape. Issue 18 item 5: a
cursor past 2**63 and `env=%00` on the reports were 500s (the latter quoting SQL).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_from_bytes

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.conftest import minimal_rollout
from tests.reliability.conftest import Target
from tests.reliability.harness import FIGURES, SIZE, count_response, is_error_shape

RUN_ID = "fuzz-run"
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


def _cursor(data: dict[str, Any]) -> str:
    # The stdlib: orjson refuses integers past 64 bits, which is the point here.
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


HUGE = [str(2**63), str(2**64), str(-(2**63) - 1), "9" * 400, "1e400", "-0", "0x10"]
NASTY: list[str | bytes] = [
    *HUGE,
    "\x00",
    "a\x00b",
    b"\xff\xfe",  # not UTF-8
    b"\xc3\x28",
    b"%",
    "",
    " ",
    "nan",
    "true",
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-14:00",
    "9999999999w",
    "1.5d",
    _cursor({"v": 1, "before": 2**63}),
    _cursor({"v": 1, "run": 2**64, "ord": 0}),
    _cursor({"v": 1, "run": 1, "ord": -(2**63) - 1}),
    "'; DROP TABLE runs; --",
    "x" * 5000,
]
values = st.sampled_from(NASTY) | st.text(max_size=40) | st.binary(max_size=12)
huge_ints = st.integers(-(2**70), 2**70)
ints = huge_ints.map(str)
# Cursors that decode, holding any integer: the keyset's bound reaches the database.
cursors = st.builds(
    lambda a, b: _cursor({"v": 1, "before": a, "run": a, "ord": b}), huge_ints, huge_ints
)
# A value for each path parameter that reaches the route's work (a stored run, a report).
PATH_VALUES: dict[str, str | bytes] = {"run_id": RUN_ID, "name": "returns", "cid": "c"}


@dataclass(frozen=True)
class Operation:
    """One method and path of the API, with its parameters by location."""

    method: str
    template: str
    query: tuple[str, ...]
    path: tuple[str, ...]


def _operations(target: Target) -> list[Operation]:
    schema = httpx.get(target.server.url + "/openapi.json", timeout=30).json()
    found = []
    for template, operations in schema["paths"].items():
        for method, op in operations.items():
            params = op.get("parameters", [])
            found.append(
                Operation(
                    method.upper(),
                    template,
                    tuple(p["name"] for p in params if p["in"] == "query"),
                    tuple(p["name"] for p in params if p["in"] == "path"),
                )
            )
    return found


def _encode(value: str | bytes) -> str:
    raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
    return quote_from_bytes(raw, safe="")


def _url(op: Operation, path_values: dict[str, str | bytes], query: list[tuple[str, Any]]) -> str:
    path = op.template
    for name in op.path:
        value = path_values.get(name, PATH_VALUES.get(name, RUN_ID))
        path = path.replace("{" + name + "}", _encode(value))
    if not query:
        return path
    return path + "?" + "&".join(f"{_encode(k)}={_encode(v)}" for k, v in query)


def _body(op: Operation) -> bytes | None:
    # A valid rollout: POST routes then get as far as their parameters allow.
    return orjson.dumps(minimal_rollout(RUN_ID)) if op.method == "POST" else None


def _send(target: Target, op: Operation, url: str) -> httpx.Response:
    with target.client() as http:  # a 500 closes the connection: one client each
        return http.request(op.method, url, content=_body(op))


def _problem(op: Operation, url: str, response: httpx.Response) -> str | None:
    where = f"{op.method} {url[:200]}"
    if response.status_code >= 500:
        return f"{where}: {response.status_code} {response.text[:300]}"
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            return f"{where}: {response.status_code} and not JSON"
        if not is_error_shape(body):
            return f"{where}: not the error shape"
        if "SELECT" in response.text or "COPY (" in response.text:
            return f"{where}: internal SQL in the error"
    return None


@pytest.fixture(scope="module")
def operations(target: Target) -> list[Operation]:
    with target.client() as http:
        http.post("/v1/rollouts", content=orjson.dumps(minimal_rollout(RUN_ID)))
    found = _operations(target)
    assert len(found) >= 15
    return found


def test_every_query_parameter_of_every_route_takes_hostile_values(
    target: Target, operations: list[Operation]
) -> None:
    """Each declared parameter of each route, with each of a few values: a sweep."""
    section = f"query-fuzz/{target.backend}"
    sweep: list[str | bytes] = [
        str(2**63),
        "\x00",
        b"\xff\xfe",
        "9999999999w",
        _cursor({"v": 1, "before": 2**63, "run": 2**63, "ord": 0}),
    ]
    problems = []
    for op in operations:
        for name in op.query:
            for value in sweep:
                url = _url(op, {}, [(name, value)])
                response = _send(target, op, url)
                count_response(section, response)
                FIGURES.add(section, named_cases=1)
                problem = _problem(op, url, response)
                if problem:
                    problems.append(problem)
    assert not problems, problems


@st.composite
def _requests(draw: st.DrawFn, operations: list[Operation]) -> tuple[Operation, str]:
    op = draw(st.sampled_from(operations))
    path_values = {
        name: draw(st.sampled_from([PATH_VALUES.get(name, RUN_ID), "drift"]) | values)
        for name in op.path
    }
    query: list[tuple[str, Any]] = []
    for name in op.query:
        if draw(st.booleans()):
            query.append((name, draw((cursors if name == "cursor" else values) | ints)))
    if draw(st.integers(0, 4)) == 0:  # now and then a parameter no route declares
        query.append((draw(st.sampled_from(["env", "has_drift", "x", "\x00", ""])), "1"))
    return op, _url(op, path_values, query)


def test_fuzzed_query_parameters_never_5xx(target: Target, operations: list[Operation]) -> None:
    section = f"query-fuzz/{target.backend}"
    problems: list[str] = []

    @settings(
        max_examples=SIZE.fuzz_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
        phases=NO_SHRINK,
    )
    @given(request=_requests(operations))
    def fuzz(request: tuple[Operation, str]) -> None:
        op, url = request
        response = _send(target, op, url)
        count_response(section, response)
        FIGURES.add(section, fuzz_cases=1)
        problem = _problem(op, url, response)
        if problem:
            problems.append(problem)

    fuzz()
    assert not problems, problems[:20]
    assert httpx.get(target.server.url + "/health", timeout=10).status_code == 200


def test_the_reported_cases(target: Target) -> None:
    """Issue 18 item 5, as reported: now clean 4xx (or an empty answer)."""
    cases = [
        ("/v1/rollouts", {"cursor": _cursor({"v": 1, "before": 2**63})}, 422),
        ("/v1/drift", {"cursor": _cursor({"v": 1, "run": 2**63, "ord": 0})}, 422),
        ("/v1/reports/returns", {"env": "\x00"}, 200),
        ("/v1/reports/returns", {"env_id": "\x00"}, 200),
    ]
    for path, params, status in cases:
        with target.client() as http:
            response = http.get(path + "?" + "&".join(f"{k}={quote(v)}" for k, v in params.items()))
        count_response(f"query-fuzz/{target.backend}", response)
        assert response.status_code == status, (path, params, response.text[:300])
        assert "SELECT" not in response.text

"""schemathesis against the served OpenAPI schema: every route, and stateful sequences.

The schema is fetched from the running server, so every route it documents is covered,
including routes added later. Checks on every response: no 5xx, an answer within the
timeout (no hang), and every refusal in the error shape. The stateful run follows links
from an ingested rollout to every route that takes its run_id or correlation id.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.core.transport import Response

from tests.reliability.conftest import HOSTILE_TIMEOUT_S, Target
from tests.reliability.harness import FIGURES, SIZE, is_error_shape

_SETTINGS = settings(
    max_examples=SIZE.schema_examples,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _problem(section: str, case: Case[Any], response: Response) -> str | None:
    """What is wrong with an answer (a 5xx, a refusal not in the error shape), if anything."""
    FIGURES.add(section, schema_cases=1, responses=1)
    where = f"{case.method} {case.formatted_path} {case.query or ''}"
    if response.status_code >= 500:
        FIGURES.add(section, server_errors=1)
        return f"{where}: {response.status_code}: {response.text[:300]}"
    if response.status_code >= 400:
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        if not is_error_shape(body):
            return f"{where}: {response.status_code} not in the error shape: {response.text[:300]}"
    return None


def _cap_sizes(node: Any) -> None:
    """Cap free-form arrays (2 items) and objects (3 keys) for generation only.

    Generating whole rollouts and batches from the schema takes seconds per example;
    capped, it takes milliseconds. Large and deep documents are the named cases' and the
    fuzz tests' job (test_hostile_input.py).
    """
    if isinstance(node, dict):
        if node.get("type") == "array":
            node.setdefault("maxItems", 2)
        if node.get("type") == "object" and not node.get("properties"):
            node.setdefault("maxProperties", 3)
        for value in node.values():
            _cap_sizes(value)
    elif isinstance(node, list):
        for value in node:
            _cap_sizes(value)


def _schema(target: Target, *, links: bool) -> Any:
    raw = httpx.get(target.server.url + "/openapi.json", timeout=30).json()
    _cap_sizes(raw)
    if links:
        _add_links(raw)
    schema = schemathesis.openapi.from_dict(raw)
    schema.config.update(base_url=target.server.url)
    return schema


def _add_links(raw: dict[str, Any]) -> None:
    """OpenAPI links from the ingest routes to every route keyed by what they return."""
    paths = raw["paths"]
    by_run = [
        (p, op["operationId"])
        for p, ops in paths.items()
        for m, op in ops.items()
        if m == "get" and "{run_id}" in p
    ]
    by_cid = [
        (p, op["operationId"])
        for p, ops in paths.items()
        for m, op in ops.items()
        if m == "get" and "{cid}" in p
    ]
    links: dict[str, Any] = {}
    for _path, op_id in by_run:
        links[f"run_{op_id}"] = {
            "operationId": op_id,
            "parameters": {"run_id": "$response.body#/run_id"},
        }
    for _path, op_id in by_cid:
        links[f"cid_{op_id}"] = {
            "operationId": op_id,
            "parameters": {"cid": "$response.body#/correlation_id"},
        }
    for status in ("200", "201"):
        response = paths["/v1/rollouts"]["post"]["responses"].get(status)
        if response is not None:
            response["links"] = links


def _fuzz_operation(section: str, operation: Any, problems: dict[str, str]) -> None:
    label = operation.label
    # Inputs that fit the schema and inputs that break it.
    cases = st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @_SETTINGS
    @given(case=cases)
    def run(case: Case[Any]) -> None:
        if label in problems:
            return
        problem = _problem(section, case, case.call(timeout=HOSTILE_TIMEOUT_S))
        if problem is not None:
            problems[label] = problem

    run()


def test_every_documented_route_answers_without_5xx(target: Target) -> None:
    section = f"schemathesis/{target.backend}"
    schema = _schema(target, links=False)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, "the schema should document every route"
    # The first problem of each route is kept and the run goes on, so one broken route
    # does not hide another (and no time goes into shrinking).
    problems: dict[str, str] = {}
    for operation in operations:
        _fuzz_operation(section, operation, problems)
        FIGURES.add(section, operations=1)
    assert not problems, "\n".join(problems.values())


def test_stateful_sequences_follow_links_without_5xx(target: Target) -> None:
    section = f"schemathesis/{target.backend}"
    schema = _schema(target, links=True)
    machine = schema.as_state_machine()
    linked = [0]

    class Machine(machine):  # type: ignore[misc, valid-type]
        def call(self, case: Case[Any], **kwargs: Any) -> Response:
            return case.call(timeout=HOSTILE_TIMEOUT_S, **kwargs)

        def validate_response(self, response: Response, case: Case[Any], **_kwargs: Any) -> None:
            FIGURES.add(section, stateful_steps=1)
            if "{" in case.path and response.status_code == 200:
                # A look-up by an id the sequence itself created: the links were followed.
                FIGURES.add(section, stateful_linked_hits=1)
                linked[0] += 1
            problem = _problem(section, case, response)
            assert problem is None, problem

    Machine.run(
        settings=settings(_SETTINGS, max_examples=SIZE.stateful_steps, stateful_step_count=6)
    )
    assert linked[0] > 0, "no sequence went from an ingested rollout to a look-up by its id"


@pytest.mark.parametrize("route", ["/v1/rollouts", "/v1/rollouts/batch"])
def test_the_schema_documents_the_error_shape_for_refusals(target: Target, route: str) -> None:
    raw = httpx.get(target.server.url + "/openapi.json", timeout=30).json()
    responses = raw["paths"][route]["post"]["responses"]
    for status in ("400", "413", "415", "422"):
        content = responses[status]["content"]["application/json"]["schema"]
        assert content == {"$ref": "#/components/schemas/ErrorBody"}, (status, content)

"""Runs without trajectories are summarized from their trace, so every filter finds them.

Issue 13: such runs were listed with 0 steps and no env or policy, so `?env_id=` missed
them, while the reports (reports/views.sql) read their env, policy and steps from the
trace. The list and the reports now agree (tests/reports/test_run_summaries.py compares
them over the same store).
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import Example, minimal_rollout


def _trace_only(examples: list[Example]) -> list[Example]:
    found = [ex for ex in examples if not ex.doc["trajectories"]]
    assert found, "the examples hold trace-only runs"
    return found


@pytest.fixture
def loaded(http: httpx.Client, examples: list[Example]) -> list[Example]:
    body = b"\n".join(ex.raw for ex in examples)
    response = http.post(
        "/v1/rollouts/batch", content=body, headers={"Content-Type": "application/x-ndjson"}
    )
    assert response.status_code == 207
    return examples


def _listed(http: httpx.Client, **params: str) -> dict[str, dict[str, Any]]:
    response = http.get("/v1/rollouts", params={"limit": "1000", **params})
    assert response.status_code == 200, response.text
    return {item["run_id"]: item for item in response.json()["items"]}


def test_trace_only_runs_are_summarized_from_their_trace(
    http: httpx.Client, loaded: list[Example]
) -> None:
    listed = _listed(http)
    for ex in _trace_only(loaded):
        item = listed[ex.label["run_id"]]
        metadata = ex.doc["trace"]["metadata"]
        # Before: 0 steps, no env, no policy.
        assert item["env_ids"] == [metadata["env_id"]], ex.line
        assert item["policy_ids"] == [metadata["policy_id"]], ex.line
        assert item["step_source"] == "trace"
        assert item["n_steps"] == ex.label["n_steps"] > 0, ex.line
        assert item["n_trajectories"] == 0


def test_filters_find_trace_only_runs(http: httpx.Client, loaded: list[Example]) -> None:
    for ex in _trace_only(loaded):
        metadata = ex.doc["trace"]["metadata"]
        run_id = ex.label["run_id"]
        assert run_id in _listed(http, env_id=metadata["env_id"]), ex.line
        assert run_id in _listed(http, policy_id=metadata["policy_id"]), ex.line
        drift = http.get("/v1/drift", params={"env_id": metadata["env_id"]})
        assert drift.status_code == 200, drift.text
        assert drift.json()["runs"] >= 1


def test_runs_with_trajectories_keep_their_summaries(
    http: httpx.Client, loaded: list[Example]
) -> None:
    listed = _listed(http)
    for ex in loaded:
        item = listed.get(ex.label["run_id"])
        if item is None or not ex.doc["trajectories"] or ex.label["expect_status"] != "created":
            continue
        steps = sum(len(t["steps"]) for t in ex.doc["trajectories"])
        if steps:
            assert item["n_steps"] == steps
            assert item["step_source"] == "trajectory"
        envs = [t["env_id"] for t in ex.doc["trajectories"] if t.get("env_id") is not None]
        assert item["env_ids"][: len(set(envs))] == list(dict.fromkeys(envs))


def _wrapped(run_id: str, metadata: Any) -> dict[str, Any]:
    env = {"system_instance_id": "env", "reward": 1.0, "system_state_before": {}}
    lm = {"system_instance_id": "lm", "model_name": "m", "provider": "p"}
    trace = {
        "session_trace": {
            "session_id": f"s-{run_id}",
            "session_time_steps": [{"step_id": f"d{i}", "events": [lm, env]} for i in range(3)],
            "metadata": metadata,
        }
    }
    return minimal_rollout(run_id, trajectories=[], trace=trace)


@pytest.mark.parametrize(
    ("metadata", "env_ids"),
    [
        ({"env_id": "wrapped-env", "policy_id": "wrapped-pol"}, ["wrapped-env"]),
        ({"env_id": 7}, []),  # not a string: not an identifier
        ({"env_id": "x" * 1025}, []),  # longer than an identifier may be
        (None, []),
    ],
    ids=["named", "number", "too long", "no metadata"],
)
def test_a_wrapped_trace_names_the_env(
    http: httpx.Client, metadata: Any, env_ids: list[str]
) -> None:
    response = http.post("/v1/rollouts", content=orjson.dumps(_wrapped("wrapped", metadata)))
    assert response.status_code == 201, response.text
    item = _listed(http)["wrapped"]
    assert item["env_ids"] == env_ids
    assert item["n_steps"] == 3
    assert item["step_source"] == "trace"
    if env_ids:
        assert list(_listed(http, env_id=env_ids[0])) == ["wrapped"]
        assert list(_listed(http, policy_id="wrapped-pol")) == ["wrapped"]


@pytest.mark.parametrize(
    ("metadata", "env_ids", "policy_id"),
    [
        # synth-ai's traces: its `filter` reads these names.
        ({"env_name": "crafter", "policy_name": "crafter-react"}, ["crafter"], "crafter-react"),
        ({"env_id": None, "env_name": "crafter", "policy_name": "p"}, ["crafter"], "p"),
        # The id, when there is one, wins over the name.
        ({"env_id": "own", "env_name": "crafter", "policy_id": "pid"}, ["own"], "pid"),
        ({"env_name": 7}, [], None),  # not a string: not an identifier
    ],
    ids=["names", "null id", "id and name", "number"],
)
def test_a_trace_names_the_env_as_synth_ai_does(
    http: httpx.Client, metadata: Any, env_ids: list[str], policy_id: str | None
) -> None:
    """A trace-only run whose trace names env and policy `env_name` / `policy_name` is found
    by `?env_id=` / `?policy_id=`, as the converter reads the same names."""
    response = http.post("/v1/rollouts", content=orjson.dumps(_wrapped("named", metadata)))
    assert response.status_code == 201, response.text
    assert _listed(http)["named"]["env_ids"] == env_ids
    if env_ids:
        assert list(_listed(http, env_id=env_ids[0])) == ["named"]
    if policy_id is not None:
        assert list(_listed(http, policy_id=policy_id)) == ["named"]
    converted = http.get("/v1/rollouts/named/trajectories")
    assert converted.status_code == 200, converted.text
    assert [t["env_id"] for t in converted.json()][:1] == (env_ids or [""])

"""The run list and the reports agree on each run's env, policy and step count.

reports/views.sql reads a run's env and policy from its first trajectory, else from its
run-level trace's metadata, and its steps from its trace when it has no trajectory steps;
the summaries of GET /v1/rollouts (and its filters) must say the same (issue 13).
"""

from __future__ import annotations

from typing import Any

from tests.reports.conftest import Store
from tracestore.db.uow import read_session
from tracestore.reports.runner import run_sql
from tracestore.store.runs import RunFilter, list_runs

FACTS = """
SELECT r.run_id, r.env_id, r.policy_id, r.step_source,
       (SELECT count(*) FROM step_facts AS s WHERE s.run_pk = r.run_pk) AS steps
FROM run_facts AS r
"""


def _listed(store: Store, f: RunFilter) -> dict[str, dict[str, Any]]:
    with read_session(store.engine) as session:
        items, more = list_runs(session, f, limit=1000)
    assert more is None
    return {item["run_id"]: item for item in items}


def test_summaries_and_run_facts_agree(store: Store) -> None:
    facts = {row["run_id"]: row for row in run_sql(store.live, FACTS).table.to_pylist()}
    listed = _listed(store, RunFilter())
    assert set(listed) == set(facts)
    trace_runs = 0
    for run_id, item in listed.items():
        fact = facts[run_id]
        assert item["n_steps"] == fact["steps"], run_id
        assert item["step_source"] == fact["step_source"], run_id
        for name in ("env_id", "policy_id"):
            if isinstance(fact[name], str):
                assert fact[name] in item[f"{name}s"], (run_id, name)
        trace_runs += fact["step_source"] == "trace" and fact["steps"] > 0
    assert trace_runs > 0, "the stores hold runs whose steps come from their trace"


def test_every_env_and_policy_of_the_reports_filters_the_list(store: Store) -> None:
    facts = run_sql(store.live, FACTS).table.to_pylist()
    for name in ("env_id", "policy_id"):
        for value in {row[name] for row in facts if isinstance(row[name], str)}:
            want = {row["run_id"] for row in facts if row[name] == value}
            found = set(_listed(store, RunFilter(**{name: value})))
            assert want <= found, (name, value, want - found)

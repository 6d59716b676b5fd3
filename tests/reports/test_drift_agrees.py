"""The drift report and GET /v1/drift's summary count the same runs under each env."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy.orm import Session

from tests.reports.conftest import Store
from tracestore.drift.queries import DriftFilter, summary
from tracestore.reports import output
from tracestore.reports.catalog import get_report
from tracestore.reports.filters import Filters
from tracestore.reports.runner import run_report
from tracestore.store.runs import RunFilter


def _report_by_env(store: Store, env: str | None = None) -> dict[str | None, tuple[int, int]]:
    """(comparable, drifted) runs per env, summed over the report's days."""
    rows = output.rows(run_report(store.live, get_report("drift"), Filters(env=env)).table)
    seen: set[tuple[object, object]] = set()
    totals: dict[str | None, list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        if (row["day"], row["env_id"]) in seen:
            continue  # one row per kind repeats the day's and env's counts
        seen.add((row["day"], row["env_id"]))
        totals[row["env_id"]][0] += row["comparable_runs"]
        totals[row["env_id"]][1] += row["drifted_runs"]
    return {env_id: (c, d) for env_id, (c, d) in totals.items() if c}


def test_the_report_counts_a_run_under_each_env_as_the_api_does(store: Store) -> None:
    # Before: the report put a run under its first trajectory's env only, so a finding in
    # its second trajectory's env showed in GET /v1/drift and not in the report.
    with Session(store.engine) as session:
        api = summary(session, DriftFilter())
        by_env = {g.env_id: (g.comparable_runs, g.runs_with_drift) for g in api.by_env}
        assert by_env["two-env-b"] == (1, 1)
        assert _report_by_env(store) == by_env
        for env in ("two-env-a", "two-env-b", "toolbox"):
            one = summary(session, DriftFilter(RunFilter(env_id=env)))
            want = (one.comparable_runs, one.comparable_runs_with_drift)
            assert _report_by_env(store, env).get(env, (0, 0)) == want, env

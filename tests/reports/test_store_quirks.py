"""Store contents that trip DuckDB's scanners, read correctly all the same."""

from __future__ import annotations

import orjson
from sqlalchemy import Engine

from tracestore.ingest.service import ingest_bytes
from tracestore.reports import output
from tracestore.reports.catalog import list_reports
from tracestore.reports.connection import open_live
from tracestore.reports.filters import Filters
from tracestore.reports.runner import run_report, run_sql

# `obs` is any JSON value (SPEC section 1); on SQLite a JSON column has NUMERIC affinity,
# so the JSON text `3` is stored as the integer 3, which the sqlite scanner refuses.
BANDIT = {
    "run_id": "bandit-1",
    "trajectories": [
        {
            "env_id": "bandit",
            "policy_id": "p",
            "steps": [
                {"obs": 3, "reward": 1.0, "done": False},
                {"obs": 0.30000000000000004, "reward": 0.0, "done": False},
                {"obs": "text", "reward": 0.5, "done": True},
            ],
        }
    ],
    "metrics": {"episode_returns": [1.5], "mean_return": 1.5, "num_steps": 3},
}


def test_bare_json_numbers_are_read_exactly(engine: Engine) -> None:
    ingest_bytes(engine, orjson.dumps(BANDIT))
    with open_live(engine, in_this_process=True) as analytics:
        got = run_sql(analytics, "SELECT CAST(obs AS VARCHAR) AS obs FROM steps ORDER BY idx")
        values = [orjson.loads(r["obs"]) for r in output.rows(got.table)]
        assert values == [3, 0.30000000000000004, "text"]
        for report in list_reports():
            run_report(analytics, report, Filters())
        rewards = output.rows(
            run_report(
                analytics, next(r for r in list_reports() if r.name == "rewards"), Filters()
            ).table
        )
        assert rewards[0]["steps"] == 3
        assert rewards[0]["total_reward"] == 1.5
        if engine.dialect.name == "sqlite":
            assert any(
                "steps: JSON values stored as SQLite numbers" in n for n in analytics.notices
            )
        else:
            assert analytics.notices == []

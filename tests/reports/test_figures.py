"""Each report's figures equal the same figures computed in Python from the documents."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import pytest

from tests.reports.conftest import LEGACY_READS, Store
from tests.reports.figures import COMPUTE, StoredRun, migration
from tracestore.reports import output
from tracestore.reports.catalog import get_report, list_reports
from tracestore.reports.filters import Filters
from tracestore.reports.runner import Result, run_report

REPORTS = sorted(COMPUTE)
# Figures the SQL rounds: to 6 decimals, latencies to 3.
TOLERANCE = {"mean_latency_ms": 1e-3, "p50_latency_ms": 1e-3, "p90_latency_ms": 1e-3}


def test_every_shipped_report_is_checked_here() -> None:
    assert [r.name for r in list_reports()] == REPORTS


def keyed(result: Result, key: tuple[str, ...]) -> dict[tuple[Any, ...], dict[str, Any]]:
    rows = output.rows(result.table)
    out = {}
    for row in rows:
        k = tuple(
            date.fromisoformat(row[c]) if c == "day" and row[c] is not None else row[c] for c in key
        )
        assert k not in out, f"duplicate group {k}"
        out[k] = {c: v for c, v in row.items() if c not in key}
    return out


def assert_figures(
    got: dict[tuple[Any, ...], dict[str, Any]], want: dict[tuple[Any, ...], dict[str, Any]]
) -> None:
    assert sorted(got, key=repr) == sorted(want, key=repr)
    for key, expected in want.items():
        row = got[key]
        assert set(row) == set(expected), key
        for column, value in expected.items():
            if isinstance(value, float):
                tolerance = TOLERANCE.get(column, 1e-6)
                assert row[column] == pytest.approx(value, abs=tolerance), (key, column)
            else:
                assert row[column] == value, (key, column)


def _run(store: Store, name: str, filters: Filters) -> Result:
    return run_report(store.live, get_report(name), filters)


@pytest.mark.parametrize("name", REPORTS)
def test_report_equals_python_figures(
    store: Store, stored_runs: list[StoredRun], name: str
) -> None:
    compute, key = COMPUTE[name]
    want = migration(stored_runs, LEGACY_READS) if name == "migration" else compute(stored_runs)
    result = _run(store, name, Filters())
    assert result.notices == []
    assert result.table.num_rows > 0
    assert_figures(keyed(result, key), want)


def test_filters_select_runs_and_envs(store: Store, stored_runs: list[StoredRun]) -> None:
    since = datetime(2025, 11, 19, tzinfo=UTC)
    until = datetime(2025, 11, 20, tzinfo=UTC)
    window = [r for r in stored_runs if since <= r.received_at < until]
    assert 0 < len(window) < len(stored_runs)
    for name in REPORTS:
        compute, key = COMPUTE[name]
        if name == "migration":
            reads = [r for r in LEGACY_READS if r.day == since.date()]
            want = migration(window, reads)
        else:
            want = compute(window)
        assert_figures(keyed(_run(store, name, Filters(since=since, until=until)), key), want)
    # --env: one env's rows only, in every report that groups by env.
    for name in ("returns", "rewards", "tools", "drift"):
        compute, key = COMPUTE[name]
        got = keyed(_run(store, name, Filters(env="toolbox")), key)
        assert got, name
        assert_figures(got, compute(stored_runs, env="toolbox"))
    got = keyed(_run(store, "migration", Filters(env="gridworld")), ("day",))
    assert_figures(got, migration(stored_runs, LEGACY_READS, env="gridworld"))
    assert all(row["legacy_reads"] is None for row in got.values())


def test_hand_built_cases_are_read_as_specified(store: Store) -> None:
    # Spot checks of the rules the views encode, independent of the Python mirror.
    tools = keyed(_run(store, "tools", Filters()), ("env_id", "tool_name"))
    assert tools[("toolbox", "search")]["calls"] == 2  # tool_name and OpenAI function.name
    assert tools[("toolbox", "open")]["calls"] == 2  # {"tool", "args"} and {"tool", "arguments"}
    assert tools[("toolbox", "submit")]["calls"] == 1  # {"name", "arguments_json"}
    assert tools[("toolbox", None)]["calls"] == 2  # tool_name: null wins; a bare string
    grid = {k[1]: v["calls"] for k, v in tools.items() if k[0] == "gridworld"}
    # messages beat call records (craft x2, not "ignored"); a history-only LM event beats
    # the env event's metadata (look2, not look); an orphan env event keeps its own.
    assert grid == {"move": 1, "look2": 1, "craft": 2, "orphan": 2}
    returns = keyed(_run(store, "returns", Filters()), ("day", "env_id", "policy_id"))
    by_env = {(k[1], k[2]): v for k, v in returns.items()}
    assert by_env[("gridworld", "pol-grid")]["mean_return"] == pytest.approx(0.5)
    assert by_env[("gridworld", "pol-grid")]["mean_length"] == 4
    assert by_env[(None, None)]["mean_return"] == 1.0  # the trajectory has no env_id
    # A trace naming them env_name / policy_name (synth-ai's traces).
    assert by_env[("crafter", "crafter-react")]["mean_return"] == pytest.approx(0.25)
    assert by_env[("crafter", "crafter-react")]["mean_length"] == 1
    models = keyed(_run(store, "models", Filters()), ("model_name", "provider"))
    assert models[("gpt-x", "openai")]["cost_usd"] == pytest.approx(0.0015)
    assert models[("gpt-x", "openai")]["calls_with_latency"] == 1
    correlation = keyed(_run(store, "correlation", Filters()), ("correlation_source",))
    assert correlation[("pipeline_metadata",)]["conflicts"] >= 2  # an example and the case
    assert correlation[("none",)]["runs"] >= 1

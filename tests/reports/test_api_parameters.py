"""The reports route's parameters: `env_id` (with `env` kept as its former name), NUL in
a filter, and no internal SQL in an error (issues 13 and 18)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import LiveServer
from tests.reports.conftest import Store
from tracestore.reports import output
from tracestore.reports.catalog import get_report
from tracestore.reports.filters import Filters
from tracestore.reports.runner import public_reason, run_report
from tracestore.settings import Settings


@pytest.fixture
def client(store: Store) -> Iterator[httpx.Client]:
    """A live server over the populated store."""
    with (
        LiveServer(Settings(database_url=store.url)) as server,
        httpx.Client(base_url=server.url, timeout=120) as client,
    ):
        yield client


def test_env_id_is_the_name_and_env_still_works(client: httpx.Client, store: Store) -> None:
    want = output.rows(run_report(store.live, get_report("returns"), Filters(env="toolbox")).table)
    assert want, "the store has runs of env toolbox"
    for params in (
        {"env_id": "toolbox"},
        {"env": "toolbox"},
        {"env_id": "toolbox", "env": "toolbox"},
    ):
        response = client.get("/v1/reports/returns", params=params)
        assert response.status_code == 200, (params, response.text)
        assert response.json()["rows"] == want, params
    both = client.get("/v1/reports/returns", params={"env_id": "toolbox", "env": "other"})
    assert both.status_code == 422, both.text
    assert "former name" in both.json()["error"]["message"]


def test_unknown_parameters_are_refused(client: httpx.Client) -> None:
    response = client.get("/v1/reports/returns", params={"environment": "toolbox"})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["unknown"] == ["environment"]
    assert set(error["known"]) == {"since", "until", "env_id", "env", "format"}


@pytest.mark.parametrize("value", ["\x00", "a\x00b"])
def test_a_nul_in_the_env_filter_finds_nothing_cleanly(client: httpx.Client, value: str) -> None:
    response = client.get("/v1/reports/returns", params={"env_id": value})
    # Before, on PostgreSQL: 500 analytics_error quoting `COPY (SELECT ...`.
    assert response.status_code == 200, response.text
    assert response.json()["rows"] == []


def test_error_messages_leave_the_sql_out() -> None:
    quoted = Exception(
        'Invalid Input Error: Failed to prepare COPY "COPY (SELECT "id", "run_pk" FROM '
        '"public"."trajectories" WHERE "env_id" = \'\nmore'
    )
    reason = public_reason(quoted)
    assert "SELECT" not in reason
    assert "trajectories" not in reason
    assert reason.startswith("Invalid Input Error: Failed to prepare")
    plain = Exception("Binder Error: column x not found in FROM clause")
    assert public_reason(plain) == "Binder Error: column x not found in FROM clause"

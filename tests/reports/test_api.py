"""GET /v1/reports and GET /v1/reports/{name} over real HTTP."""

from __future__ import annotations

import io
from collections.abc import Iterator

import httpx
import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type stubs
import pytest

from tests.conftest import Example, LiveServer
from tests.reports.conftest import Store
from tracestore.reports import output
from tracestore.reports.catalog import get_report, list_reports
from tracestore.reports.filters import Filters
from tracestore.reports.runner import run_report
from tracestore.settings import Settings

KEY = "reports-test-key"


@pytest.fixture
def client(store: Store) -> Iterator[httpx.Client]:
    """A live server over the populated store, with an API key configured."""
    with (
        LiveServer(Settings(database_url=store.url, api_keys=[KEY])) as server,
        httpx.Client(base_url=server.url, timeout=120, headers={"X-API-Key": KEY}) as client,
    ):
        yield client


def test_reports_over_http(client: httpx.Client, store: Store) -> None:
    listed = client.get("/v1/reports")
    assert listed.status_code == 200
    assert listed.json()["reports"] == [
        {"name": r.name, "description": r.description, "parameters": list(r.parameters)}
        for r in list_reports()
    ]
    for report in list_reports():
        got = client.get(f"/v1/reports/{report.name}", params={"since": "2025-11-19"})
        assert got.status_code == 200, got.text
        body = got.json()
        want = run_report(store.live, report, Filters.parse("2025-11-19", None, None))
        assert body["rows"] == output.rows(want.table), report.name
        assert body["source"] == store.backend
        assert [c["name"] for c in body["columns"]] == want.columns
        assert body["parameters"]["since"] == "2025-11-19T00:00:00+00:00"
    want = run_report(store.live, get_report("tools"), Filters(env="toolbox"))
    as_csv = client.get("/v1/reports/tools", params={"env": "toolbox", "format": "csv"})
    assert as_csv.status_code == 200
    assert as_csv.headers["content-type"].startswith("text/csv")
    assert as_csv.text == output.to_csv(want)
    as_parquet = client.get("/v1/reports/tools", params={"env": "toolbox", "format": "parquet"})
    assert as_parquet.status_code == 200
    assert pq.read_table(io.BytesIO(as_parquet.content)).equals(want.table)


def test_errors_have_the_error_shape(client: httpx.Client) -> None:
    missing = client.get("/v1/reports/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    for params in ({"since": "not-a-time"}, {"format": "xml"}, {"since": "2d", "until": "3d"}):
        bad = client.get("/v1/reports/returns", params=params)
        assert bad.status_code == 422, params
        assert bad.json()["error"]["code"] == "invalid_request"
    anonymous = client.get("/v1/reports", headers={"X-API-Key": ""})
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "unauthorized"


def test_each_request_reads_the_store_as_it_is_now(
    http: httpx.Client, examples: list[Example]
) -> None:
    # The server keeps one DuckDB per store: new rollouts must show all the same.
    empty = http.get("/v1/reports/correlation")
    assert empty.status_code == 200, empty.text
    assert empty.json()["rows"] == []
    first = next(ex for ex in examples if ex.label["expect_status"] == "created")
    posted = http.post("/v1/rollouts", content=first.raw)
    assert posted.status_code == 201, posted.text
    after = http.get("/v1/reports/correlation").json()["rows"]
    assert [(r["correlation_source"], r["runs"]) for r in after] == [
        (first.label["correlation_source"] or "none", 1)
    ]

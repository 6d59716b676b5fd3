"""A schema taken away under a running server: 503 schema_out_of_date, never a 500."""

from __future__ import annotations

import httpx
import orjson
from sqlalchemy import text

from tests.conftest import Database, LiveServer, minimal_rollout
from tracestore.db.engine import create_engine as store_engine
from tracestore.settings import Settings


def test_requests_after_the_tables_went_are_503_schema_out_of_date(fresh_db: Database) -> None:
    # `tracestore db downgrade base` under a running server: /health said 503, while the
    # /v1 routes answered 500 internal_error with PostgreSQL's UndefinedTable traceback.
    with LiveServer(Settings(database_url=fresh_db.url)) as live:
        first = httpx.post(live.url + "/v1/rollouts", json=minimal_rollout("before"))
        assert first.status_code == 201, first.text
        engine = store_engine(fresh_db.url)
        with engine.begin() as conn:
            for table in ("run_documents", "runs"):
                conn.execute(
                    text(
                        f"DROP TABLE {table} CASCADE"
                        if engine.dialect.name == "postgresql"
                        else f"DROP TABLE {table}"
                    )
                )
        engine.dispose()
        answers = [
            httpx.get(live.url + "/v1/rollouts/before"),
            httpx.get(live.url + "/v1/rollouts"),
            httpx.post(live.url + "/v1/rollouts", content=orjson.dumps(minimal_rollout("after"))),
        ]
        for response in answers:
            assert response.status_code == 503, (response.request.url, response.text)
            assert response.json()["error"]["code"] == "schema_out_of_date"
            assert "tracestore db upgrade" in response.json()["error"]["message"]


def test_metrics_are_served_when_the_drift_figures_cannot_be_read(fresh_db: Database) -> None:
    # /metrics read the drift gauges from the store at every scrape, and a store that
    # could not be read lost the whole scrape (503): this process's counters with it.
    with LiveServer(Settings(database_url=fresh_db.url)) as live:
        assert httpx.post(live.url + "/v1/rollouts", json=minimal_rollout("m")).status_code == 201
        before = httpx.get(live.url + "/metrics")
        assert before.status_code == 200
        assert "tracestore_drift_figures_read 1.0" in before.text
        engine = store_engine(fresh_db.url)
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE drift_findings"))
        engine.dispose()
        after = httpx.get(live.url + "/metrics")
        assert after.status_code == 200, after.text
        assert "tracestore_drift_figures_read 0.0" in after.text
        assert 'tracestore_ingest_rollouts_total{status="created"} 1.0' in after.text

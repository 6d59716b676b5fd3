"""The read lane: look-ups over HTTP send no BEGIN/ROLLBACK on PostgreSQL, one statement per
look-up, and every session gives its connection back (on the event loop when there is
nothing to send, in a lane thread otherwise)."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import orjson
import pytest
from sqlalchemy import Engine, text

from tests.conftest import Database, LiveServer, minimal_rollout
from tests.pgwire import messages, traced, transaction_statements
from tracestore.api.overload import Lane, Lanes
from tracestore.ingest.service import ingest_many
from tracestore.settings import Settings

DOCS = [
    minimal_rollout("lane-1", trace_correlation_id="lane-cid"),
    minimal_rollout("lane-2", trace_correlation_id="lane-cid"),
    minimal_rollout("lane-3", trajectories=[]),
]


def test_http_look_ups_send_no_begin_or_rollback_on_postgresql(
    backend: str, database: Database, engine: Engine
) -> None:
    if backend != "postgresql":
        pytest.skip("the wire protocol of PostgreSQL")
    assert {r.status for r in ingest_many(engine, [orjson.dumps(d) for d in DOCS])} == {"created"}
    settings = Settings(database_url=database.url)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        app: Any = live.server.config.app
        lanes: Lanes = app.state.tracestore.lanes
        for _ in range(3):  # warm: the pool's connections exist
            assert http.get("/v1/correlations/lane-cid").status_code == 200
        with traced(lanes.engine) as lines:
            for _ in range(5):
                answer = http.get("/v1/correlations/lane-cid")
                assert answer.status_code == 200
                assert [r["run_id"] for r in answer.json()["runs"]] == ["lane-2", "lane-1"]
            assert http.get("/v1/correlations/absent%2Fv1%2Fchat").status_code == 404
            assert http.get("/v1/rollouts/lane-1").content == orjson.dumps(DOCS[0])
            assert http.get("/v1/rollouts/absent").status_code == 404
        # Every connection went back to the pool (the read sessions ended on the loop).
        assert lanes.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert not transaction_statements(lines), lines
    assert set(messages(lines, "B", "ReadyForQuery")) == {"I"}, lines
    # One statement per look-up: by cid (5 found, 1 not), by run_id (the document and
    # whether the run has trajectories together; 1 found, 1 not).
    selects = messages(lines, "B", "CommandComplete")
    assert len(selects) == 6 + 2, lines


@pytest.mark.parametrize("reads", [True, False])
def test_a_lane_session_gives_its_connection_back(
    backend: str, database: Database, engine: Engine, reads: bool
) -> None:
    lanes = Lanes(Settings(database_url=database.url))
    lane = Lane("test", lanes.engine, 2, 5.0, reads=reads)
    pool: Any = lanes.engine.pool

    async def scenario() -> list[Any]:
        seen = []
        async with lane.session() as session:
            seen.append(session.connection().execute(text("SELECT 1")).scalar())
            seen.append(pool.checkedout())
        seen.append(pool.checkedout())
        async with lane.session():  # never connects
            pass
        seen.append(pool.checkedout())
        return seen

    try:
        assert anyio.run(scenario) == [1, 1, 0, 0]
    finally:
        lanes.dispose()

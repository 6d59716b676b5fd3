"""Reports waiting for an analytics child hold none of the store's read slots.

A server process has two analytics children (reports/live.py), one report each. Reports
beyond two used to wait for a child holding a read slot each: a dashboard's panels, or
any eight reports at once, took every read slot, and the store's other readers (a
trainer's `GET /v1/correlations/{cid}`, a fetch, a list) waited `TRACESTORE_DB_WAIT`,
then got 503 `database_busy`. Now a report waits for a child first, then takes its read
slot: at most two are held by reports.

The reports are held still by a PostgreSQL lock on a table they read (the analytics
child's scan waits for it), so the test does not depend on how long a report takes.
SQLite has no such lock for readers (WAL): the test runs on PostgreSQL only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from tests.conftest import Database
from tests.reliability.harness import ServerProcess
from tracestore.db.engine import create_engine

READ_SLOTS = 4
WAIT_S = 3
REPORTS = 8  # twice the read slots


@pytest.fixture
def server(fresh_db: Database, tmp_path: Path) -> Iterator[ServerProcess]:
    """One worker with READ_SLOTS read slots and a wait of WAIT_S seconds."""
    if fresh_db.backend != "postgresql":
        pytest.skip("needs a lock that stops readers: PostgreSQL's (SQLite readers never wait)")
    env = {"TRACESTORE_DB_POOL_SIZE": str(READ_SLOTS), "TRACESTORE_DB_WAIT": str(WAIT_S)}
    with ServerProcess(fresh_db.url, tmp_path / "server.log", env=env) as s:
        yield s


def test_reports_waiting_for_an_analytics_child_leave_the_reads_alone(
    server: ServerProcess, fresh_db: Database
) -> None:
    url = server.url
    # Warm the children (spawned at the first report) before the lock is taken.
    assert httpx.get(f"{url}/v1/reports/tools", timeout=60).status_code == 200
    engine = create_engine(fresh_db.url)
    answers: list[tuple[httpx.Response, float]] = []  # each with the seconds it took
    lock = threading.Lock()

    def report() -> None:
        started = time.monotonic()
        response = httpx.get(f"{url}/v1/reports/tools", timeout=60)
        with lock:
            answers.append((response, time.monotonic() - started))

    try:
        with engine.connect() as holder:
            holder.execute(text("LOCK TABLE trace_events IN ACCESS EXCLUSIVE MODE"))
            threads = [threading.Thread(target=report) for _ in range(REPORTS)]
            for thread in threads:
                thread.start()
            # While every report is in (two held by the lock in the children, the rest
            # queued): reads are answered, and so is what needs no analytics child. Kept
            # waiting behind the reports, they would be refused 503 after WAIT_S: their
            # statuses are the check, not their times (a loaded runner stretches those).
            for _ in range(3):
                time.sleep(0.3)
                read = httpx.get(f"{url}/v1/rollouts", params={"limit": 1}, timeout=30)
                assert read.status_code == 200, read.text
            for path, status in (
                ("/v1/reports", 200),
                ("/v1/reports/no-such-report", 404),
                ("/v1/reports/tools?format=xml", 422),
            ):
                answer = httpx.get(url + path, timeout=30)
                assert answer.status_code == status, (path, answer.text)
            # Past the wait, the queued reports are refused, saying why; the two in the
            # children still wait for the lock.
            deadline = time.monotonic() + WAIT_S + 30
            while len(answers) < REPORTS - 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            with lock:
                refused = list(answers)
            assert len(refused) == REPORTS - 2, [(r.status_code, s) for r, s in refused]
            for response, seconds in refused:
                assert response.status_code == 503
                assert seconds >= WAIT_S - 0.1  # after the whole wait, not before
                assert response.headers["Retry-After"] == "1"
                error = response.json()["error"]
                assert error["code"] == "database_busy"
                assert "analytics processes stayed busy" in error["message"]
            holder.rollback()  # the lock goes: the two running reports finish
        for thread in threads:
            thread.join(60)
    finally:
        engine.dispose()
    statuses = sorted(response.status_code for response, _ in answers)
    assert statuses == [200, 200] + [503] * (REPORTS - 2)

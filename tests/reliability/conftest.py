"""Fixtures of the reliability suites, and the figures file written at the end of a run."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from tests.conftest import Database, _PgDatabases, new_database
from tests.reliability.harness import (
    FIGURES,
    SIZE,
    SIZE_NAME,
    ServerProcess,
    partial_runs,
    stored_documents,
)
from tracestore.db import migrate
from tracestore.db.engine import create_engine

_started = time.time()
_outcomes: Counter[str] = Counter()


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"reliability size: {SIZE_NAME} ({SIZE})"]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "tests/reliability/" not in report.nodeid.replace("\\", "/"):
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _outcomes[report.outcome] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not FIGURES.data and not FIGURES.notes and not _outcomes:
        return
    path = FIGURES.write(
        {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(_started)),
            "duration_s": round(time.time() - _started, 1),
            "tests": dict(_outcomes),
            "exit_status": int(exitstatus),
        }
    )
    reporter: Any = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"reliability figures: {path}")


@pytest.fixture
def fresh_engine(fresh_db: Database) -> Iterator[Engine]:
    """An engine on `fresh_db`, to check what the server stored."""
    engine = create_engine(fresh_db.url)
    yield engine
    engine.dispose()


HOSTILE_MAX_BODY = 4 * 1024 * 1024
HOSTILE_TIMEOUT_S = 60.0  # a request that takes longer is a hang


@dataclass
class Target:
    """The server under attack and an engine on its database."""

    server: ServerProcess
    engine: Engine
    backend: str

    def client(self) -> httpx.Client:
        """A new client: a 500 closes its connection, so cases never share one."""
        # verify=False: plain HTTP on loopback; skips loading CA files for every client.
        return httpx.Client(base_url=self.server.url, timeout=HOSTILE_TIMEOUT_S, verify=False)


@pytest.fixture(scope="session")
def target(
    backend: str, tmp_path_factory: pytest.TempPathFactory, pg_databases: _PgDatabases | None
) -> Iterator[Target]:
    """A `tracestore serve` subprocess (4 MiB body limit) on a new database of `backend`."""
    db = new_database(backend, "hostile", tmp_path_factory, pg_databases)
    engine = create_engine(db.url)
    migrate.upgrade(engine)
    log = tmp_path_factory.mktemp("hostile") / "server.log"
    env = {"TRACESTORE_MAX_BODY_BYTES": str(HOSTILE_MAX_BODY)}
    with ServerProcess(db.url, log, env=env) as server:
        yield Target(server, engine, backend)
    # Whatever the attacks got accepted is whole: every stored run has its document's rows.
    assert partial_runs(engine, stored_documents(engine)) == []
    engine.dispose()

"""Reports on a live SQLite store never cost an acknowledged rollout (issue 18, item 1).

DuckDB's sqlite extension carries its own SQLite library. When it opened the store inside
the server, closing it dropped the server's POSIX locks; the next process to close the
file (any CLI command) then thought it was the last user, checkpointed and deleted the
WAL under the live server, whose later commits went to a deleted file and were lost at
the next SIGKILL. These tests drive the real sequence: a real server over a SQLite file,
real report requests, real CLI processes on the same file, real SIGKILLs.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
from pathlib import Path

import httpx
import orjson
import pytest
from sqlalchemy import Engine

from tests.reliability.harness import (
    FIGURES,
    SIZE,
    TRACESTORE,
    RolloutFactory,
    ServerProcess,
    count_response,
    partial_runs,
    run_id_of,
    stored_documents,
    verify_stored,
)
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.reports.connection import open_live

REPORTS = ("returns", "rewards", "tools", "correlation", "drift", "models", "migration")


def _new_store(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "store.db"
    engine = create_engine(f"sqlite:///{path}")
    migrate.upgrade(engine)
    engine.dispose()
    return f"sqlite:///{path}", path


def _cli(db_url: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """A tracestore command in its own process, pointed at the store by the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACESTORE_")}
    env["TRACESTORE_DATABASE_URL"] = db_url
    return subprocess.run([TRACESTORE, *args], env=env, capture_output=True, timeout=120)


def _post(url: str, raw: bytes, section: str) -> str:
    response = httpx.post(
        url + "/v1/rollouts",
        content=raw,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    count_response(section, response)
    assert response.status_code in (200, 201), response.text
    status: str = response.json()["status"]
    return status


def _run_ids_in_file(path: Path) -> set[str]:
    # A fresh connection of a fresh process's view: what survives the server.
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT run_id FROM runs")}


def test_a_report_then_a_cli_read_then_sigkill_loses_nothing(tmp_path: Path) -> None:
    db_url, path = _new_store(tmp_path)
    factory = RolloutFactory("report-cli")
    sent = [factory.make() for _ in range(6)]
    with ServerProcess(db_url, tmp_path / "server.log") as server:
        for raw in sent[:5]:
            _post(server.url, raw, "reports-cli/sqlite")
        response = httpx.get(server.url + "/v1/reports/returns", timeout=120)
        assert response.status_code == 200, response.text
        shown = _cli(db_url, "show", run_id_of(sent[0]))
        assert shown.returncode == 0, shown.stderr
        # The server's WAL must still be there: the CLI's close did not think it was last.
        assert path.with_name(path.name + "-wal").exists()
        assert _post(server.url, sent[5], "reports-cli/sqlite") == "created"
        server.kill()
    assert _run_ids_in_file(path) == {run_id_of(raw) for raw in sent}


def test_crash_series_mixing_reports_cli_reads_and_ingest(tmp_path: Path) -> None:
    db_url, path = _new_store(tmp_path)
    section = "reports-crash/sqlite"
    rng = random.Random(18)
    factory = RolloutFactory("mixed")
    sent: dict[str, bytes] = {}
    server = ServerProcess(db_url, tmp_path / "server.log")
    try:
        for cycle in range(SIZE.kills):
            server.start()
            for step in range(SIZE.acks_between_kills):
                raw = factory.make(f"k{cycle}-")
                sent[run_id_of(raw)] = raw
                _post(server.url, raw, section)
                action = (cycle + step) % 3
                if action == 0:
                    name = rng.choice(REPORTS)
                    response = httpx.get(f"{server.url}/v1/reports/{name}", timeout=120)
                    count_response(section, response)
                    assert response.status_code == 200, response.text
                elif action == 1:
                    done = _cli(db_url, "show", rng.choice(list(sent)))
                    assert done.returncode == 0, done.stderr
                else:
                    done = _cli(db_url, "report", rng.choice(REPORTS), "--format", "json")
                    assert done.returncode == 0, done.stderr
            # One more after the last reader: the write most at risk.
            raw = factory.make(f"k{cycle}-last-")
            sent[run_id_of(raw)] = raw
            _post(server.url, raw, section)
            server.kill()
            FIGURES.add(section, kills=1, acknowledged=SIZE.acks_between_kills + 1)
            missing = set(sent) - _run_ids_in_file(path)
            assert not missing, f"cycle {cycle}: acknowledged then lost: {sorted(missing)}"
        server.start()
        assert verify_stored(server.url, sent, list(sent)) == []
    finally:
        server.stop()
    engine = create_engine(db_url)
    try:
        assert partial_runs(engine, stored_documents(engine)) == []
    finally:
        engine.dispose()
    FIGURES.add(section, verified=len(sent))


def test_duckdb_may_not_attach_a_live_sqlite_store_in_this_process(engine: Engine) -> None:
    if engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL is read over the network: in-process DuckDB is safe there")
    with pytest.raises(RuntimeError, match="child process"):
        open_live(engine)


def test_an_export_beside_a_live_server_loses_nothing(
    tmp_path: Path,
) -> None:
    db_url, path = _new_store(tmp_path)
    factory = RolloutFactory("export")
    with ServerProcess(db_url, tmp_path / "server.log") as server:
        raws = [factory.make() for _ in range(3)]
        for raw in raws[:2]:
            _post(server.url, raw, "reports-export/sqlite")
        done = _cli(db_url, "export", str(tmp_path / "snap"))
        assert done.returncode == 0, done.stderr
        manifest = orjson.loads((tmp_path / "snap" / "manifest.json").read_bytes())
        assert manifest["tables"]["runs"]["rows"] == 2
        assert _cli(db_url, "show", run_id_of(raws[0])).returncode == 0
        _post(server.url, raws[2], "reports-export/sqlite")
        server.kill()
    assert _run_ids_in_file(path) == {run_id_of(raw) for raw in raws}

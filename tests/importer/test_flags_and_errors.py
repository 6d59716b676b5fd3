"""0/1 flags in producers' traces, and what `import synth-db` and `ingest` say about files
that are not what they read."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import Connection, text

from tests.conftest import minimal_rollout, store_raw
from tracestore.errors import InvalidRollout

TRACESTORE = str(Path(sys.executable).parent / "tracestore")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TRACESTORE, *args], capture_output=True, text=True, timeout=120, check=False
    )


def _readback_like(terminated: Any) -> dict[str, Any]:
    """A trace shaped as synth-ai's load_session_trace gives it: SQLite's 0/1 for flags."""
    event = {
        "id": 2,
        "event_type": "environment",
        "system_instance_id": "env",
        "time_record": {"event_time": 1763640000.5, "message_time": None, "created_at": None},
        "reward": 1.0,
        "terminated": terminated,
        "truncated": 0,
        "system_state_before": {"x": 0},
        "metadata": {"step_id": "decision_0"},
    }
    trace = {
        "session_id": "s-1",
        "created_at": "2025-11-20T12:00:00+00:00",
        "metadata": {},
        "session_time_steps": [{"step_id": "decision_0", "step_index": 0, "metadata": {}}],
        "event_history": [event],
        "events": [event],
        "markov_blanket_message_history": [],
    }
    return minimal_rollout("readback-flags", trajectories=[], trace=trace)


def test_zero_and_one_are_read_as_booleans_and_the_document_kept(
    connection: Connection,
) -> None:
    raw = orjson.dumps(_readback_like(1))
    result = store_raw(connection, raw)
    assert result.status == "created"
    flags = connection.execute(
        text("SELECT terminated, truncated FROM trace_events WHERE event_type = 'environment'")
    ).one()
    assert (bool(flags.terminated), bool(flags.truncated)) == (True, False)
    assert flags.terminated in (True, 1)  # a boolean column on both databases


def test_other_integers_are_still_refused(connection: Connection) -> None:
    with pytest.raises(InvalidRollout) as refused:
        store_raw(connection, orjson.dumps(_readback_like(2)))
    assert "terminated" in refused.value.message
    with pytest.raises(InvalidRollout):
        store_raw(connection, orjson.dumps(_readback_like(1.0)))  # a float is not a flag


def test_ingest_names_the_importer_for_a_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "synth.db"
    sqlite3.connect(path).execute("CREATE TABLE session_traces (session_id TEXT)").close()
    done = _cli("ingest", str(path), "--db", f"sqlite:///{tmp_path / 'store.db'}")
    assert done.returncode == 2
    assert "a SQLite database, not rollout JSON" in done.stderr
    assert "tracestore import synth-db" in done.stderr
    assert "invalid" not in done.stderr  # one line for the file, not a bad document


@pytest.mark.parametrize(
    ("make", "says"),
    [
        ("json", "not a SQLite database"),
        ("other-sqlite", "not a synth-ai trace database"),
        ("missing", "No such file"),
        ("remote", "remote libsql database"),
    ],
)
def test_import_refuses_what_is_not_a_synth_database(tmp_path: Path, make: str, says: str) -> None:
    path = tmp_path / "traces.db"
    location = str(path)
    if make == "json":
        path.write_text(json.dumps(minimal_rollout("r-1")))
    elif make == "other-sqlite":
        sqlite3.connect(path).execute("CREATE TABLE runs (id INTEGER)").close()
    elif make == "remote":
        location = "libsql://traces-org.turso.io?authToken=x"
    store = tmp_path / "store.db"
    done = _cli("import", "synth-db", location, "--db", f"sqlite:///{store}")
    assert done.returncode == 2, done.stdout
    assert says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1  # one readable line, no traceback
    assert not store.exists()  # refused before the store is touched


def test_import_takes_db_or_url_not_both(tmp_path: Path) -> None:
    done = _cli("import", "synth-db", "x.db", "--db", "sqlite:///y.db", "--url", "http://h")
    assert done.returncode == 2
    assert "not both" in done.stderr


def test_import_help_says_what_it_does() -> None:
    done = _cli("import", "synth-db", "--help")
    assert done.returncode == 0
    assert "synth-ai" in done.stdout
    assert "--map" in done.stdout

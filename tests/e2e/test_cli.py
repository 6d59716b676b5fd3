"""The console script, run as a user runs it (a real subprocess)."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from tests.conftest import (
    EXAMPLES,
    Database,
    Example,
    LiveServer,
    _PgDatabases,
    free_port,
    hold_back,
    new_database,
    wipe,
)
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.settings import Settings

TRACESTORE = shutil.which("tracestore", path=str(Path(sys.executable).parent)) or "tracestore"


def run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TRACESTORE, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
        check=False,
    )


def test_help_on_every_verb() -> None:
    for verb in ([], ["serve"], ["db"], ["db", "upgrade"], ["ingest"], ["show"], ["cid"]):
        done = run(*verb, "--help")
        assert done.returncode == 0, done.stderr
        assert "Usage" in done.stdout


def _verbs() -> list[list[str]]:
    import typer.main

    from tracestore.cli.main import app

    def walk(command: Any, path: list[str]) -> list[list[str]]:
        subs = getattr(command, "commands", {})
        return [path] + [v for name, sub in subs.items() for v in walk(sub, [*path, name])]

    return walk(typer.main.get_command(app), [])


def test_every_verbs_help_fills_an_80_column_terminal() -> None:
    # Typer kept a docstring's single line breaks, so a paragraph wrapped at 88 columns came
    # out ragged at 80: "every" / "row of" / "a run has its run's day". Wrapped afresh, a
    # line of a paragraph ends only where the next line's first word would not fit.
    verbs = _verbs()
    assert ["export"] in verbs
    assert ["dataset", "create"] in verbs
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    for verb in verbs:
        done = run(*verb, "--help", env=env)
        assert done.returncode == 0, (verb, done.stderr)
        text = done.stdout.split("\u256d", 1)[0]  # the description, before the first box
        lines = [line.strip() for line in text.splitlines()]
        for this, after in itertools.pairwise(lines):
            if this and after and not this.startswith("Usage:"):
                room = 78 - len(this) - 1
                assert len(after.split()[0]) > room, (verb, this, after)


def test_piped_output_has_no_progress_bars_and_unwrapped_lines(tmp_path: Path) -> None:
    # Piped, `backfill` and `drift --recompute` wrote their progress bars to stderr, and
    # a summary longer than 80 columns came out in two lines (a `grep` found half).
    db = f"sqlite:///{tmp_path / 'piped.db'}"
    assert run("demo", "--db", db).returncode == 0
    for verb in (["backfill"], ["drift", "--recompute"]):
        done = run(*verb, "--db", db)
        assert done.returncode == 0, done.stdout + done.stderr
        # The bars' lines: "backfill ━━━ 6/6 0:00:00", "recomputing drift ━━━ ...".
        assert "\u2501" not in done.stderr, done.stderr
        if verb == ["backfill"]:
            line = done.stdout.splitlines()[0]
            assert line.startswith("backfill: "), done.stdout
            assert len(line) > 80, line  # (else this checks nothing)
            assert line.endswith("still pending"), done.stdout


def test_ingest_show_cid_on_a_new_sqlite_file(tmp_path: Path, examples: list[Example]) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    gz = tmp_path / "rollouts.jsonl.gz"
    gz.write_bytes(gzip.compress((EXAMPLES / "rollouts.jsonl").read_bytes()))
    done = run("ingest", str(gz), "--db", db)
    # One example conflicts with an earlier run_id: an input error, exit 2, with the reason.
    assert done.returncode == 2, done.stderr
    created = sum(e.label["expect_status"] == "created" for e in examples)
    duplicates = sum(e.label["expect_status"] == "duplicate" for e in examples)
    counts = f"{created} created, {duplicates} duplicate, 1 conflict, 0 invalid"
    assert f"{len(examples)} rollouts: {counts}" in done.stdout
    assert "differing top-level parts" in done.stdout
    # Again: everything is now a duplicate or the same conflict.
    again = run("ingest", str(gz), "--db", db)
    assert f"0 created, {created + duplicates} duplicate, 1 conflict" in again.stdout

    ex = examples[1]
    shown = run("show", ex.label["run_id"], "--db", db, "--raw")
    assert shown.returncode == 0
    assert json.loads(shown.stdout) == ex.doc

    listed = run("cid", ex.label["correlation_id"], "--db", db, "--json")
    assert listed.returncode == 0
    assert [r["run_id"] for r in json.loads(listed.stdout)["runs"]] == [ex.label["run_id"]]

    missing = run("show", "no-such-run", "--db", db)
    assert missing.returncode == 2
    assert missing.stderr.strip().startswith("error:")
    assert "no-such-run" in missing.stderr


def test_ingest_reports_invalid_documents(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"run_id": ""}\nnot json\n')
    done = run("ingest", str(bad), "--db", f"sqlite:///{tmp_path / 'x.db'}")
    assert done.returncode == 2
    assert "0 created, 0 duplicate, 0 conflict, 2 invalid" in done.stdout
    assert f"{bad}:1" in done.stdout
    assert "run_id" in done.stdout
    assert f"{bad}:2" in done.stdout
    assert "not valid JSON" in done.stdout


def test_ingest_json_array_file(tmp_path: Path, examples: list[Example]) -> None:
    path = tmp_path / "two.json"
    path.write_text(json.dumps([examples[0].doc, examples[2].doc]))
    done = run("ingest", str(path), "--db", f"sqlite:///{tmp_path / 'y.db'}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 rollouts: 2 created" in done.stdout


def test_ingest_into_a_running_server(
    database: Database, examples: list[Example], tmp_path: Path
) -> None:
    engine = create_engine(database.url)
    wipe(engine)
    try:
        with LiveServer(Settings(database_url=database.url)) as live:
            done = run("ingest", str(EXAMPLES / "rollouts.jsonl"), "--url", live.url)
            assert done.returncode == 2  # the conflicting example
            created = sum(e.label["expect_status"] == "created" for e in examples)
            assert f"{created} created" in done.stdout
            got = httpx.get(f"{live.url}/v1/rollouts/{examples[0].label['run_id']}")
            assert got.json() == examples[0].doc
    finally:
        wipe(engine)
        engine.dispose()


def test_ingest_into_an_unreachable_server(tmp_path: Path, examples: list[Example]) -> None:
    # Valid rollouts (no conflict among them): the only reason to fail is the server.
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_bytes(b"\n".join(ex.raw for ex in examples[:3]))
    url = f"http://127.0.0.1:{free_port()}"
    done = run("ingest", str(rollouts), "--url", url)
    assert done.returncode == 2
    assert done.stderr.strip().startswith(f"error: cannot reach {url}"), done.stderr
    assert "rollouts:" not in done.stdout  # no summary: nothing was sent


def _wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> httpx.Response:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            return httpx.get(url + "/health", timeout=2)
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError("server did not come up")


def test_serve_creates_and_migrates_a_new_sqlite_file(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACESTORE_")}
    proc = subprocess.Popen(
        [TRACESTORE, "serve", "--port", str(port), "--log-level", "warning"],
        cwd=tmp_path,  # the default URL is ./tracestore.db
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        health = _wait_healthy(f"http://127.0.0.1:{port}", proc)
        assert health.status_code == 200
        assert health.json()["healthy"] is True
        assert (tmp_path / "tracestore.db").is_file()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_a_store_at_the_previous_revision_is_refused_with_the_fix(
    backend: str, tmp_path_factory: pytest.TempPathFactory, pg_databases: _PgDatabases | None
) -> None:
    # A store the previous release left (a run in it), used by this release's commands.
    db = new_database(backend, "stale", tmp_path_factory, pg_databases).url
    held_at = hold_back(db)
    fix = f"database is at {held_at}, code expects {migrate.head_revision()}: "
    fix += "run 'tracestore db upgrade'"
    # A refusal is immediate; a server that starts instead would run until the timeout.
    served = run("serve", "--db", db, "--port", str(free_port()), timeout=60)
    assert served.returncode == 1
    assert fix in served.stderr
    check = run("db", "check", "--db", db)
    assert check.returncode == 1
    assert fix in check.stdout + check.stderr
    ingested = run("ingest", str(EXAMPLES / "rollouts.jsonl"), "--db", db)
    assert ingested.returncode == 1
    assert fix in ingested.stderr
    # Refused, not migrated behind the owner's back, and nothing written.
    engine = create_engine(db)
    try:
        assert migrate.current_revision(engine) == held_at
        with engine.connect() as conn:
            assert conn.execute(text("SELECT run_id FROM runs")).scalars().all() == [
                "stored-before"
            ]
    finally:
        engine.dispose()


@pytest.mark.parametrize("verb", [["show", "x"], ["cid", "x"]])
def test_unreachable_database_is_one_line(verb: list[str]) -> None:
    done = run(*verb, "--db", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert done.returncode == 2
    assert done.stderr.count("\n") <= 2
    assert "error:" in done.stderr

"""`tracestore demo`: the examples into a new store, a given store, a running server, and
from an installed wheel; what it prints to try next works."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import orjson
import pytest
from sqlalchemy import text

from tests.conftest import Database, Example, LiveServer, free_port, row_counts, wipe
from tests.e2e.test_cli import run
from tracestore.cli.demo import examples_dir
from tracestore.db.engine import create_engine
from tracestore.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACESTORE_")}
    env["COLUMNS"] = "200"  # rich tables keep whole run ids
    env.update(extra)
    return env


def _counts(examples: list[Example], first_time: bool = True) -> str:
    statuses = [e.label["expect_status"] for e in examples]
    created, duplicate = statuses.count("created"), statuses.count("duplicate")
    conflict = statuses.count("conflict")
    if not first_time:
        created, duplicate = 0, created + duplicate
    return (
        f"{len(examples)} rollouts: {created} created, {duplicate} duplicate, "
        f"{conflict} conflict, 0 invalid"
    )


def _next(stdout: str) -> list[str]:
    """The commands the demo suggests, one per line after `Next:`."""
    lines = stdout.split("\nNext:\n", 1)[1].splitlines()
    return [line.strip() for line in lines if line.startswith("  ")]


def _shown_runs(stdout: str) -> dict[str, str]:
    """label -> run_id of the `One rollout of each shape` lines."""
    block = stdout.split("One rollout of each shape:\n", 1)[1].split("\n", 5)[:5]
    return {
        line.split(maxsplit=1)[1]: line.split()[0] for line in block if line.startswith("  run")
    }


def _run_suggested(stdout: str, cwd: Path, env: dict[str, str]) -> list[str]:
    """Run every suggested `tracestore` command but `serve`; return their outputs."""
    outputs = []
    suggested = [c for c in _next(stdout) if c.startswith("tracestore ")]
    assert [c for c in suggested if c.split()[1] == "show"], stdout
    for command in suggested:
        args = shlex.split(command.split("  ")[0])[1:]
        if args[0] == "serve":
            continue
        done = run(*args, cwd=cwd, env=env)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        outputs.append(done.stdout)
    return outputs


def test_examples_dir_is_the_checkouts() -> None:
    assert examples_dir() == ROOT / "examples"
    assert (examples_dir() / "rollouts.jsonl").is_file()


def test_demo_creates_a_new_sqlite_store_and_runs_again_harmlessly(
    tmp_path: Path, examples: list[Example]
) -> None:
    env = _clean_env()
    done = run("demo", cwd=tmp_path, env=env)  # the default store: ./tracestore.db
    assert done.returncode == 0, done.stderr
    assert _counts(examples) in done.stdout
    assert "sqlite:///./tracestore.db" in done.stdout
    assert "conflict: " in done.stdout  # the repeated run_id, with its reason
    shown = _shown_runs(done.stdout)
    assert len(shown) == 5, done.stdout  # one run of each shape
    by_id = {e.label["run_id"]: e for e in examples}
    assert by_id[shown["trajectories only (trace null)"]].doc["trace"] is None
    trace_only = next(run_id for label, run_id in shown.items() if label.startswith("trace only"))
    assert by_id[trace_only].doc["trajectories"] == []

    outputs = _run_suggested(done.stdout, tmp_path, env)
    shown_doc = orjson.loads(outputs[0])  # `show` comes first: the document as received
    assert shown_doc == by_id[shown_doc["run_id"]].doc

    engine = create_engine(f"sqlite:///{tmp_path / 'tracestore.db'}")
    try:
        before = row_counts(engine)
        again = run("demo", cwd=tmp_path, env=env)
        assert again.returncode == 0, again.stderr
        assert _counts(examples, first_time=False) in again.stdout
        assert row_counts(engine) == before
    finally:
        engine.dispose()


def test_demo_into_the_store_given_by_db(database: Database, examples: list[Example]) -> None:
    engine = create_engine(database.url)
    wipe(engine)
    try:
        env = _clean_env()
        done = run("demo", "--db", database.url, env=env)
        assert done.returncode == 0, done.stderr
        assert _counts(examples) in done.stdout
        created = sum(e.label["expect_status"] == "created" for e in examples)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM runs")).scalar_one() == created
        # The suggested commands name the same store, so they work as printed.
        assert all(f"--db {database.url}" in c for c in _next(done.stdout) if "tracestore" in c)
        _run_suggested(done.stdout, ROOT, env)
    finally:
        wipe(engine)
        engine.dispose()


def test_demo_into_a_running_server(database: Database, examples: list[Example]) -> None:
    engine = create_engine(database.url)
    wipe(engine)
    try:
        with LiveServer(Settings(database_url=database.url)) as live:
            done = run("demo", "--url", live.url, env=_clean_env())
            assert done.returncode == 0, done.stderr
            assert _counts(examples) in done.stdout
            suggested = [c for c in _next(done.stdout) if c.startswith("curl -s ")]
            assert len(suggested) >= 3, done.stdout
            for command in suggested:
                url = command.removeprefix("curl -s ")
                assert url.startswith(live.url), command
                got = httpx.get(url, timeout=60)
                assert got.status_code == 200, f"{command}: {got.text[:300]}"
                if url.endswith("/trajectories"):
                    assert got.headers["X-Tracestore-Source"] == "converted"
            first = examples[0]
            stored = httpx.get(f"{live.url}/v1/rollouts/{first.label['run_id']}", timeout=60)
            assert stored.json() == first.doc
    finally:
        wipe(engine)
        engine.dispose()


def test_demo_refuses_db_and_url_together(tmp_path: Path) -> None:
    done = run("demo", "--db", f"sqlite:///{tmp_path / 'x.db'}", "--url", "http://127.0.0.1:1")
    assert done.returncode == 2
    assert "give --db or --url, not both" in done.stderr
    assert not (tmp_path / "x.db").exists()


def test_demo_into_an_unreachable_server() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = run("demo", "--url", url, env=_clean_env())
    assert done.returncode == 2
    assert f"cannot reach {url}" in done.stderr
    assert done.stderr.count("\n") <= 2


def test_demo_works_from_an_installed_wheel(tmp_path: Path, examples: list[Example]) -> None:
    if importlib.util.find_spec("hatchling") is None:
        pytest.skip("hatchling (a dev dependency) is not installed")
    built = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path / "dist")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert "tracestore/_examples/rollouts.jsonl" in zipfile.ZipFile(wheel).namelist()
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), wheel],
        check=True,
        timeout=300,
    )
    # From an unrelated folder, with only the installed copy of tracestore on the path.
    away = tmp_path / "away"
    away.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", "from tracestore.cli.main import app; app()", "demo"],
        cwd=away,
        env=_clean_env(PYTHONPATH=str(target)),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert str(target / "tracestore" / "_examples" / "rollouts.jsonl") in done.stdout
    assert _counts(examples) in done.stdout
    assert (away / "tracestore.db").is_file()

"""The verbs, run as a user runs them (a real subprocess), on both databases: `delete`
(--db and --url), `dataset`, `retention` and `db vacuum`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from tests.conftest import Database, Example, LiveServer
from tests.deletion.conftest import ingest_examples, orphans
from tests.e2e.test_cli import run
from tracestore.settings import Settings

DRIFTING = "run-1001-00013-36f45625"
OTHER = "run-1001-00000-32b27cad"


def _runs(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT run_id FROM runs")).scalars())


@pytest.fixture
def admin_server(database: Database, engine: Engine) -> Iterator[LiveServer]:
    settings = Settings(database_url=database.url, api_keys=["ops:op-key:admin", "w:w-key"])
    with LiveServer(settings) as live:
        yield live


def test_delete_dataset_and_retention_verbs(
    database: Database, engine: Engine, examples: list[Example]
) -> None:
    created = ingest_examples(engine, examples)
    db = ["--db", database.url]

    made = run("dataset", "create", "tour", "--cid", "trace_620a906ba53dd188", "--json", *db)
    assert made.returncode == 0, made.stderr
    manifest = json.loads(made.stdout)
    assert (manifest["name"], manifest["n_runs"], manifest["created_by"][:4]) == (
        "tour",
        1,
        "cli:",
    )

    kept = run("delete", DRIFTING, "nope", *db)
    assert kept.returncode == 2
    assert "pinned by dataset tour" in kept.stderr
    assert "not found: nope" in kept.stderr
    assert DRIFTING in _runs(engine)

    gone = run("delete", OTHER, "--reason", "gdpr", "--json", *db)
    assert gone.returncode == 0, gone.stderr
    assert json.loads(gone.stdout) == [{"run_id": OTHER, "status": "deleted", "pinned_by": None}]
    assert OTHER not in _runs(engine)
    with engine.connect() as conn:
        who, why = conn.execute(
            text("SELECT deleted_by, reason FROM run_deletions WHERE run_id = :r"), {"r": OTHER}
        ).one()
    assert who.startswith("cli:")
    assert why == "gdpr"
    assert run("delete", OTHER, *db).returncode == 2  # a second delete: not found

    assert run("retention", "set", "all", "--keep-last", "0", *db).returncode == 0
    shown = run("retention", "show", "--json", *db)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["pinned_skipped"] == {"all": 1}
    dry = run("retention", "apply", "--dry-run", "--json", *db)
    assert dry.returncode == 0, dry.stderr
    planned = {r["run_id"] for r in json.loads(dry.stdout)["runs"]}
    assert planned == set(created) - {OTHER, DRIFTING}
    assert len(_runs(engine)) == len(created) - 1  # a dry run deletes nothing

    done = run("retention", "apply", "--batch-size", "7", "--json", *db)
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["deleted"] == len(planned)
    assert body["batches"] == -(-len(planned) // 7)
    assert _runs(engine) == {DRIFTING}  # the pinned run survives
    assert orphans(engine) == {}

    vacuumed = run("db", "vacuum", *db)
    assert vacuumed.returncode == 0, vacuumed.stderr
    assert "VACUUM" in vacuumed.stdout

    assert run("dataset", "drop", "tour", *db).returncode == 0
    assert run("retention", "apply", *db).returncode == 0
    assert _runs(engine) == set()
    assert run("retention", "unset", "all", *db).returncode == 0
    assert run("retention", "apply", *db).returncode == 2  # no rule left


def test_delete_through_a_server_needs_the_admin_key(
    admin_server: LiveServer, engine: Engine, examples: list[Example], tmp_path: Path
) -> None:
    ingest_examples(engine, examples)
    url = ["--url", admin_server.url]
    refused = run("delete", OTHER, *url, "--api-key", "w-key")
    assert refused.returncode == 2
    assert "admin role" in refused.stderr
    assert OTHER in _runs(engine)
    done = run("delete", OTHER, DRIFTING, *url, "--api-key", "op-key", "--reason", "r")
    assert done.returncode == 0, done.stderr
    assert f"deleted {OTHER}" in done.stdout
    assert not ({OTHER, DRIFTING} & _runs(engine))
    again = run("delete", OTHER, *url, "--api-key", "op-key")
    assert again.returncode == 2
    assert "not found" in again.stderr


def test_delete_through_a_server_finds_no_empty_run_id(
    admin_server: LiveServer, engine: Engine, examples: list[Example]
) -> None:
    """An empty run_id is not found (no run has one), as --db says: its address would be
    the list's, which answered something else."""
    ingest_examples(engine, examples)
    url = ["--url", admin_server.url, "--api-key", "op-key"]
    done = run("delete", "", OTHER, *url, "--json")
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stdout) == [
        {"run_id": "", "status": "not_found", "pinned_by": None},
        {"run_id": OTHER, "status": "deleted", "pinned_by": None},
    ]
    assert OTHER not in _runs(engine)
    local = run("delete", "", "--db", str(engine.url), "--json")
    assert local.returncode == 2, local.stderr
    assert json.loads(local.stdout) == [{"run_id": "", "status": "not_found", "pinned_by": None}]

"""Migrations walk base -> head -> base on both databases; the result equals the models."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from tests.conftest import LiveServer, hold_back, new_database, previous_revision
from tracestore.api import create_app
from tracestore.db import migrate
from tracestore.db.base import Base
from tracestore.db.engine import create_engine
from tracestore.errors import SchemaOutOfDate
from tracestore.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh(backend: str, tmp_path_factory: pytest.TempPathFactory, pg_databases: object) -> str:
    return new_database(backend, "mig", tmp_path_factory, pg_databases).url  # type: ignore[arg-type]


def test_every_revision_up_and_down(fresh: str) -> None:
    engine = create_engine(fresh)
    revisions = list(
        reversed(list(ScriptDirectory.from_config(migrate.alembic_config()).walk_revisions()))
    )
    assert revisions, "no revisions"
    for rev in revisions:
        migrate.upgrade(engine, rev.revision)
        assert migrate.current_revision(engine) == rev.revision
    assert migrate.schema_differences(engine, Base.metadata) == []
    tables = set(inspect(engine).get_table_names())
    assert set(Base.metadata.tables) <= tables
    for rev in reversed(revisions):
        migrate.downgrade(engine, rev.down_revision or "base")  # type: ignore[arg-type]
    assert migrate.current_revision(engine) is None
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    engine.dispose()


@pytest.mark.parametrize("held_at", ["empty", "previous revision"])
def test_stale_schema_is_refused_with_the_fix(fresh: str, held_at: str) -> None:
    current = hold_back(fresh) if held_at == "previous revision" else None
    head = migrate.head_revision()
    engine = create_engine(fresh)
    fix = f"code expects {head}: run 'tracestore db upgrade'"
    shown = current or "no revision (empty)"
    with pytest.raises(SchemaOutOfDate) as refused:
        migrate.check_schema(engine)
    assert refused.value.message == f"database is at {shown}, {fix}"
    assert refused.value.details == {"current": current, "expected": head}
    if current is not None:
        # A store that is not new is never migrated behind its owner's back.
        with pytest.raises(SchemaOutOfDate, match=f"database is at {current},"):
            migrate.ensure_schema(engine, create_new=True)
        assert migrate.current_revision(engine) == current
        # Nor served: the app's startup refuses it with the same message.
        app = create_app(Settings(database_url=fresh))

        async def start() -> None:
            async with app.router.lifespan_context(app):
                pass

        with pytest.raises(SchemaOutOfDate, match=f"database is at {current}, {fix}"):
            asyncio.run(start())
    migrate.upgrade(engine)
    assert migrate.check_schema(engine) == head
    if current is not None:
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT run_id FROM runs")).scalars().all()
        assert stored == ["stored-before"]  # the upgrade kept what was there
    engine.dispose()


def test_health_is_503_when_the_schema_goes_stale_under_a_running_server(fresh: str) -> None:
    engine = create_engine(fresh)
    migrate.upgrade(engine)
    with LiveServer(Settings(database_url=fresh)) as live:
        assert httpx.get(f"{live.url}/health").status_code == 200
        migrate.downgrade(engine, previous_revision())
        health = httpx.get(f"{live.url}/health")
    engine.dispose()
    assert health.status_code == 503, health.text
    body = health.json()
    assert (body["healthy"], body["schema_revision"]) == (False, previous_revision())
    assert body["error"]["code"] == "schema_out_of_date"
    assert "run 'tracestore db upgrade'" in body["error"]["message"]


def test_new_sqlite_file_is_created_and_migrated(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'new.db'}")
    assert migrate.ensure_schema(engine, create_new=True) == migrate.head_revision()
    engine.dispose()


def test_db_verbs_work_from_an_installed_wheel(tmp_path: Path) -> None:
    """Build the wheel, install it alone into a folder, and migrate with its console code."""
    wheel_dir = tmp_path / "wheel"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
            str(ROOT),
        ],
        check=True,
    )
    target = tmp_path / "site"
    wheel = next(wheel_dir.glob("tracestore-*.whl"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    assert (target / "tracestore" / "_migrations" / "env.py").is_file()
    db = tmp_path / "installed.db"
    # Run from an unrelated folder with only the installed copy first on the path.
    env = dict(os.environ, PYTHONPATH=str(target))
    code = "from tracestore.cli.main import app; app()"
    for args, expect in (
        (["db", "upgrade"], "-> "),
        (["db", "current"], migrate.head_revision()),
        (["db", "check"], "ok: schema at"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", code, *args, "--db", f"sqlite:///{db}"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert expect in done.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import tracestore.db.migrate as m; print(m.migrations_dir())"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(target) in probe.stdout


def test_upgrading_summarizes_stored_runs_from_their_traces(fresh: str) -> None:
    """0004 computes runs.env_id / policy_id / n_trace_steps in SQL for runs already
    stored; they equal what ingest computes for new ones (examples and hand-made runs)."""
    from sqlalchemy import select

    from tests.conftest import load_examples, minimal_rollout
    from tracestore.ingest.service import ingest_many
    from tracestore.models import Run

    engine = create_engine(fresh)
    migrate.upgrade(engine)
    hand_made = [
        minimal_rollout(
            f"meta-{i}",
            trajectories=[],
            trace={"session_id": "s", "session_time_steps": [], "metadata": metadata},
        )
        for i, metadata in enumerate(
            [{"env_id": "e", "policy_id": 3}, {"env_id": "n\u0000l"}, {"env_id": "x" * 1025}, []]
        )
    ]
    ingest_many(engine, [ex.raw for ex in load_examples()])
    ingest_many(engine, [orjson.dumps(doc) for doc in hand_made])
    columns = select(Run.run_id, Run.env_id, Run.policy_id, Run.n_trace_steps).order_by(Run.id)
    with engine.connect() as conn:
        at_ingest = [
            (r.run_id, r.env_id, r.policy_id, r.n_trace_steps) for r in conn.execute(columns)
        ]
    assert any(steps > 0 for *_, steps in at_ingest)
    assert ("meta-0", "e", None, 0) in at_ingest
    migrate.downgrade(engine, "0003")  # the columns go: a store from before them
    migrate.upgrade(engine)
    with engine.connect() as conn:
        assert [tuple(r) for r in conn.execute(columns)] == at_ingest
    engine.dispose()


def test_upgrading_names_runs_from_their_trace_names(fresh: str, backend: str) -> None:
    """0007 takes runs.env_id / policy_id from the trace metadata's env_name / policy_name
    for runs already stored, as ingest now does for new ones; downgrading unsets exactly
    those."""
    from sqlalchemy import select

    from tests.conftest import minimal_rollout
    from tracestore.ingest.service import ingest_many
    from tracestore.models import Run

    engine = create_engine(fresh)
    migrate.upgrade(engine)
    metadatas: list[object] = [
        {"env_name": "crafter", "policy_name": "crafter-react"},
        {"env_id": None, "env_name": "n\u0000l", "policy_id": "own", "policy_name": "x"},
        {"env_id": "own", "env_name": "crafter"},
        {"env_name": "x" * 1025, "policy_name": 3},
        {"env_id": 7, "env_name": "crafter"},  # present, not an id: the name is not taken
        ["not", "an", "object"],
    ]
    docs = [
        minimal_rollout(
            f"names-{i}",
            trajectories=[],
            trace={"session_id": "s", "session_time_steps": [], "metadata": metadata},
        )
        for i, metadata in enumerate(metadatas)
    ]
    # A trajectory's own ids come first, whatever the trace names.
    docs.append(
        minimal_rollout(
            "names-trajectory",
            trace={"session_id": "s", "session_time_steps": [], "metadata": metadatas[0]},
        )
    )
    ingest_many(engine, [orjson.dumps(doc) for doc in docs])
    columns = select(Run.run_id, Run.env_id, Run.policy_id).order_by(Run.id)
    with engine.connect() as conn:
        at_ingest = [tuple(r) for r in conn.execute(columns)]
    # Typed columns on PostgreSQL hold a NUL as U+2400 (docs/FORMAT.md).
    nul = "n\u2400l" if backend == "postgresql" else "n\u0000l"
    assert at_ingest == [
        ("names-0", "crafter", "crafter-react"),
        ("names-1", nul, "own"),
        ("names-2", "own", None),
        ("names-3", None, None),
        ("names-4", None, None),
        ("names-5", None, None),
        ("names-trajectory", "e", "p"),
    ]
    migrate.downgrade(engine, "0006")  # a store from before: ids only from env_id/policy_id
    with engine.connect() as conn:
        before = [tuple(r) for r in conn.execute(columns)]
    assert before == [
        ("names-0", None, None),
        ("names-1", None, "own"),
        ("names-2", "own", None),
        ("names-3", None, None),
        ("names-4", None, None),
        ("names-5", None, None),
        ("names-trajectory", "e", "p"),
    ]
    migrate.upgrade(engine)
    with engine.connect() as conn:
        assert [tuple(r) for r in conn.execute(columns)] == at_ingest
    engine.dispose()

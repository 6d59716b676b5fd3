"""Migrations walk base -> head -> base on both databases; the result equals the models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from tests.conftest import new_database
from tracestore.db import migrate
from tracestore.db.base import Base
from tracestore.db.engine import create_engine
from tracestore.errors import SchemaOutOfDate

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
    assert migrate.schema_differences(engine) == []
    tables = set(inspect(engine).get_table_names())
    assert set(Base.metadata.tables) <= tables
    for rev in reversed(revisions):
        migrate.downgrade(engine, rev.down_revision or "base")  # type: ignore[arg-type]
    assert migrate.current_revision(engine) is None
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    engine.dispose()


def test_stale_schema_is_refused_with_the_fix(fresh: str) -> None:
    engine = create_engine(fresh)
    with pytest.raises(SchemaOutOfDate, match="run 'tracestore db upgrade'"):
        migrate.check_schema(engine)
    migrate.upgrade(engine)
    assert migrate.check_schema(engine) == migrate.head_revision()
    engine.dispose()


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

"""Alembic helpers usable from an installed package: upgrade, current, head, checks."""

from __future__ import annotations

import functools
from pathlib import Path

from sqlalchemy import Engine, MetaData, inspect

from tracestore.errors import InvalidRequest, SchemaOutOfDate


def migrations_dir() -> Path:
    """Alembic's script directory: shipped in the wheel, or at the top of a checkout."""
    package = Path(__file__).resolve().parents[1]
    shipped = package / "_migrations"
    if (shipped / "env.py").is_file():
        return shipped
    return package.parent / "migrations"


def alembic_config(url: str | None = None):  # type: ignore[no-untyped-def]  # alembic import kept lazy
    """An Alembic Config pointing at our scripts (and at `url`, when given)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("file_template", "%%(year)d_%%(month).2d_%%(day).2d_%%(rev)s_%%(slug)s")
    if url is not None:
        # Percent signs in passwords would be read as interpolation by ConfigParser.
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@functools.cache
def head_revision() -> str:
    """The revision this code expects (read once: the scripts ship with the code)."""
    # Reading the scripts takes ~20 ms; /health and /info answer with it on the event loop.
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "no migration scripts found"
    return head


def current_revision(engine: Engine) -> str | None:
    """The database's revision (None for a database Alembic has never touched)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def check_revision(revision: str) -> None:
    """InvalidRequest unless `revision` names one of this code's revisions (or head, base,
    a relative step such as +1 or -1), before any database is touched."""
    import re

    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    if re.fullmatch(r"[+-]\d+", revision.strip()):
        return  # relative to the database's own revision: Alembic checks it there
    scripts = ScriptDirectory.from_config(alembic_config())
    try:
        scripts.get_revisions(revision)
    except CommandError:
        known = ", ".join(s.revision for s in reversed(list(scripts.walk_revisions())))
        raise InvalidRequest(
            f"no schema revision {revision!r}: give head, base, a step (+1, -1) or one of {known}"
        ) from None


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade the database behind `engine` to `revision`."""
    from alembic import command

    _with_connection(engine, lambda cfg: command.upgrade(cfg, revision))


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade the database behind `engine` to `revision`."""
    from alembic import command

    _with_connection(engine, lambda cfg: command.downgrade(cfg, revision))


def _with_connection(engine: Engine, action) -> None:  # type: ignore[no-untyped-def]
    from alembic.util import CommandError

    from tracestore.db.engine import create_migration_engine

    # A separate, unpooled engine: SQLite foreign keys stay off during batch rewrites.
    migration_engine = create_migration_engine(engine.url)
    try:
        with migration_engine.begin() as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            action(cfg)
    except CommandError as exc:
        # What Alembic refuses (a step past the last revision): the user's to change.
        raise InvalidRequest(f"schema migration refused: {exc}") from None
    finally:
        migration_engine.dispose()


def is_empty(engine: Engine) -> bool:
    """True when the database has no tables at all (a new file or a new database)."""
    return not inspect(engine).get_table_names()


def check_schema(engine: Engine) -> str:
    """Return the current revision, or raise SchemaOutOfDate with the fix in the message."""
    expected = head_revision()
    current = current_revision(engine)
    if current != expected:
        raise SchemaOutOfDate(
            f"database is at {current or 'no revision (empty)'}, code expects {expected}: "
            "run 'tracestore db upgrade'",
            current=current,
            expected=expected,
        )
    return current


def ensure_schema(engine: Engine, *, create_new: bool) -> str:
    """Migrate a brand-new database when `create_new`, then insist on the head revision."""
    if create_new and is_empty(engine):
        upgrade(engine)
    return check_schema(engine)


def schema_differences(engine: Engine, metadata: MetaData) -> list[str]:
    """Differences between the database's schema and `metadata` (the models'; empty when
    they match). The caller imports the models: db/ sits below them."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return [repr(d) for d in compare_metadata(context, metadata)]

"""Test fixtures: every store/API test runs on SQLite and on a real PostgreSQL.

Select databases with `--db sqlite|postgresql|both` (or TRACESTORE_TEST_DATABASES).
PostgreSQL comes from TRACESTORE_TEST_PG_URL (default: the local server, database
`test`); each run creates its own database there and drops it at the end. When
PostgreSQL is unreachable its tests are skipped and the run says so loudly, unless
TRACESTORE_TEST_REQUIRE_PG=1 (as in CI), which makes it an error.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from tracestore.db import migrate
from tracestore.db.base import Base
from tracestore.db.engine import create_engine as store_engine
from tracestore.db.engine import write_engine
from tracestore.ingest.service import prepare
from tracestore.settings import Settings
from tracestore.store.rollouts import IngestResult, store_many

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
EXAMPLES = Path(
    os.environ.get("TRACESTORE_EXAMPLES_DIR", Path(__file__).resolve().parents[1] / "examples")
)

_pg_problem: str | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--db",
        default=os.environ.get("TRACESTORE_TEST_DATABASES", "both"),
        choices=("sqlite", "postgresql", "both"),
        help="which databases the store and API tests run on",
    )


def _admin_url() -> str:
    return os.environ.get("TRACESTORE_TEST_PG_URL", DEFAULT_PG)


def _pg_reachable() -> str | None:
    """None when PostgreSQL answers, else why not."""
    try:
        engine = create_engine(_admin_url(), connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:  # any failure means: not usable for this run
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def pytest_configure(config: pytest.Config) -> None:
    global _pg_problem
    if config.getoption("--db") in ("postgresql", "both"):
        _pg_problem = _pg_reachable()
        if _pg_problem and os.environ.get("TRACESTORE_TEST_REQUIRE_PG") == "1":
            raise pytest.UsageError(
                f"PostgreSQL is required (TRACESTORE_TEST_REQUIRE_PG=1) but unreachable at "
                f"{make_url(_admin_url()).render_as_string(hide_password=True)}: {_pg_problem}"
            )


def pytest_report_header(config: pytest.Config) -> list[str]:
    choice = config.getoption("--db")
    if choice == "sqlite":
        return ["databases: SQLite only (--db sqlite): PostgreSQL NOT tested"]
    if _pg_problem:
        return [
            "!" * 70,
            f"databases: PostgreSQL UNREACHABLE ({_pg_problem});",
            "its tests are SKIPPED: this run does NOT cover PostgreSQL",
            "!" * 70,
        ]
    return [f"databases: {choice} (PostgreSQL at {make_url(_admin_url()).host})"]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if config.getoption("--db") != "sqlite" and _pg_problem:
        terminalreporter.write_line(
            f"WARNING: PostgreSQL was unreachable ({_pg_problem}); its tests were skipped.",
            red=True,
            bold=True,
        )


def backends(config: pytest.Config) -> list[str]:
    choice = config.getoption("--db")
    return ["sqlite", "postgresql"] if choice == "both" else [choice]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", backends(metafunc.config), scope="session")


@dataclass
class Database:
    """A database of one backend for this test run."""

    backend: str
    url: str


class _PgDatabases:
    """Creates (and drops at the end) private PostgreSQL databases for this run."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.admin = create_engine(_admin_url(), isolation_level="AUTOCOMMIT")

    def new(self, purpose: str) -> str:
        name = f"tracestore_{purpose}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        self.created.append(name)
        return make_url(_admin_url()).set(database=name).render_as_string(hide_password=False)

    def drop_all(self) -> None:
        with self.admin.connect() as conn:
            for name in self.created:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self.admin.dispose()


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[_PgDatabases | None]:
    if _pg_problem is not None:
        yield None
        return
    pgs = _PgDatabases()
    yield pgs
    pgs.drop_all()


def new_database(
    backend: str, purpose: str, tmp_factory: pytest.TempPathFactory, pgs: _PgDatabases | None
) -> Database:
    """A fresh, empty database of `backend` (skips when PostgreSQL is unreachable)."""
    if backend == "postgresql":
        if pgs is None:
            pytest.skip(f"PostgreSQL unreachable: {_pg_problem}")
        return Database(backend, pgs.new(purpose))
    path = tmp_factory.mktemp(purpose) / "store.db"
    return Database(backend, f"sqlite:///{path}")


@pytest.fixture
def fresh_db(
    backend: str, tmp_path_factory: pytest.TempPathFactory, pg_databases: _PgDatabases | None
) -> Database:
    """A new database of `backend` for one test, migrated to head."""
    db = new_database(backend, "fresh", tmp_path_factory, pg_databases)
    engine = store_engine(db.url)
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    return db


@pytest.fixture(scope="session")
def database(
    backend: str, tmp_path_factory: pytest.TempPathFactory, pg_databases: _PgDatabases | None
) -> Database:
    """The run's shared store database of `backend`, migrated to head once."""
    db = new_database(backend, "store", tmp_path_factory, pg_databases)
    engine = store_engine(db.url)
    migrate.upgrade(engine)
    engine.dispose()
    return db


@pytest.fixture(scope="session")
def session_engine(database: Database) -> Iterator[Engine]:
    engine = store_engine(database.url)
    yield engine
    engine.dispose()


def _nonempty_tables(conn: Connection) -> set[str]:
    """The tables that hold at least one row (one round trip)."""
    probes = " UNION ALL ".join(
        f"SELECT '{t.name}' FROM (SELECT 1 FROM {t.name} LIMIT 1) AS probe_{i}"
        for i, t in enumerate(Base.metadata.sorted_tables)
    )
    return set(conn.execute(text(probes)).scalars())


def wipe(engine: Engine) -> None:
    """Delete every row of every table (between tests).

    One query when the store is already empty, as it is before most tests (the one before
    wiped after itself): TRUNCATE costs ~40 ms on PostgreSQL even then. TRUNCATE, not
    DELETE, when there are rows: a DELETE of the parents runs a foreign-key check per row
    over children's dead rows (trace_events.time_step_pk has no index), which took tens
    of seconds after the backfill tests.

    On SQLite the transaction takes the write lock up front (BEGIN IMMEDIATE): begun
    deferred, its first read fixed a snapshot, and a write committed by anyone else before
    its first DELETE (a live server flushing its legacy-read counts) made that DELETE fail
    at once with "database is locked", no busy wait (SQLite cannot move a reader's
    snapshot forward into a write). That failed one teardown in a full run.
    """
    with write_engine(engine).begin() as conn:
        if not _nonempty_tables(conn):
            return
        tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        else:
            for table in tables:
                conn.execute(text(f"DELETE FROM {table}"))


def row_counts(bind: Engine | Connection) -> dict[str, int]:
    """Rows in every table that holds rollout data.

    `legacy_reads` is left out: live servers flush their read counters every few seconds,
    whichever test is running. Given a connection, counts what its transaction sees.
    """
    with bind.connect() if isinstance(bind, Engine) else nullcontext(bind) as conn:
        return {
            t.name: conn.execute(text(f"SELECT count(*) FROM {t.name}")).scalar_one()
            for t in Base.metadata.sorted_tables
            if t.name != "legacy_reads"
        }


@pytest.fixture
def engine(session_engine: Engine) -> Iterator[Engine]:
    """The store's engine, on an empty store (wiped after the test).

    For tests whose writes must be committed: a live server, another process or thread,
    or DuckDB reads them. Tests of store code that runs on a connection take
    `connection` or `session` instead: rolled back, nothing to wipe.
    """
    wipe(session_engine)
    yield session_engine
    wipe(session_engine)


@pytest.fixture
def connection(session_engine: Engine) -> Iterator[Connection]:
    """A connection to the empty store, in a transaction rolled back after the test.

    SQLAlchemy's "joining a Session into an external transaction" recipe (the `session`
    fixture joins it): nothing the test writes is ever committed, so no other connection
    sees it and there is nothing to wipe.
    """
    wipe(session_engine)  # one query when, as usual, the store is already empty
    with session_engine.connect() as conn:
        outer = conn.begin()
        try:
            yield conn
        finally:
            outer.rollback()


@pytest.fixture
def session(connection: Connection) -> Iterator[Session]:
    """A session on `connection`: its commits and rollbacks are savepoints of the test's
    transaction (join_transaction_mode="create_savepoint"), so store code that commits
    or rolls back behaves as it does on its own, and the test's transaction still ends in
    a rollback."""
    with Session(
        bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
    ) as session:
        yield session


def store_raw(conn: Connection, raw: bytes) -> IngestResult:
    """Ingest one document on `conn`, in the caller's transaction: what `ingest_bytes` does
    inside the transaction it opens (prepare, then store_many)."""
    return store_many(conn, [prepare(raw)])[0]


def previous_revision() -> str:
    """The schema revision before head: where a store not yet upgraded to this code is."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate.alembic_config())
    head = script.get_revision(migrate.head_revision())
    down = head.down_revision if head is not None else None
    assert isinstance(down, str), head
    return down


def hold_back(url: str) -> str:
    """Make the store at `url` one the previous release left: a run stored, the schema one
    revision behind head. Returns that revision."""
    from tracestore.ingest.service import ingest_bytes

    engine = store_engine(url)
    try:
        migrate.upgrade(engine)
        ingest_bytes(engine, json.dumps(minimal_rollout("stored-before")).encode())
        migrate.downgrade(engine, previous_revision())
    finally:
        engine.dispose()
    return previous_revision()


@contextmanager
def write_fault(
    engine: Engine, table: str, run_id: str, *, disconnect: bool = False
) -> Iterator[None]:
    """While open, inserting a row of the run `run_id` into `table` fails inside the write.

    `disconnect` (PostgreSQL only): instead of raising, the server ends the writer's own
    connection, as a database restart or a lost network would.

    A trigger in the database, so it fires for every writer (this process, a live server,
    SQLAlchemy statements and the driver-level bulk writes alike). It finds the run through
    the row's `run_pk`, so it fires only once the run's own row is written in the same
    transaction: the fault is mid-rollout by construction. On PostgreSQL it fires at the
    end of the statement writing `table`, which for a small rollout is its only write
    statement (db/bulk.py `combined_insert`, undone whole by the database itself); a
    rollout with a table past a padded INSERT's rows is written a statement a table, so
    the fault comes after earlier statements wrote (tests/api/test_bad_input.py).
    """
    name = "tracestore_test_fault"
    quoted = run_id.replace("'", "''")
    if disconnect and engine.dialect.name != "postgresql":
        raise ValueError("only a PostgreSQL server can end a connection")
    if engine.dialect.name == "postgresql":
        fail = (
            "PERFORM pg_terminate_backend(pg_backend_pid())"
            if disconnect
            else f"RAISE EXCEPTION 'injected fault on {table}'"
        )
        create = [
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF (SELECT run_id FROM runs WHERE id = NEW.run_pk) = '{quoted}' THEN "
            f"{fail}; END IF; RETURN NEW; END $$",
            # AFTER: at the end of the statement, when the run's row is visible even if
            # one statement wrote both (db/bulk.py `combined_insert`); a BEFORE trigger's
            # query cannot see rows its own statement inserts.
            f"CREATE TRIGGER {name} AFTER INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()",
        ]
        drop = [f"DROP TRIGGER IF EXISTS {name} ON {table}", f"DROP FUNCTION IF EXISTS {name}()"]
    else:
        create = [
            f"CREATE TRIGGER {name} BEFORE INSERT ON {table} "
            f"WHEN (SELECT run_id FROM runs WHERE id = NEW.run_pk) = '{quoted}' "
            f"BEGIN SELECT RAISE(ABORT, 'injected fault on {table}'); END"
        ]
        drop = [f"DROP TRIGGER IF EXISTS {name}"]
    with engine.begin() as conn:
        for statement in create:
            conn.exec_driver_sql(statement)
    try:
        yield
    finally:
        with engine.begin() as conn:
            for statement in drop:
                conn.exec_driver_sql(statement)


def minimal_rollout(run_id: str, reward: float = 1.0, **extra: Any) -> dict[str, Any]:
    """The smallest valid RolloutResponse: one trajectory of one step (`extra` keys added)."""
    doc: dict[str, Any] = {
        "run_id": run_id,
        "trajectories": [
            {
                "env_id": "e",
                "policy_id": "p",
                "steps": [{"obs": {}, "tool_calls": [], "reward": reward, "done": True}],
                "length": 1,
                "inference_url": "",
            }
        ],
        "metrics": {"episode_returns": [reward], "mean_return": reward, "num_steps": 1},
    }
    doc.update(extra)
    return doc


# --- a real HTTP server (uvicorn on a loopback port, in a thread) -------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LiveServer:
    """uvicorn serving create_app(settings) on 127.0.0.1; real sockets, real HTTP."""

    def __init__(self, settings: Settings, **app_options: Any) -> None:
        import uvicorn

        from tracestore.api import create_app

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(settings, **app_options),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def server(database: Database) -> Iterator[LiveServer]:
    """A live server over the run's store database (default settings)."""
    with LiveServer(Settings(database_url=database.url)) as live:
        yield live


@pytest.fixture
def http(server: LiveServer, engine: Engine) -> Iterator[Any]:
    """An httpx client on the live server, over an empty store."""
    import httpx

    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


# --- the examples ---------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One line of examples/rollouts.jsonl: raw bytes, parsed document, label."""

    line: int
    raw: bytes
    doc: dict[str, Any]
    label: dict[str, Any]


def load_examples() -> list[Example]:
    raws = (EXAMPLES / "rollouts.jsonl").read_bytes().splitlines()
    labels = [json.loads(x) for x in (EXAMPLES / "labels.jsonl").read_text().splitlines()]
    assert len(raws) == len(labels) > 0
    return [
        Example(i + 1, raw, json.loads(raw), label)
        for i, (raw, label) in enumerate(zip(raws, labels, strict=True))
    ]


@pytest.fixture(scope="session")
def examples() -> list[Example]:
    return load_examples()

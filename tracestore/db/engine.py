"""Engines for SQLite and PostgreSQL, with every dialect setting in one place."""

from __future__ import annotations

import fcntl
import os
import queue
import select
import sqlite3
import threading
import time
import weakref
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from tracestore.db.types import json_dumps, json_dumps_pg, json_loads

# Execution option read by the SQLite "begin" hook below.
BEGIN_MODE = "tracestore_sqlite_begin"
SQLITE_BUSY_TIMEOUT_S = 30.0
# PostgreSQL waits for a lock without end by default: a post behind a table lock (a
# migration's ALTER, a LOCK TABLE, a stuck transaction) held its client and its group
# forever. A statement waits at most this long for a lock, as long as SQLite's writers
# queue, then fails (503 `database_unavailable`, Retry-After: nothing was committed).
# Set on each new connection only where nothing else set it (the server's configuration,
# ALTER ROLE / DATABASE, PGOPTIONS, `?options=-c lock_timeout=...` in the URL all win):
# a SET, not a startup option, which poolers (PgBouncer, Neon, Supabase) refuse and
# which would replace PGOPTIONS.
PG_LOCK_TIMEOUT_S = SQLITE_BUSY_TIMEOUT_S
_PG_LOCK_TIMEOUT_SQL = (
    "SELECT set_config('lock_timeout', %s, false) FROM pg_settings "
    "WHERE name = 'lock_timeout' AND source = 'default'"
)


def _pg_lock_timeout(dbapi_connection: Any, _record: Any) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute(_PG_LOCK_TIMEOUT_SQL, (f"{int(PG_LOCK_TIMEOUT_S * 1000)}ms",))
    dbapi_connection.commit()


def normalize_url(url: str | URL) -> URL:
    """Parse a database URL; plain `postgresql://` means the psycopg 3 driver we ship."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def backend_name(url: str | URL) -> str:
    """'sqlite' or 'postgresql' (the dialect name of a URL)."""
    return normalize_url(url).get_backend_name()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Take transaction control away from pysqlite: it would otherwise begin lazily and
    # never with IMMEDIATE, and SQLAlchemy's "begin" hook below emits BEGIN itself.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    # WAL: readers never block the writer and the writer never blocks readers.
    cursor.execute("PRAGMA journal_mode=WAL")
    # NORMAL (not OFF) in WAL mode: a commit survives a process crash; only an OS crash
    # can lose the last transactions. We promise acknowledged means durable to processes.
    cursor.execute("PRAGMA synchronous=NORMAL")
    # Enforce the foreign keys the schema declares (off by default in SQLite).
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


class WriterQueue:
    """The writers of one SQLite file, queued across processes on a lock file beside it.

    SQLite makes a writer that finds the write lock taken sleep and try again (1, 2, 5,
    10, ... up to 100 ms between tries: sqliteDefaultBusyCallback). With two server
    workers writing in turn, the commit of one left the other asleep for milliseconds
    after the lock was free, and single posts spent most of their time so (bench/README.md
    item 14). Here a writer first takes an exclusive `flock` on `<file>-writer` (the
    kernel wakes the next waiter the moment it is released; the wait holds no GIL), then
    BEGIN IMMEDIATE finds SQLite's write lock free. The lock is released as soon as the
    transaction commits or rolls back. Writers that do not queue here (another program,
    the sqlite3 shell) still meet SQLite's busy wait; a writer that queued longer than
    WRITER_PATIENCE_S is given only what is left of the busy timeout for that wait, so a
    queue behind a foreign writer ends within about one busy timeout, as before. A writer
    whose queue does not move for the whole busy timeout (its holder stopped) gives up
    with SQLite's own 'database is locked' (`_TakeTurn`).
    """

    def __init__(self, database: str, busy_timeout: float) -> None:
        self.path = f"{database}-writer"
        self.busy_timeout = busy_timeout

    def _fd(self, info: dict[str, Any]) -> int:
        fd: int | None = info.get(_WRITER_FD)
        if fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            info[_WRITER_FD] = fd
        return fd

    def acquire(self, conn: Any) -> None:
        """Queue the SQLAlchemy connection `conn` for the write lock; returns at its turn."""
        info = conn.info
        holder = (self.path, threading.get_ident())
        if holder in _HOLDERS:
            # This thread writes on another connection already (it holds the lock): queueing
            # would wait for itself forever. SQLite's busy wait decides, as it did before.
            return
        fd = self._fd(info)
        started = time.monotonic()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            turn = _TakeTurn(fd)
            try:
                turn.wait(self.busy_timeout)
            finally:
                if not turn.taken:
                    # Given up (timed out, interrupted) or failed: the lock file's
                    # description is the turn's to close now (it may yet take the lock);
                    # this connection opens another next time.
                    del info[_WRITER_FD]
            if not turn.taken:
                raise _queue_timeout(self.busy_timeout) from None
        info[_WRITER_HELD] = holder
        _HOLDERS.add(holder)
        waited = time.monotonic() - started
        if waited > WRITER_PATIENCE_S:
            left = max(0.0, self.busy_timeout - waited)
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(left * 1000)}")
            info[_WRITER_SHORTENED] = True
        elif info.pop(_WRITER_SHORTENED, False):
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")

    @staticmethod
    def release(info: dict[str, Any]) -> None:
        """Let the next writer go (the connection's transaction ended)."""
        holder = info.pop(_WRITER_HELD, None)
        if holder is not None:
            _HOLDERS.discard(holder)
            fcntl.flock(info[_WRITER_FD], fcntl.LOCK_UN)

    @staticmethod
    def close(info: dict[str, Any]) -> None:
        """Forget the connection's lock file (the connection is closed)."""
        fd = info.pop(_WRITER_FD, None)
        holder = info.pop(_WRITER_HELD, None)
        if holder is not None:
            _HOLDERS.discard(holder)
            # Not left to the close: a forked child's copy of the description would keep
            # the lock held until it exits.
            fcntl.flock(fd, fcntl.LOCK_UN)
        if fd is not None:
            os.close(fd)

    def install(self, engine: Engine) -> None:
        """Queue `engine`'s BEGIN IMMEDIATE transactions here, released once they end."""
        dialect = engine.dialect
        # SQLAlchemy's "commit" and "rollback" events run *before* the COMMIT: the lock
        # must outlive it, so the dialect's own calls are wrapped (they receive the pooled
        # connection, whose `info` holds the lock's state).
        commit, rollback = dialect.do_commit, dialect.do_rollback

        def do_commit(dbapi_connection: Any) -> None:
            try:
                commit(dbapi_connection)
            finally:
                self.release(_info(dbapi_connection))

        def do_rollback(dbapi_connection: Any) -> None:
            try:
                rollback(dbapi_connection)
            finally:
                self.release(_info(dbapi_connection))

        setattr(dialect, "do_commit", do_commit)  # noqa: B010  (an instance's own)
        setattr(dialect, "do_rollback", do_rollback)  # noqa: B010
        setattr(dialect, _WRITER_QUEUE, self)
        event.listen(engine.pool, "close", _writer_connection_closed)
        event.listen(engine.pool, "invalidate", _writer_connection_closed)


class _TakeTurn:
    """One writer's wait for the queue, with a deadline.

    flock has no timeout, and a thread blocked in it cannot be woken: a holder stopped
    (SIGSTOP, a debugger) would keep every writer waiting past the busy timeout, where
    SQLite's own busy wait gives up ('database is locked', a 503). So a contended wait
    blocks in a waiter thread while the writer waits on an event with the deadline. The
    hand-off costs two thread wake-ups per contended transaction (a group of posts, a
    batch), not per rollout.

    Who closes the lock file's description when the turn is not taken: the writer, if it
    gave up before a waiter thread started on the turn (so descriptions do not pile up
    behind a holder that stays stopped); else the waiter thread, once its flock returns.
    """

    __slots__ = ("abandoned", "error", "fd", "mutex", "started", "taken", "turn")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.mutex = threading.Lock()
        self.started = self.taken = self.abandoned = False
        self.error: OSError | None = None
        self.turn = threading.Event()

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the lock on `fd`; `taken` says whether it came.

        Raises what flock raised, if it failed.
        """
        _WAITERS.submit(self)
        close = False
        try:
            self.turn.wait(timeout)
        finally:
            with self.mutex:
                if not self.taken:  # ran out or interrupted (or failed): give it up
                    self.abandoned = True
                    close = not self.started
            if close:
                os.close(self.fd)
        if self.error is not None:
            raise self.error

    def take(self) -> None:
        """Block until the lock is taken, then hand it over (or drop it: given up)."""
        with self.mutex:
            if self.abandoned:  # given up before a waiter thread was free: closed
                return
            self.started = True
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)  # blocks in the kernel, GIL released
        except OSError as exc:
            self.error = exc
            os.close(self.fd)
            self.turn.set()
            return
        with self.mutex:
            self.taken = not self.abandoned
        if self.taken:
            self.turn.set()
            return
        fcntl.flock(self.fd, fcntl.LOCK_UN)  # the writer gave up: let the next one go
        os.close(self.fd)


class _Waiters:
    """Daemon threads that block in flock for this process's writers, started as needed.

    Daemon threads: one blocked behind a stopped holder must not keep the process from
    exiting. Past LOCK_WAITER_THREADS, waits queue for a thread (and still give up at
    their deadline).
    """

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_TakeTurn] = queue.SimpleQueue()
        self.mutex = threading.Lock()
        self.threads = self.idle = self.queued = 0

    def submit(self, turn: _TakeTurn) -> None:
        """Have a waiter thread take `turn`."""
        with self.mutex:
            self.queued += 1
            if self.queued > self.idle and self.threads < LOCK_WAITER_THREADS:
                self.threads += 1
                threading.Thread(target=self._run, name="tracestore-queue", daemon=True).start()
        self.jobs.put(turn)

    def _run(self) -> None:
        try:
            while True:
                with self.mutex:
                    self.idle += 1
                turn = self.jobs.get()
                with self.mutex:
                    self.idle -= 1
                    self.queued -= 1
                turn.take()
        finally:  # only for an error take() does not expect: the count stays true
            with self.mutex:
                self.threads -= 1


LOCK_WAITER_THREADS = 16
_WAITERS = _Waiters()


def _fresh_waiters() -> None:
    # A forked child has none of its parent's threads.
    global _WAITERS
    _WAITERS = _Waiters()


os.register_at_fork(after_in_child=_fresh_waiters)


def _queue_timeout(timeout: float) -> OperationalError:
    # What SQLite's busy wait raises when it runs out, so every caller (the API's 503
    # database_unavailable, the CLI's message) treats a queue that did not move alike.
    orig = sqlite3.OperationalError(
        f"database is locked: another writer held the write queue for over {timeout:g} s"
    )
    return OperationalError("BEGIN IMMEDIATE", None, orig)


# (lock file, thread) of the writers of this process holding a queue's lock: a thread
# holds one at a time (set operations are atomic under the GIL).
_HOLDERS: set[tuple[str, int]] = set()
_WRITER_QUEUE = "tracestore_writer_queue"
_WRITER_FD = "tracestore_writer_fd"
_WRITER_HELD = "tracestore_writer_held"
_WRITER_SHORTENED = "tracestore_writer_shortened"
# Queued longer than this: SQLite's busy wait gets only what is left of its timeout.
WRITER_PATIENCE_S = 1.0


def _info(connection: Any) -> dict[str, Any]:
    # The pooled connection's `info`; the ad-hoc wrapper SQLAlchemy uses while it first
    # connects has none (and never holds the lock).
    try:
        info: dict[str, Any] = connection.info
    except (AttributeError, NotImplementedError):
        return {}
    return info


def _writer_connection_closed(_dbapi_connection: Any, record: Any, *_args: Any) -> None:
    WriterQueue.close(record.info)


def _sqlite_begin(conn: Any) -> None:
    # Writers start with BEGIN IMMEDIATE: they take the write lock up front, so two
    # writers never deadlock upgrading a read lock (which busy_timeout cannot resolve).
    mode = conn.get_execution_options().get(BEGIN_MODE, "DEFERRED")
    queue: WriterQueue | None = getattr(conn.engine.dialect, _WRITER_QUEUE, None)
    if mode == "IMMEDIATE" and queue is not None:
        queue.acquire(conn)
    conn.exec_driver_sql(f"BEGIN {mode}")


def _is_memory(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def _is_file(url: URL) -> bool:
    # A plain path (not memory, not a `file:` URI, which may name a shared memory store).
    return not _is_memory(url) and not str(url.database).startswith("file:")


def create_engine(
    url: str | URL,
    *,
    connections: int | None = None,
    wait: float | None = None,
    **kwargs: Any,
) -> Engine:
    """Create the store's engine for a SQLite or PostgreSQL URL.

    `connections` fixes the pool's size (no overflow) and `wait` how long a checkout waits
    for a free connection before raising sqlalchemy.exc.TimeoutError (the API answers 503).
    """
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    if connections is not None and not _is_memory(parsed):
        # A server hands connections out on its event loop (api/overload.py), so the pool
        # never needs to grow past what it was given; the wait is a backstop.
        kwargs.setdefault("pool_size", connections)
        kwargs.setdefault("max_overflow", 0)
    if wait is not None and not _is_memory(parsed):
        kwargs.setdefault("pool_timeout", wait)
    if backend == "sqlite":
        connect_args: dict[str, Any] = {"check_same_thread": False}
        if "timeout" not in parsed.query:
            # Writers queue for the lock up to this many seconds (SQLite's busy timeout)
            # instead of failing with 'database is locked'; `?timeout=` in the URL sets it.
            connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_S
        engine = sa_create_engine(
            parsed,
            json_serializer=json_dumps,
            json_deserializer=json_loads,
            connect_args=connect_args,
            **kwargs,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        if _is_file(parsed):
            timeout = float(parsed.query.get("timeout", SQLITE_BUSY_TIMEOUT_S))  # type: ignore[arg-type]
            WriterQueue(str(parsed.database), timeout).install(engine)
        return engine
    if backend == "postgresql":
        kwargs.setdefault("pool_pre_ping", True)
        engine = sa_create_engine(
            parsed,
            json_serializer=json_dumps_pg,
            json_deserializer=json_loads,
            **kwargs,
        )
        event.listen(engine, "connect", _pg_lock_timeout)
        if kwargs["pool_pre_ping"] and kwargs.get("poolclass") is not NullPool:
            QuietPing(engine).install()
        return engine
    raise ValueError(
        f"unsupported database {backend!r}: use sqlite:///PATH or postgresql+psycopg://..."
    )


class QuietPing:
    """The pool's liveness ping, skipped for a PostgreSQL connection that was given back
    less than `fresh_for` seconds ago and whose socket has nothing to read.

    The ping is a round trip before every checkout, as long as a look-up's own statement
    (bench/README.md item 7). A connection the server ended (a restart, a terminated
    backend, an idle timeout) has its error message or its end of stream waiting on the
    socket, so it is pinged as before and replaced; so is one idle for longer, which a
    silent network could have cut. A connection that dies in the instant between the
    check and its first statement fails that statement, as it would after a ping.
    """

    def __init__(self, engine: Engine, fresh_for: float = 1.0) -> None:
        self.engine = engine
        self.fresh_for = fresh_for
        self.skipped = 0  # pings spared
        self._ping = engine.dialect.do_ping
        self._given_back: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    def install(self) -> None:
        """Wrap the engine's dialect (its own: each engine makes one) and watch its pool."""
        event.listen(self.engine.pool, "checkin", self._checkin)
        self.engine.dialect.do_ping = self.ping  # type: ignore[method-assign]

    def _checkin(self, dbapi_connection: Any, _record: Any) -> None:
        if dbapi_connection is not None:  # None: the connection was invalidated
            self._given_back[dbapi_connection] = time.monotonic()

    def ping(self, dbapi_connection: Any) -> bool:
        """The dialect's ping, unless the connection is fresh and quiet (then True)."""
        given_back = self._given_back.get(dbapi_connection)
        if (
            given_back is not None
            and time.monotonic() - given_back < self.fresh_for
            and _quiet(dbapi_connection)
        ):
            self.skipped += 1
            return True
        return bool(self._ping(dbapi_connection))


def _quiet(dbapi_connection: Any) -> bool:
    """Whether a psycopg connection is open, outside a transaction, and has nothing from
    the server waiting on its socket (a server's goodbye is an error message, then EOF)."""
    try:
        if dbapi_connection.closed or dbapi_connection.info.transaction_status.name != "IDLE":
            return False
        readable, _, _ = select.select([dbapi_connection.fileno()], [], [], 0)
    except Exception:  # anything unexpected: ping it
        return False
    return not readable


def write_engine(engine: Engine) -> Engine:
    """The same engine, beginning SQLite transactions with BEGIN IMMEDIATE."""
    if engine.dialect.name == "sqlite":
        return engine.execution_options(**{BEGIN_MODE: "IMMEDIATE"})
    return engine


def create_migration_engine(url: str | URL) -> Engine:
    """An engine for Alembic: no pooling, and SQLite foreign keys left off.

    A batch-mode table rewrite on SQLite drops and recreates a table; with foreign keys on
    that would cascade-delete its children.
    """
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        return sa_create_engine(parsed, poolclass=NullPool)
    return create_engine(parsed, poolclass=NullPool)

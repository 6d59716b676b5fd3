"""SQLite writers queue on `<file>-writer` (db/engine.py WriterQueue), released at the end
of their transaction, never waiting for themselves."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from tracestore.db import engine as engine_module
from tracestore.db.engine import create_engine, write_engine
from tracestore.db.uow import write_session


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[Engine, Path]]:
    db = tmp_path / "store.db"
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    yield engine, Path(f"{db}-writer")
    engine.dispose()


@contextmanager
def lock_file(path: Path) -> Iterator[int]:
    """An open file description of the queue's lock file of our own (as another process)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        yield fd
    finally:
        os.close(fd)


def is_free(path: Path) -> bool:
    with lock_file(path) as fd:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True


def test_a_write_transaction_holds_the_queue_until_it_commits(
    store: tuple[Engine, Path],
) -> None:
    engine, lock = store
    with write_session(engine) as session:
        session.execute(text("INSERT INTO t VALUES (1)"))
        assert not is_free(lock)
    assert is_free(lock)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM t")).scalar() == 1


def test_a_rolled_back_write_releases_the_queue(store: tuple[Engine, Path]) -> None:
    engine, lock = store

    def write_then_fail() -> None:
        with write_session(engine) as session:
            session.execute(text("INSERT INTO t VALUES (1)"))
            raise RuntimeError("undo")

    with pytest.raises(RuntimeError):
        write_then_fail()
    assert is_free(lock)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM t")).scalar() == 0


def test_reads_do_not_queue(store: tuple[Engine, Path]) -> None:
    engine, lock = store
    with lock_file(lock) as fd:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the queue taken by "another process"
        with engine.connect() as conn:  # a deferred (read) transaction passes
            assert conn.execute(text("SELECT count(*) FROM t")).scalar() == 0


def test_a_writer_waits_for_its_turn_in_the_queue(store: tuple[Engine, Path]) -> None:
    """SQLite's own lock is free here: only the queue can hold the writer back."""
    engine, lock = store
    done = threading.Event()

    def write() -> None:
        with write_session(engine) as session:
            session.execute(text("INSERT INTO t VALUES (2)"))
        done.set()

    with lock_file(lock) as fd:
        fcntl.flock(fd, fcntl.LOCK_EX)
        writer = threading.Thread(target=write)
        writer.start()
        assert not done.wait(0.5), "the writer did not wait for the queue"
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert done.wait(10), "the writer did not go on once the queue was free"
    writer.join()
    assert is_free(lock)


def test_a_thread_writing_on_two_connections_does_not_wait_for_itself(tmp_path: Path) -> None:
    # A short busy timeout: the second write meets SQLite's lock and fails fast, as it
    # did before the queue, instead of queueing behind its own thread forever.
    db = tmp_path / "store.db"
    first, second = (create_engine(f"sqlite:///{db}?timeout=0.2") for _ in range(2))
    outcome: list[BaseException | None] = []

    def nested() -> None:
        try:
            with write_session(first) as session:
                session.execute(text("CREATE TABLE t (x INTEGER)"))
                with write_session(second) as inner:
                    inner.execute(text("SELECT 1"))
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=nested, daemon=True)
    thread.start()
    thread.join(20)
    try:
        assert not thread.is_alive(), "a thread waited for its own write lock"
        assert isinstance(outcome[0], OperationalError), outcome
        assert "locked" in str(outcome[0])
        assert is_free(Path(f"{db}-writer"))
    finally:
        first.dispose()
        second.dispose()


def test_an_invalidated_connection_releases_the_queue(store: tuple[Engine, Path]) -> None:
    engine, lock = store
    with write_engine(engine).connect() as conn:
        conn.begin()
        conn.execute(text("INSERT INTO t VALUES (3)"))
        assert not is_free(lock)
        conn.invalidate()
        assert is_free(lock)


def _write_in_thread(engine: Engine, value: int) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def write() -> None:
        try:
            with write_session(engine) as session:
                session.execute(text(f"INSERT INTO t VALUES ({value})"))
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append("written")

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread, outcome


def _freed_within(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if is_free(path):
            return True
        time.sleep(0.01)
    return False


def test_a_writer_gives_up_on_a_queue_held_past_its_busy_timeout(tmp_path: Path) -> None:
    """A holder that never lets go (a stopped process): 'database is locked' after the
    busy timeout, as SQLite's own busy wait says, not a wait without end; once the holder
    lets go the queue is free again and the same engine writes."""
    db = tmp_path / "store.db"
    engine = create_engine(f"sqlite:///{db}?timeout=0.5")
    lock = Path(f"{db}-writer")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
        with lock_file(lock) as fd:
            fcntl.flock(fd, fcntl.LOCK_EX)
            started = time.monotonic()
            writer, outcome = _write_in_thread(engine, 1)
            writer.join(15)
            waited = time.monotonic() - started
            assert not writer.is_alive(), "the writer waited past its busy timeout"
            assert isinstance(outcome[0], OperationalError), outcome
            assert "database is locked" in str(outcome[0])
            assert 0.5 <= waited < 5, waited
        # The given-up wait's thread takes the lock as the holder lets go and drops it.
        assert _freed_within(lock, 5), "a given-up wait kept the queue"
        writer, outcome = _write_in_thread(engine, 2)
        writer.join(15)
        assert outcome == ["written"]
        with engine.connect() as conn:
            assert conn.execute(text("SELECT x FROM t")).scalars().all() == [2]
        assert is_free(lock)
    finally:
        engine.dispose()


def test_waits_given_up_before_a_waiter_thread_was_free_leave_the_queue_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One waiter thread, three writers behind a held queue: all three give up on time,
    the two that never reached the thread close their lock file at once (descriptions do
    not pile up behind a holder that stays stopped), and none holds the queue afterwards."""
    monkeypatch.setattr(engine_module, "LOCK_WAITER_THREADS", 1)
    waiters = engine_module._Waiters()
    monkeypatch.setattr(engine_module, "_WAITERS", waiters)
    db = tmp_path / "store.db"
    engines = [create_engine(f"sqlite:///{db}?timeout=0.3") for _ in range(3)]
    lock = Path(f"{db}-writer")
    try:
        with engines[0].begin() as conn:
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
        with lock_file(lock) as fd:
            fcntl.flock(fd, fcntl.LOCK_EX)
            before = _lock_files_open(lock)
            writers = [_write_in_thread(engine, n) for n, engine in enumerate(engines)]
            for thread, _ in writers:
                thread.join(15)
            assert [thread.is_alive() for thread, _ in writers] == [False] * 3
            for _, outcome in writers:
                assert isinstance(outcome[0], OperationalError), outcome
            assert waiters.threads == 1
            # Each engine opened one description; only the turn on the waiter thread,
            # blocked in flock, still has its own (plus ours).
            assert _lock_files_open(lock) == before + 1
        assert _freed_within(lock, 5), "a given-up wait kept the queue"
        # The waiter thread closes its description just after it lets the lock go.
        deadline = time.monotonic() + 5
        while _lock_files_open(lock) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _lock_files_open(lock) == 0
        # ...and then counts itself idle again: read until it has (it may be descheduled
        # in between).
        deadline = time.monotonic() + 5
        while _counts(waiters) != (0, 1, 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _counts(waiters) == (0, 1, 1)
        writer, outcome = _write_in_thread(engines[2], 7)
        writer.join(15)
        assert outcome == ["written"]
    finally:
        for engine in engines:
            engine.dispose()


def _counts(waiters: engine_module._Waiters) -> tuple[int, int, int]:
    """The waiter threads' (queued, idle, threads), read under their mutex."""
    with waiters.mutex:
        return waiters.queued, waiters.idle, waiters.threads


def _lock_files_open(lock: Path) -> int:
    """How many of this process's file descriptors are open on the queue's lock file."""
    count = 0
    for entry in Path("/proc/self/fd").iterdir():
        try:
            if os.readlink(entry) == str(lock):
                count += 1
        except OSError:  # closed meanwhile
            continue
    return count

"""SQLite writers queue on `<file>-writer` (db/engine.py WriterQueue), released at the end
of their transaction, never waiting for themselves."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

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

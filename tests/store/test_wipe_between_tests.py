"""The suite's wipe between tests survives a live server writing meanwhile.

On SQLite, a transaction begun deferred fixes its snapshot at its first read; when another
connection commits before its first write, that write fails at once with "database is
locked" (no busy wait). The wipe reads (which tables hold rows) then deletes, and live
servers flush their legacy-read counts every few seconds: one teardown failed so in a full
run. The wipe takes the write lock up front; the other writer waits its turn.
"""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import event, func, insert, select

from tests.conftest import wipe
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.db.uow import write_connection
from tracestore.models.drift import LegacyRead

ROW = {
    "client": "anonymous",
    "day": date(2026, 12, 4),
    "route": "rollout",
    "reads": 1,
    "last_seen": datetime(2026, 12, 4, tzinfo=UTC),
}


def test_a_write_committed_while_the_wipe_reads_neither_fails_it_nor_is_lost(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine, server = create_engine(url), create_engine(url)  # the test's, a live server's
    try:
        migrate.upgrade(engine)
        with write_connection(engine) as conn:
            conn.execute(insert(LegacyRead), [ROW])  # a row, so the wipe deletes
        committed = threading.Event()
        errors: list[BaseException] = []

        def flush_counts() -> None:
            try:
                with write_connection(server) as conn:
                    conn.execute(insert(LegacyRead), [{**ROW, "client": "key:0123abcd"}])
                committed.set()
            except BaseException as exc:  # reported below, on the test's thread
                errors.append(exc)

        flusher = threading.Thread(target=flush_counts)

        def after_read(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            # Between the wipe's read of which tables hold rows and its first DELETE: the
            # other writer gets every chance to commit (it cannot while the wipe holds the
            # write lock, and waits for it).
            if "UNION ALL" in statement and not flusher.is_alive():
                flusher.start()
                committed.wait(timeout=1.0)

        event.listen(engine, "after_cursor_execute", after_read)
        wipe(engine)  # raised "database is locked" when begun deferred
        flusher.join(timeout=30)
        assert not flusher.is_alive()
        assert not errors, errors
        with engine.connect() as conn:
            clients = conn.execute(select(LegacyRead.client)).scalars().all()
            assert clients == ["key:0123abcd"]  # wiped first, then the other write landed
            assert conn.execute(select(func.count()).select_from(LegacyRead)).scalar_one() == 1
    finally:
        engine.dispose()
        server.dispose()

"""The client tells what it does through `logging` (logger `tracestore.client`).

Against real `tracestore serve` subprocesses: each retry (attempt, reason, wait), the
giving up, each spool write, each replay and each rollout refused at replay is a record.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import free_port, minimal_rollout
from tests.reliability.harness import ServerProcess
from tracestore.client import AsyncTracestoreClient, TracestoreClient

LOGGER = "tracestore.client"


@pytest.fixture
def down_then_up(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server on a fixed port that is not started yet (the test starts it)."""
    server = ServerProcess(
        f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "server.log", port=free_port()
    )
    yield server
    server.stop()


def _records(caplog: pytest.LogCaptureFixture, contains: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and contains in r.getMessage()]


def _post_all(mode: str, url: str, spool: Path, docs: list[dict[str, Any]]) -> list[str]:
    """Post `docs` one by one with a quick-to-give-up client; their statuses."""
    quick: dict[str, Any] = {"spool": spool, "max_retries": 2, "backoff": 0.02}
    if mode == "sync":
        with TracestoreClient(url, **quick) as client:
            return [client.post_rollout(d)["status"] for d in docs]

    async def run() -> list[str]:
        async with AsyncTracestoreClient(url, **quick) as client:
            return [(await client.post_rollout(d))["status"] for d in docs]

    return asyncio.run(run())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_retries_spooling_and_replay_are_logged_while_the_server_is_down_then_up(
    mode: str, down_then_up: ServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = down_then_up
    spool = tmp_path / "producer.spool"
    caplog.set_level(logging.INFO, logger=LOGGER)
    invalid = {"run_id": "log-invalid"}  # spooled now, refused for good at the replay
    statuses = _post_all(mode, server.url, spool, [minimal_rollout("log-down"), invalid])
    assert statuses == ["spooled", "spooled"]

    retries = _records(caplog, "retrying in")
    assert [r.levelno for r in retries] == [logging.WARNING] * 4  # two per post
    assert [getattr(r, "attempt", None) for r in retries] == [1, 2, 1, 2]
    for record in retries:
        assert "POST /v1/rollouts" in record.getMessage()
        assert getattr(record, "reason", "").startswith("ConnectError")
        assert 0 <= getattr(record, "wait_s", -1) <= 0.04 * 2
    gave_up = _records(caplog, "giving up after 3 attempts")
    assert len(gave_up) == 2
    assert all(getattr(r, "wait_s", 0) is None for r in gave_up)
    spooled = _records(caplog, "spooled to")
    assert [r.levelno for r in spooled] == [logging.WARNING] * 2
    assert "rollout 'log-down'" in spooled[0].getMessage()
    assert str(spool) in spooled[0].getMessage()
    assert getattr(spooled[1], "spool", None) == str(spool)

    caplog.clear()
    server.start()
    assert _post_all(mode, server.url, spool, [minimal_rollout("log-up")]) == ["created"]
    assert _records(caplog, "retrying in") == []
    (replaying,) = _records(caplog, "replaying 2 rollouts")
    assert replaying.levelno == logging.INFO
    (refused,) = _records(caplog, "refused a spooled rollout for good")
    assert refused.levelno == logging.WARNING
    assert "log-invalid" in refused.getMessage()
    assert "invalid_rollout" in refused.getMessage()
    (summary,) = _records(caplog, "replay delivered 1, rejected 1")
    assert summary.levelno == logging.INFO
    assert "spool empty" in summary.getMessage()
    stored = httpx.get(server.url + "/v1/rollouts/log-down", timeout=30)
    assert orjson.loads(stored.content) == minimal_rollout("log-down")


def test_a_503_with_retry_after_is_logged_and_waited_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "busy.db"
    # The server waits 0.2 s for SQLite's write lock, then answers 503 + Retry-After.
    with ServerProcess(f"sqlite:///{db}?timeout=0.2", tmp_path / "server.log") as server:
        holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock...
        refused = threading.Event()

        def on_response(response: httpx.Response) -> None:
            if response.status_code == 503:
                refused.set()

        def release() -> None:
            # ...until the client was refused, and a while more (it waits out Retry-After
            # meanwhile). A timer from the start raced the client's first attempt.
            refused.wait(60)
            time.sleep(0.5)
            holder.execute("ROLLBACK")

        releaser = threading.Thread(target=release)
        releaser.start()
        caplog.set_level(logging.INFO, logger=LOGGER)
        start = time.monotonic()
        try:
            with TracestoreClient(
                server.url,
                max_retries=10,
                backoff=0.01,
                event_hooks={"response": [on_response]},
            ) as client:
                assert client.post_rollout(minimal_rollout("log-busy"))["status"] == "created"
        finally:
            refused.set()  # never refused (it failed): the releaser need not wait
            releaser.join()
            holder.close()
    took = time.monotonic() - start
    retries = _records(caplog, "retrying in")
    assert retries, "the lock was held: the first attempt must have been refused"
    first = retries[0]
    assert getattr(first, "reason", None) == "503 database_unavailable, Retry-After 1 s"
    wait_s = getattr(first, "wait_s", 0)
    assert wait_s >= 1.0  # never sooner than Retry-After
    assert took >= wait_s

"""The analytics children (reports/live.py: DuckDB in a process of its own) end with the
worker that started them.

Before: `kill <server pid>` (what an operator or a process manager signalling only the
main process does) stopped the server and its workers gracefully, and left every
analytics child running, reparented to init, each holding its DuckDB's memory (four
children, ~930 MiB, after a few reports on a store of a million steps); a worker killed
outright left its children the same way.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Database
from tests.reliability.harness import ServerProcess, child_pids
from tracestore.api.server import ORPHAN_GRACE_S


def _is_worker(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"resource_tracker" not in command  # multiprocessing's helper, not a worker


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids of `pids` still alive after waiting up to `seconds` for them to end."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(map(_alive, pids)):
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


@pytest.fixture
def server(fresh_db: Database, tmp_path: Path) -> Iterator[ServerProcess]:
    """`tracestore serve --workers 2`, its temporary files (DuckDB's spills) in `tmp/`."""
    (tmp_path / "tmp").mkdir()
    env = {"TMPDIR": str(tmp_path / "tmp")}
    with ServerProcess(fresh_db.url, tmp_path / "server.log", workers=2, env=env) as s:
        yield s


def _spill_roots(server: ServerProcess) -> list[Path]:
    """The analytics pools' spill directories (one per worker that started its children)."""
    return sorted((server.log_path.parent / "tmp").glob("tracestore-duckdb-*"))


def _analytics_children(server: ServerProcess) -> dict[int, list[int]]:
    """worker pid -> its analytics children, once reports have started some."""
    found: dict[int, list[int]] = {}
    for _ in range(40):  # new connections: the workers share them (SO_REUSEPORT)
        assert httpx.get(f"{server.url}/v1/reports/drift", timeout=60).status_code == 200
        workers = [pid for pid in child_pids(server.pid) if _is_worker(pid)]
        found = {w: kids for w in workers if (kids := child_pids(w))}
        if len(found) == len(workers) == 2:
            break
    assert found, "no worker started an analytics child"
    return found


def test_stopping_the_server_stops_its_analytics_children(server: ServerProcess) -> None:
    children = [kid for kids in _analytics_children(server).values() for kid in kids]
    os.kill(server.pid, signal.SIGTERM)  # the server alone, not its process group
    assert server.proc is not None
    server.proc.wait(timeout=60)
    assert _gone_within(children, 10) == []
    assert _spill_roots(server) == []


def test_a_killed_worker_s_analytics_children_end(server: ServerProcess) -> None:
    started = _analytics_children(server)
    roots = _spill_roots(server)
    assert len(roots) == len(started)
    worker, children = next(iter(started.items()))
    os.kill(worker, signal.SIGKILL)
    assert _gone_within(children, 10) == []
    # Its pool's spill directory went with them (removed by the last child to notice).
    assert len(_spill_roots(server)) == len(roots) - 1


def test_a_killed_supervisor_s_workers_stop_with_their_children(server: ServerProcess) -> None:
    # uvicorn's workers outlived a supervisor killed outright: they went on answering on
    # the port (a server started again could not bind it while they lived) and kept their
    # analytics children. Now each worker stops gracefully once it finds its supervisor
    # gone, and its children with it.
    started = _analytics_children(server)
    workers = list(started)
    children = [kid for kids in started.values() for kid in kids]
    os.kill(server.pid, signal.SIGKILL)  # the supervisor alone
    assert server.proc is not None
    server.proc.wait(timeout=10)
    assert _gone_within(workers, 30) == []
    assert _gone_within(children, 10) == []
    with pytest.raises(httpx.TransportError):  # nobody listens on the port any more
        httpx.get(server.url + "/health", timeout=2)
    assert _spill_roots(server) == []  # removed by the workers' own shutdown


def _trickle(url: str, stop: threading.Event) -> socket.socket:
    """A POST whose body never ends: one byte a second of a declared megabyte, sent from a
    thread until `stop` is set or the server closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    head = (
        "POST /v1/rollouts HTTP/1.1\r\nHost: tracestore\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000000\r\n\r\n{"
    )
    sock.sendall(head.encode())

    def send() -> None:
        while not stop.wait(1.0):
            try:
                sock.sendall(b" ")
            except OSError:
                return

    threading.Thread(target=send, name="trickle", daemon=True).start()
    return sock


@pytest.mark.slow
def test_an_orphaned_worker_s_request_that_never_ends_is_cut_short(tmp_path: Path) -> None:
    # A worker whose supervisor was killed stops as on SIGTERM: uvicorn waits for the
    # requests in flight. One that never ends (a body trickling in, allowed here by a
    # zero minimum rate) kept the orphan, its port and its memory for good; the worker
    # now gives its shutdown ORPHAN_GRACE_S and then exits. Not database-specific: SQLite.
    env = {"TRACESTORE_BODY_MIN_RATE": "0"}
    url = f"sqlite:///{tmp_path / 'store.db'}"
    stop = threading.Event()
    with ServerProcess(url, tmp_path / "server.log", workers=2, env=env) as server:
        workers = [pid for pid in child_pids(server.pid) if _is_worker(pid)]
        assert len(workers) == 2
        sock = _trickle(server.url, stop)
        try:
            time.sleep(1.0)  # the request is in a worker, reading its body
            os.kill(server.pid, signal.SIGKILL)  # the supervisor alone
            assert server.proc is not None
            server.proc.wait(timeout=10)
            killed = time.monotonic()
            # The idle worker stops within seconds; the one reading the trickle waits for it.
            while len([pid for pid in workers if _alive(pid)]) > 1:
                assert time.monotonic() - killed < 20, "the idle worker did not stop"
                time.sleep(0.1)
            left = _gone_within(workers, ORPHAN_GRACE_S + 15 - (time.monotonic() - killed))
            assert left == [], f"still running {time.monotonic() - killed:.0f} s after"
            assert time.monotonic() - killed >= ORPHAN_GRACE_S - 1  # cut short, not served
        finally:
            stop.set()
            sock.close()

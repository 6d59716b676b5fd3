"""`tracestore serve --workers N`: each worker listens on a socket of its own (SO_REUSEPORT),
so clients that connect together are spread over the workers; the address stays taken
while the server runs (api/server.py).

Before: the workers shared one socket and the first to wake accepted every waiting
connection: 32 clients connecting at once went 31 to one worker, 1 to the other, and
kept-alive connections stayed there."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from bench.common import tcp_sockets
from tests.conftest import minimal_rollout
from tests.reliability.harness import LOOPBACK, TRACESTORE, ServerProcess, child_pids
from tracestore.api.server import (
    HIDDEN_METRICS_DIR_AGE_S,
    METRICS_DIR_PREFIX,
    make_metrics_dir,
    remove_stale_metrics_dirs,
)

CLIENTS = 32


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Two workers on SQLite (the sockets are the same whatever the database)."""
    tmp = tmp_path_factory.mktemp("workers")
    with ServerProcess(f"sqlite:///{tmp / 'store.db'}", tmp / "server.log", workers=2) as s:
        yield s


def test_each_worker_listens_on_a_socket_of_its_own(server: ServerProcess) -> None:
    # /health answers once one worker is up: the other may still be starting.
    deadline = time.monotonic() + 60
    while len(tcp_sockets(server.port, "0A")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(tcp_sockets(server.port, "0A")) == 2


def _connections_by_worker(server: ServerProcess) -> Counter[int]:
    inodes = tcp_sockets(server.port, "01")
    counts: Counter[int] = Counter()
    for pid in child_pids(server.pid):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = fd.readlink().name
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                counts[pid] += 1
    return counts


def test_clients_connecting_together_are_spread_over_the_workers(server: ServerProcess) -> None:
    test_each_worker_listens_on_a_socket_of_its_own(server)  # both workers are up
    sockets = [socket.create_connection((LOOPBACK, server.port)) for _ in range(CLIENTS)]
    try:
        # Every connection answered (so accepted by a worker) before they are counted.
        for i, sock in enumerate(sockets):
            raw = orjson.dumps(minimal_rollout(f"spread-{i}"))
            sock.sendall(
                b"POST /v1/rollouts HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw)
            )
        for sock in sockets:
            sock.settimeout(30)
            assert sock.recv(65536).startswith(b"HTTP/1.1 201 ")
        counts = _connections_by_worker(server)
    finally:
        for sock in sockets:
            sock.close()
    assert sum(counts.values()) == CLIENTS, counts
    assert len(counts) == 2, counts
    # Spread by a hash of their addresses: fewer than 4 of 32 on one worker happens once
    # in ~100,000 runs (binomial); sharing one socket it was 1 (or 0) every time.
    assert min(counts.values()) >= 4, counts


def test_a_second_server_on_the_same_address_is_refused(
    server: ServerProcess, tmp_path: Path
) -> None:
    for workers in ("1", "2"):
        result = subprocess.run(
            [
                TRACESTORE,
                "serve",
                "--db",
                f"sqlite:///{tmp_path / 'other.db'}",
                "--host",
                LOOPBACK,
                "--port",
                str(server.port),
                "--workers",
                workers,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode != 0, (workers, result.stdout, result.stderr)
        assert "address already in use" in result.stderr.lower(), (workers, result.stderr)
    # The running server still answers, alone on its address.
    response = httpx.get(f"{server.url}/health", timeout=30)
    assert response.status_code == 200


def _created(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith('tracestore_ingest_rollouts_total{status="created"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_sum_every_worker(tmp_path: Path) -> None:
    # A scrape is answered by one worker: it served its own counters only, so successive
    # scrapes read 14, 5, 14 (a reset to Prometheus each time) and no scrape the total.
    with ServerProcess(f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "log", workers=2) as s:
        test_each_worker_listens_on_a_socket_of_its_own(s)
        environ = Path(f"/proc/{child_pids(s.pid)[0]}/environ").read_bytes().split(b"\0")
        folder = next(
            (
                Path(v.split(b"=", 1)[1].decode())
                for v in environ
                if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")
            ),
            None,
        )
        # New connections, together: spread over both workers.
        with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0)) as client:
            for i in range(30):
                posted = client.post(s.url + "/v1/rollouts", json=minimal_rollout(f"m-{i}"))
                assert posted.status_code == 201
            seen = []
            for _ in range(12):
                scrape = client.get(s.url + "/metrics")
                seen.append(_created(scrape.text))
            assert seen == [30.0] * 12, seen
        assert folder is not None
        assert folder.is_dir()
        # Both workers counted (else the sums above prove nothing): a file of each.
        writers = {p.stem.rsplit("_", 1)[1] for p in folder.glob("counter_*.db")}
        assert len(writers) == 2, sorted(folder.iterdir())
    assert not folder.exists()  # the server's own, gone with it


def test_a_killed_server_s_metrics_folder_goes_at_the_next_start(tmp_path: Path) -> None:
    # A SIGKILLed supervisor cannot remove its folder: each such kill left one behind in
    # the temporary directory, for good.
    parent = tmp_path / "tmp"
    parent.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has now
    stale = parent / f"{METRICS_DIR_PREFIX}{gone.pid}-abc"
    live = parent / f"{METRICS_DIR_PREFIX}{os.getpid()}-def"  # a server still running
    other = parent / f"{METRICS_DIR_PREFIX}x-ghi"  # not one of ours
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / "counter_1.db").write_bytes(b"x")
    # Not ours to judge, and no reason to stop a server's start: digits of another
    # script, a number past any pid, a link (its target is not followed), a file.
    odd = [parent / f"{METRICS_DIR_PREFIX}{name}-x" for name in ("\u0663", "9" * 40)]
    for folder in odd:
        folder.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = parent / f"{METRICS_DIR_PREFIX}{gone.pid}-link"
    link.symlink_to(target)
    plain = parent / f"{METRICS_DIR_PREFIX}{gone.pid}-file"
    plain.write_bytes(b"")
    assert remove_stale_metrics_dirs(parent) == [stale]
    assert not stale.exists()
    assert live.is_dir()
    assert other.is_dir()
    assert all(folder.is_dir() for folder in odd)
    assert link.is_symlink()
    assert target.is_dir()
    assert plain.is_file()
    # With its lock: held, it is kept whatever its pid says (a server in another
    # container sharing the directory, whose pid means nothing here); let go, it goes
    # even when its pid names a live process (reused).
    held_dir, held = make_metrics_dir(parent)
    elsewhere = held_dir.rename(parent / f"{METRICS_DIR_PREFIX}{gone.pid}-elsewhere")
    mine, let_go = make_metrics_dir(parent)
    os.close(let_go)
    assert mine.name.startswith(f"{METRICS_DIR_PREFIX}{os.getpid()}-")
    try:
        assert remove_stale_metrics_dirs(parent) == [mine]
        assert elsewhere.is_dir()
    finally:
        os.close(held)
    assert remove_stale_metrics_dirs(parent) == [elsewhere]
    # Under its hidden name (a server killed between making it and renaming it): left
    # while it may still be being made, or while its lock is held; gone once old.
    fresh = parent / f".{METRICS_DIR_PREFIX}{gone.pid}-fresh"
    old = parent / f".{METRICS_DIR_PREFIX}{gone.pid}-old"
    old_held = parent / f".{METRICS_DIR_PREFIX}{gone.pid}-held"
    for folder in (fresh, old, old_held):
        folder.mkdir()
    holding = os.open(old_held / ".held", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holding, fcntl.LOCK_EX)
    for folder in (old, old_held):
        past = time.time() - 2 * HIDDEN_METRICS_DIR_AGE_S
        os.utime(folder, (past, past))
    try:
        assert remove_stale_metrics_dirs(parent) == [old]
        assert fresh.is_dir()
        assert old_held.is_dir()
    finally:
        os.close(holding)
    # And a real server's: killed outright, then a server started again removes it.
    env = {"TMPDIR": str(parent)}
    store = f"sqlite:///{tmp_path / 'store.db'}"
    with ServerProcess(store, tmp_path / "log", workers=2, env=env) as killed:
        folders = list(parent.glob(f"{METRICS_DIR_PREFIX}{killed.pid}-*"))
        assert len(folders) == 1, sorted(parent.iterdir())
        killed.kill()  # the supervisor and its workers, SIGKILL: no clean-up
        assert folders[0].is_dir()
    with ServerProcess(store, tmp_path / "log2", workers=2, env=env):
        assert not folders[0].exists()

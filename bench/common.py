"""Shared benchmark plumbing: fresh databases, timing, percentiles, a server process."""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine as sa_engine
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tracestore.db import migrate
from tracestore.db.engine import create_engine

PG_ADMIN = os.environ.get(
    "TRACESTORE_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
TRACESTORE = str(Path(sys.executable).parent / "tracestore")


def pg_available() -> bool:
    """True when the benchmark PostgreSQL answers."""
    try:
        engine = sa_engine(PG_ADMIN, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception:
        return False
    return True


@contextmanager
def fresh_database(backend: str, migrated: bool = True) -> Iterator[str]:
    """A new empty database URL of `backend` (migrated to head), removed afterwards."""
    if backend == "sqlite":
        folder = tempfile.mkdtemp(prefix="tracestore-bench-")
        url = f"sqlite:///{folder}/bench.db"
        try:
            if migrated:
                _migrate(url)
            yield url
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    admin = sa_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    name = f"tracestore_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False)
    try:
        if migrated:
            _migrate(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _migrate(url: str) -> None:
    engine = create_engine(url)
    migrate.upgrade(engine)
    engine.dispose()


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50 and p99 (milliseconds) of samples given in seconds."""
    ordered = sorted(samples)
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "n": len(ordered)}


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def server(url: str, workers: int = 1, **env: str) -> Iterator[str]:
    """`tracestore serve` as a subprocess on loopback; yields its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [
            TRACESTORE,
            "serve",
            "--db",
            url,
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--log-level",
            "warning",
        ],
        env=dict(os.environ, **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"server exited: {proc.stderr.read().decode() if proc.stderr else ''}"
                )
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def timed(fn: Any, *args: Any) -> float:
    """Seconds `fn(*args)` takes."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def tcp_sockets(port: int, state: str) -> set[str]:
    """Socket inodes of this machine's TCP sockets in `state` on local port `port`
    (/proc/net/tcp states: 01 ESTABLISHED, 0A LISTEN)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
                inodes.add(fields[9])
    return inodes


def proc_stat(pid: int) -> tuple[str, float]:
    """Process `pid`'s command name and user + system CPU seconds (from /proc; OSError
    once it is gone)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text.rsplit(")", 1)[1].split()
    seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return text[text.index("(") + 1 : text.rindex(")")], seconds


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process `pid` (OSError once it is gone)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (OSError once it is gone)."""
    return proc_stat(pid)[1]

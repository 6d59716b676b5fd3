"""Shared pieces of the reliability suites: sizes, figures, real server processes, checks.

Everything here drives real things: `tracestore serve` subprocesses on loopback ports,
real sockets and signals, the real databases. Nothing is mocked.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from sqlalchemy import Engine, text

from tests.conftest import EXAMPLES, free_port

ROOT = Path(__file__).resolve().parents[2]
TRACESTORE = str(Path(sys.executable).with_name("tracestore"))
FULL = os.environ.get("TRACESTORE_RELIABILITY", "quick").lower() == "full"
SIZE_NAME = "full" if FULL else "quick"
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Size:
    """How much damage one run does: quick (CI, inside the normal suite) or full."""

    kills: int  # SIGKILLs per database in the crash suite
    crash_clients: int
    acks_between_kills: int  # acknowledged rollouts (at least) between two kills
    concurrency_rounds: int  # shared run_ids raced by all client threads
    flood_connections: int
    fuzz_examples: int  # hypothesis examples per fuzz test
    schema_examples: int  # schemathesis examples per operation
    stateful_steps: int  # schemathesis state-machine examples
    client_restarts: int


QUICK = Size(
    kills=3,
    crash_clients=3,
    acks_between_kills=6,
    concurrency_rounds=6,
    flood_connections=48,
    fuzz_examples=100,
    schema_examples=8,
    stateful_steps=10,
    client_restarts=1,
)
FULL_SIZE = Size(
    kills=24,
    crash_clients=4,
    acks_between_kills=12,
    concurrency_rounds=30,
    flood_connections=160,
    fuzz_examples=1500,
    schema_examples=120,
    stateful_steps=100,
    client_restarts=3,
)
SIZE = FULL_SIZE if FULL else QUICK


# --- figures ------------------------------------------------------------------------------


class Figures:
    """Counters the suites add to; written to test-artifacts/ as JSON at the end of the run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.data: dict[str, Counter[str]] = {}
        self.notes: dict[str, dict[str, Any]] = {}

    def add(self, section: str, **counts: int) -> None:
        """Add to the counters of `section` (e.g. 'crash/sqlite')."""
        with self._lock:
            self.data.setdefault(section, Counter()).update(counts)

    def note(self, section: str, **values: Any) -> None:
        """Record facts of `section` that are not counters (settings, peaks); never summed."""
        with self._lock:
            self.notes.setdefault(section, {}).update(values)

    def total(self, key: str) -> int:
        """The sum of `key` over every section."""
        with self._lock:
            return sum(c.get(key, 0) for c in self.data.values())

    def report_path(self) -> Path:
        """Where the figures of this run go."""
        default = ROOT / "test-artifacts" / f"reliability-{SIZE_NAME}.json"
        return Path(os.environ.get("TRACESTORE_RELIABILITY_REPORT", default))

    def write(self, extra: dict[str, Any]) -> Path:
        """Write the figures (and `extra`) as JSON; returns the path."""
        path = self.report_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            counters = {k: dict(v) for k, v in self.data.items()}
            notes = {k: dict(v) for k, v in self.notes.items()}
        totals: Counter[str] = Counter()
        for counts in counters.values():
            totals.update(counts)
        sections = {
            name: dict(sorted({**counters.get(name, {}), **notes.get(name, {})}.items()))
            for name in sorted(counters.keys() | notes.keys())
        }
        body = {"size": SIZE_NAME, **extra, "totals": dict(sorted(totals.items())), **sections}
        path.write_text(json.dumps(body, indent=2, sort_keys=False) + "\n")
        return path


FIGURES = Figures()


def count_response(section: str, response: httpx.Response) -> None:
    """Count a response in `section` by class: a 500-class answer is counted on its own."""
    status = response.status_code
    FIGURES.add(section, responses=1)
    if status >= 500 and not _is_expected_503(response):
        FIGURES.add(section, server_errors=1)


def _is_expected_503(response: httpx.Response) -> bool:
    # Back-pressure (overloaded) and a database that is not up yet (/health) are promised
    # 503s, not failures; any other 5xx is.
    if response.status_code != 503:
        return False
    try:
        code = response.json().get("error", {}).get("code")
    except (ValueError, AttributeError):
        return False
    return code in (
        "overloaded",
        "database_busy",
        "database_unavailable",
        "database_unreachable",
        "schema_out_of_date",
    )


def hooks(section: str) -> dict[str, list[Any]]:
    """httpx event hooks that count every response in `section`."""

    def on_response(response: httpx.Response) -> None:
        response.read()  # hooks run before the body is read
        count_response(section, response)

    return {"response": [on_response]}


def is_error_shape(body: Any) -> bool:
    """True for `{"error": {"code": str, "message": str, ...}}`."""
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return False
    error = body["error"]
    return isinstance(error.get("code"), str) and isinstance(error.get("message"), str)


# --- real server processes ----------------------------------------------------------------


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


class ServerProcess:
    """`tracestore serve` in a subprocess on a loopback port (its own process group)."""

    def __init__(
        self,
        db_url: str,
        log_path: Path,
        *,
        workers: int = 1,
        env: dict[str, str] | None = None,
        port: int | None = None,
        log_level: str = "warning",
    ) -> None:
        self.db_url = db_url
        self.log_path = log_path
        self.workers = workers
        self.env = env or {}
        self.port = port or free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log_level = log_level
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout: float = 90.0) -> None:
        """Start the server and wait until /health answers 200."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRACESTORE_")}
        env.update(self.env)
        args = [TRACESTORE, "serve", "--db", self.db_url, "--host", LOOPBACK]
        args += ["--port", str(self.port), "--workers", str(self.workers)]
        args += ["--log-level", self.log_level]
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {self.starts}: {' '.join(args)}\n".encode())
            # A new session: the server and its workers form one process group we own.
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=log, env=env, start_new_session=True, cwd=ROOT
            )
        self.starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}): {self.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"server did not become healthy: {self.log_tail()}")

    @property
    def pid(self) -> int:
        """The server's process id."""
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL the server (and its workers): no shutdown, no flush, no goodbye."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Stop gracefully (SIGTERM: uvicorn finishes requests in flight), else SIGKILL."""
        if self.proc is None:
            return
        if self.proc.poll() is not None:
            # The server is gone; what it started may not be (a test killed it alone).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
        # Workers of a multi-process server exit with their supervisor; make sure.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def log_tail(self, n: int = 3000) -> str:
        """The end of the server's log."""
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def log_text(self) -> str:
        """The server's whole log."""
        return self.log_path.read_bytes().decode(errors="replace")

    def memory(self) -> dict[str, int]:
        """VmRSS and VmHWM (peak) of the server process, in bytes."""
        out: dict[str, int] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
        return out

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- rollouts -----------------------------------------------------------------------------


def example_docs() -> list[dict[str, Any]]:
    """The example rollouts (one per distinct run_id, first occurrence)."""
    seen: set[str] = set()
    docs: list[dict[str, Any]] = []
    for line in (EXAMPLES / "rollouts.jsonl").read_bytes().splitlines():
        doc = orjson.loads(line)
        if doc["run_id"] not in seen:
            seen.add(doc["run_id"])
            docs.append(doc)
    return docs


class RolloutFactory:
    """Distinct rollouts made from the examples: a new run_id each, bytes kept for checks."""

    def __init__(self, prefix: str, *, max_bytes: int = 400_000) -> None:
        self.prefix = prefix
        # Small and medium examples keep a kill cycle short; the large ones are covered by
        # the examples suites.
        self.templates = [d for d in example_docs() if len(orjson.dumps(d)) <= max_bytes]
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def make(self, label: str = "") -> bytes:
        """A new rollout's bytes."""
        with self._lock:
            n = next(self._counter)
        doc = dict(self.templates[n % len(self.templates)])
        doc["run_id"] = f"{self.prefix}-{label}{n:06d}"
        return orjson.dumps(doc)


def run_id_of(raw: bytes) -> str:
    """The run_id of a rollout's bytes."""
    run_id: str = orjson.loads(raw)["run_id"]
    return run_id


# --- checks against the store -------------------------------------------------------------

# One statement, so one consistent snapshot on both databases even while clients write.
_ROWS_PER_RUN = text(
    """
    SELECT r.run_id,
      (SELECT count(*) FROM run_documents d WHERE d.run_pk = r.id) AS documents,
      (SELECT count(*) FROM trajectories t WHERE t.run_pk = r.id) AS trajectories,
      (SELECT count(*) FROM steps s WHERE s.run_pk = r.id) AS steps,
      (SELECT count(*) FROM traces t WHERE t.run_pk = r.id) AS traces,
      (SELECT count(*) FROM trace_time_steps ts JOIN traces t ON ts.trace_pk = t.id
        WHERE t.run_pk = r.id) AS time_steps,
      (SELECT count(*) FROM trace_events e WHERE e.run_pk = r.id) AS events,
      (SELECT count(*) FROM trace_messages m WHERE m.run_pk = r.id) AS messages
    FROM runs r
    """
)


def expected_rows(raw: bytes) -> dict[str, int]:
    """The rows one rollout must have in each table (from the ingest's own projection)."""
    from tracestore.ingest.service import prepare

    rows = prepare(raw).rows
    return {
        "documents": 1,
        "trajectories": len(rows.trajectories),
        "steps": sum(len(s) for s in rows.steps),
        "traces": len(rows.traces),
        "time_steps": sum(len(t.time_steps) for t in rows.traces),
        "events": sum(len(t.events) for t in rows.traces),
        "messages": sum(len(t.messages) for t in rows.traces),
    }


def stored_rows(engine: Engine) -> dict[str, dict[str, int]]:
    """For every stored run_id, its row count in each table."""
    with engine.connect() as conn:
        result = conn.execute(_ROWS_PER_RUN)
        columns = list(result.keys())[1:]
        return {row[0]: dict(zip(columns, row[1:], strict=True)) for row in result}


_expected_cache: dict[bytes, dict[str, int]] = {}


def partial_runs(engine: Engine, sent: dict[str, bytes]) -> list[str]:
    """Stored runs whose rows are not exactly those of the rollout sent (or unknown runs)."""
    bad: list[str] = []
    for run_id, counts in stored_rows(engine).items():
        raw = sent.get(run_id)
        if raw is None:
            bad.append(f"{run_id}: stored but never sent")
            continue
        if raw not in _expected_cache:  # projecting is the slow part: once per document
            _expected_cache[raw] = expected_rows(raw)
        if counts != _expected_cache[raw]:
            bad.append(f"{run_id}: rows {counts} != expected {_expected_cache[raw]}")
    return bad


def stored_documents(engine: Engine) -> dict[str, bytes]:
    """Every stored run's document bytes, as the API serves them."""
    from tracestore.store.documents import decompress_document

    query = text(
        "SELECT r.run_id, d.body, d.encoding FROM runs r JOIN run_documents d ON d.run_pk = r.id"
    )
    with engine.connect() as conn:
        return {r: decompress_document(body, enc) for r, body, enc in conn.execute(query)}


def verify_stored(url: str, sent: dict[str, bytes], run_ids: list[str]) -> list[str]:
    """Fetch each run through the API; the problems (missing, different bytes) found."""
    problems: list[str] = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for run_id in run_ids:
            response = http.get(f"/v1/rollouts/{run_id}")
            if response.status_code != 200:
                problems.append(f"{run_id}: GET {response.status_code}")
            elif response.content != sent[run_id]:
                problems.append(f"{run_id}: stored bytes differ from the bytes sent")
    return problems


class WriterProbe:
    """Tells whether some connection holds an open write transaction on the store."""

    def __init__(self, db_url: str) -> None:
        from sqlalchemy.engine import make_url

        url = make_url(db_url)
        self.sqlite = url.get_backend_name() == "sqlite"
        if self.sqlite:
            import sqlite3

            self._sqlite = sqlite3.connect(url.database or "", timeout=0, isolation_level=None)
        else:
            import psycopg

            dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
            self._pg = psycopg.connect(dsn, autocommit=True)

    def active(self) -> bool:
        """True while a write transaction is open."""
        if self.sqlite:
            import sqlite3

            # A writer holds SQLite's write lock from BEGIN IMMEDIATE to COMMIT: if we
            # cannot take it at once, a write transaction is open right now.
            try:
                self._sqlite.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                return True
            self._sqlite.execute("ROLLBACK")
            return False
        # A backend with a transaction id has written in a transaction still open.
        row = self._pg.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()"
        ).fetchone()
        return bool(row and row[0])

    def close(self) -> None:
        """Close the probe's connection."""
        (self._sqlite if self.sqlite else self._pg).close()

    def __enter__(self) -> WriterProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def kill_inside_write(server: ServerProcess, db_url: str, within: float = 5.0) -> bool:
    """SIGKILL the server as soon as a write transaction is open; True if one was caught."""
    caught = False
    with WriterProbe(db_url) as probe:
        deadline_at = time.monotonic() + within
        while time.monotonic() < deadline_at:
            if probe.active():
                caught = True
                break
            # Let the server's writers in between two probes (they wait on busy_timeout).
            time.sleep(0.001)
        server.kill()
    return caught


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Fail (after the block) when the block took longer than `seconds`."""
    start = time.monotonic()
    yield
    took = time.monotonic() - start
    assert took <= seconds, f"{what} took {took:.1f}s (bound {seconds}s)"

"""Concurrency: several server worker processes, 8 client threads racing on the same run_ids.

`tracestore serve --workers 4` on PostgreSQL and `--workers 2` on SQLite. Eight client
threads post a mix (single posts, NDJSON batches, reads), and in every round all eight
post the same run_id at the same instant (released together by a barrier, each on a new
connection, so the requests spread over the worker processes):

- the same content from all eight: exactly one `created`, seven `duplicate`;
- different content under one run_id: exactly one `created`, seven 409 `conflict`;
- exactly one row per run_id in the store, and the stored document is the winner's;
- no 5xx, and no `database is locked` (or any other database error) reaching a client.

SQLite serves several processes through one write path: WAL (readers never wait for the
writer), `BEGIN IMMEDIATE` for every write transaction (a writer takes the lock before
reading, so two writers never deadlock upgrading a read lock) and `busy_timeout=30000`
(a writer queues for the lock instead of failing).
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import Engine, text

from tests.conftest import Database
from tests.reliability.harness import (
    FIGURES,
    FULL,
    SIZE,
    RolloutFactory,
    ServerProcess,
    count_response,
    is_error_shape,
    partial_runs,
    run_id_of,
    stored_documents,
)

CLIENTS = 8
TIMEOUT_S = 120.0
DB_ERRORS = ("database is locked", "OperationalError", "deadlock", "could not serialize")


def _workers(backend: str) -> int:
    return 4 if backend == "postgresql" else 2


def _cpu_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat")
    # A worker gone during the race was killed or crashed: every request on it was lost.
    assert stat.exists(), f"worker {pid} exited during the race (see the server log)"
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _worker_pids(server_pid: int) -> list[int]:
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    # uvicorn's supervisor also starts multiprocessing's resource tracker: not a worker.
    return [
        int(c)
        for c in children
        if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()
    ]


class Outcomes:
    """Every answer the clients got, by run_id."""

    def __init__(self, section: str) -> None:
        self.section = section
        self.lock = threading.Lock()
        self.by_run: dict[str, list[tuple[int, str]]] = {}
        self.problems: list[str] = []
        self.sent: dict[str, bytes] = {}
        self.winner_bytes: dict[str, bytes] = {}

    def record(self, run_id: str, status: int, outcome: str, raw: bytes | None = None) -> None:
        """One rollout's answer."""
        with self.lock:
            self.by_run.setdefault(run_id, []).append((status, outcome))
            if outcome == "created" and raw is not None:
                self.winner_bytes[run_id] = raw

    def check(self, response: httpx.Response) -> None:
        """Whatever the route: no 5xx, no database error text, errors in the error shape."""
        count_response(self.section, response)
        problem = None
        if response.status_code >= 500:
            problem = f"{response.status_code}: {response.text[:300]}"
        elif any(needle in response.text for needle in DB_ERRORS):
            problem = f"database error reached a client: {response.text[:300]}"
        elif response.status_code >= 400 and not is_error_shape(response.json()):
            problem = f"not the error shape: {response.text[:300]}"
        if problem:
            with self.lock:
                self.problems.append(f"{response.request.method} {response.request.url}: {problem}")


def _variant(raw: bytes, index: int) -> bytes:
    doc = orjson.loads(raw)
    doc["client_variant"] = index  # other content under the same run_id
    return orjson.dumps(doc)


def _post_one(http: httpx.Client, raw: bytes, out: Outcomes) -> None:
    response = http.post("/v1/rollouts", content=raw)
    out.check(response)
    body: Any = response.json()
    outcome = body["status"] if response.status_code < 300 else body["error"]["code"]
    out.record(run_id_of(raw), response.status_code, outcome, raw)


def _post_batch(http: httpx.Client, raws: list[bytes], out: Outcomes) -> None:
    response = http.post(
        "/v1/rollouts/batch",
        content=b"\n".join(raws),
        headers={"Content-Type": "application/x-ndjson"},
    )
    out.check(response)
    assert response.status_code == 207, response.text
    for raw, result in zip(raws, response.json()["results"], strict=True):
        outcome = result["status"] if result["http_status"] < 300 else result["error"]["code"]
        out.record(result["run_id"], result["http_status"], outcome, raw)


def _client(
    index: int,
    url: str,
    rounds: list[tuple[bytes, bytes]],
    factory: RolloutFactory,
    barrier: threading.Barrier,
    out: Outcomes,
) -> None:
    # No keep-alive: every request opens a connection, which any worker may accept.
    limits = httpx.Limits(max_keepalive_connections=0)
    try:
        with httpx.Client(base_url=url, timeout=TIMEOUT_S, limits=limits) as http:
            for same, contested in rounds:
                own = [factory.make(f"own{index}-") for _ in range(2)]
                with out.lock:
                    out.sent.update((run_id_of(r), r) for r in own)
                barrier.wait(timeout=TIMEOUT_S)
                # Everyone at once: the same rollout, half by single post, half in a batch.
                if index % 2:
                    _post_batch(http, [own[0], same], out)
                else:
                    _post_one(http, same, out)
                barrier.wait(timeout=TIMEOUT_S)
                # Everyone at once: one run_id, eight different contents.
                _post_one(http, _variant(contested, index), out)
                _post_one(http, own[1], out)
                for path in (
                    f"/v1/rollouts/{urllib.parse.quote(run_id_of(same), safe='')}",
                    f"/v1/rollouts/{run_id_of(contested)}/trajectories",
                    "/v1/rollouts?limit=20",
                ):
                    response = http.get(path)
                    out.check(response)
                    assert response.status_code == 200, response.text
    except Exception as exc:  # reported by the test, with the thread that failed
        with out.lock:
            out.problems.append(f"client {index}: {type(exc).__name__}: {exc}")
        barrier.abort()


def test_racing_clients_get_one_row_and_consistent_answers(
    backend: str, fresh_db: Database, fresh_engine: Engine, tmp_path: Path
) -> None:
    workers = _workers(backend)
    factory = RolloutFactory(f"race-{backend}", max_bytes=60_000)
    rounds = [
        (factory.make("same-"), factory.make("contested-")) for _ in range(SIZE.concurrency_rounds)
    ]
    out = Outcomes(f"concurrency/{backend}")
    for same, _contested in rounds:
        out.sent[run_id_of(same)] = same
    with ServerProcess(fresh_db.url, tmp_path / "server.log", workers=workers) as server:
        pids = _worker_pids(server.pid)
        assert len(pids) == workers, f"expected {workers} worker processes, found {pids}"
        cpu_before = {pid: _cpu_ticks(pid) for pid in pids}
        barrier = threading.Barrier(CLIENTS)
        threads = [
            threading.Thread(
                target=_client, args=(i, server.url, rounds, factory, barrier, out), daemon=True
            )
            for i in range(CLIENTS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=TIMEOUT_S * 2)
            assert not thread.is_alive(), "a client hung"
        busy = [pid for pid in pids if _cpu_ticks(pid) - cpu_before[pid] >= 5]
        log = server.log_text()

    assert not out.problems, out.problems[:10]
    # The race crossed processes: more than one worker did real work.
    assert len(busy) >= 2, f"only workers {busy} of {pids} served requests"
    for same, contested in rounds:
        same_outcomes = Counter(o for _, o in out.by_run[run_id_of(same)])
        assert same_outcomes == {"created": 1, "duplicate": CLIENTS - 1}, same_outcomes
        contested_outcomes = Counter(out.by_run[run_id_of(contested)])
        assert contested_outcomes == {(201, "created"): 1, (409, "conflict"): CLIENTS - 1}
    for run_id, answers in out.by_run.items():
        if not run_id.startswith(f"race-{backend}-own"):
            continue
        assert answers == [(201, "created")], (run_id, answers)

    with fresh_engine.connect() as conn:
        doubled = conn.execute(
            text("SELECT run_id, count(*) FROM runs GROUP BY run_id HAVING count(*) > 1")
        ).all()
    assert doubled == []
    documents = stored_documents(fresh_engine)
    assert set(documents) == set(out.by_run)
    # The stored document is the one whose post was answered `created`.
    assert [r for r, raw in out.winner_bytes.items() if documents[r] != raw] == []
    out.sent.update(out.winner_bytes)
    assert partial_runs(fresh_engine, out.sent) == []
    assert "database is locked" not in log
    FIGURES.note(f"concurrency/{backend}", workers=workers, busy_workers=len(busy), clients=CLIENTS)
    FIGURES.add(
        f"concurrency/{backend}",
        raced_run_ids=2 * len(rounds),
        rollout_answers=sum(len(a) for a in out.by_run.values()),
        duplicate_rows=0,
        database_locked=0,
    )


@pytest.mark.skipif(not FULL, reason="full size only: holds SQLite's write lock for 31 s")
def test_a_writer_held_up_past_the_busy_timeout_gets_503_not_500(tmp_path: Path) -> None:
    """When another process holds SQLite's write lock longer than busy_timeout (30 s)."""
    db = tmp_path / "store.db"
    with ServerProcess(f"sqlite:///{db}", tmp_path / "server.log") as server:
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # e.g. a long migration or a manual session
        try:
            with httpx.Client(base_url=server.url, timeout=120) as http:
                response = http.post("/v1/rollouts", content=RolloutFactory("held").make())
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    count_response("concurrency/sqlite", response)
    assert "database is locked" not in response.text
    assert response.status_code == 503, response.text
    assert response.headers.get("retry-after")
    assert is_error_shape(response.json())


# A write transaction of another tracestore process, which then stops (SIGSTOP: a
# debugger, a suspended shell job) with the write queue and SQLite's write lock held.
_STOPPED_HOLDER = """
import sys
from sqlalchemy import text
from tracestore.db.engine import create_engine, write_engine
conn = write_engine(create_engine(sys.argv[1])).connect()
conn.begin()
conn.execute(text("SELECT 1"))
print("held", flush=True)
sys.stdin.read()
"""


def test_a_writer_stopped_with_the_queue_held_gets_503_not_a_hang(tmp_path: Path) -> None:
    """A post waits for the write queue at most the busy timeout (`?timeout=1`): 503 with
    Retry-After and nothing stored while the holder is stopped; once it is gone, the same
    post is created."""
    db = tmp_path / "store.db"
    url = f"sqlite:///{db}?timeout=1"
    body = RolloutFactory("stopped-holder").make()
    run_id = run_id_of(body)
    with ServerProcess(url, tmp_path / "server.log") as server:
        holder = subprocess.Popen(
            [sys.executable, "-c", _STOPPED_HOLDER, url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == b"held\n"
            holder.send_signal(signal.SIGSTOP)
            with httpx.Client(base_url=server.url, timeout=20) as http:
                started = time.monotonic()
                refused = http.post("/v1/rollouts", content=body)
                waited = time.monotonic() - started
                assert refused.status_code == 503, refused.text
                assert refused.headers.get("retry-after")
                assert is_error_shape(refused.json())
                assert "database is locked" not in refused.text
                assert waited < 10, waited
                assert http.get(f"/v1/rollouts/{run_id}").status_code == 404
        finally:
            holder.send_signal(signal.SIGCONT)
            holder.kill()
            holder.wait(10)
        with httpx.Client(base_url=server.url, timeout=20) as http:
            created = http.post("/v1/rollouts", content=body)
            assert created.status_code == 201, created.text
            assert http.get(f"/v1/rollouts/{run_id}").status_code == 200

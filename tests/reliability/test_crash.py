"""Crash safety: SIGKILL the real server mid-stream, restart it, lose nothing acknowledged.

Several clients stream rollouts (single posts and NDJSON batches) into a `tracestore serve`
subprocess through `tracestore.client`, which retries across each outage. The server is
SIGKILLed again and again and restarted on the same port. The kills land at three kinds
of points: at a random moment of the stream, inside an open write transaction (caught by
probing the database's write lock), and inside a large batch after some of its items were
committed. After every restart, and at the end:

- every rollout acknowledged (2xx: created or duplicate) before the kill is stored, and
  the API gives back exactly the bytes that were sent;
- no partial rollout exists: every stored run has exactly the rows its document projects
  to (document, trajectories, steps, traces, time steps, events, messages);
- the retries after a restart end as created or duplicate, never conflict.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import Engine, text

from tests.conftest import Database
from tests.reliability.harness import (
    FIGURES,
    SIZE,
    RolloutFactory,
    ServerProcess,
    count_response,
    hooks,
    kill_inside_write,
    partial_runs,
    run_id_of,
    stored_documents,
    verify_stored,
)
from tracestore.client import TracestoreClient, TracestoreHTTPError

WAIT_S = 120.0
BATCH_SIZES = (2, 5)
PAUSE_S = 0.02  # between a client's posts: leaves CPU to the server on a 2-core runner
# The batch the last kill lands in: 1280 small rollouts make 20 transactions of 64
# (ingest/service.py), so the kill has 0.4-0.7 s after the first commit to land before
# the last one. 100 rollouts of up to 100 kB made two: 15-60 ms, which a test process
# descheduled on a loaded runner could miss.
BIG_BATCH = 1280
BIG_BATCH_MAX_BYTES = 20_000


class Stream:
    """The clients' shared bookkeeping: what was sent, what was acknowledged."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: dict[str, bytes] = {}
        self.acked: dict[str, str] = {}  # run_id -> final status
        self.errors: list[str] = []
        self.in_flight = 0
        self.stop = threading.Event()
        # The clients pause once this many rollouts are acknowledged: each kill cycle
        # gets a bounded stream, so the checks after each restart stay small.
        self.budget = 0

    def ack(self, run_id: str, status: str) -> None:
        """Record the final answer for one rollout."""
        with self.lock:
            if status in ("created", "duplicate"):
                self.acked[run_id] = status
            else:
                self.errors.append(f"{run_id}: {status}")

    def acked_ids(self) -> list[str]:
        """The rollouts acknowledged so far."""
        with self.lock:
            return list(self.acked)


def _client_loop(
    index: int, url: str, factory: RolloutFactory, stream: Stream, section: str
) -> None:
    rng = random.Random(index)
    client = TracestoreClient(
        url,
        timeout=30,
        # Ride out every restart: many quick retries, bounded in time.
        max_retries=10_000,
        backoff=0.05,
        max_backoff=0.5,
        max_retry_time=WAIT_S,
        event_hooks=hooks(section),
    )
    with client:
        while not stream.stop.is_set():
            if len(stream.acked) >= stream.budget:
                time.sleep(PAUSE_S)
                continue
            batch = index % 3 == 2
            n = rng.randint(*BATCH_SIZES) if batch else 1
            raws = [factory.make(f"c{index}-") for _ in range(n)]
            with stream.lock:
                stream.sent.update((run_id_of(r), r) for r in raws)
                stream.in_flight += 1
            try:
                if batch:
                    body = client.post_batch(raws)
                    for raw, result in zip(raws, body["results"], strict=True):
                        stream.ack(run_id_of(raw), result["status"])
                else:
                    stream.ack(run_id_of(raws[0]), client.post_rollout(raws[0])["status"])
            except (httpx.TransportError, TracestoreHTTPError) as exc:
                with stream.lock:
                    stream.errors.append(f"client {index}: {type(exc).__name__}: {exc}")
                return
            finally:
                with stream.lock:
                    stream.in_flight -= 1
            time.sleep(PAUSE_S)


def _wait_for_acks(stream: Stream, target: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while len(stream.acked_ids()) < target:
        assert not stream.errors, stream.errors[:5]
        assert time.monotonic() < deadline, "the clients stopped making progress"
        time.sleep(0.02)


def _stored_ids(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [r for (r,) in conn.execute(text("SELECT run_id FROM runs"))]


def _post_batch(url: str, raws: list[bytes], section: str) -> httpx.Response | None:
    """POST an NDJSON batch; None when the connection was cut (by a kill)."""
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            response = http.post(
                "/v1/rollouts/batch",
                content=b"\n".join(raws),
                headers={"Content-Type": "application/x-ndjson"},
            )
    except httpx.TransportError:
        return None
    count_response(section, response)
    return response


def _kill_mid_batch(
    server: ServerProcess, db: Database, engine: Engine, factory: RolloutFactory, section: str
) -> tuple[dict[str, bytes], list[str]]:
    """Kill inside a big batch once some of its items are committed; (batch, stored ids)."""
    raws = [factory.make("batch-") for _ in range(BIG_BATCH)]
    batch = {run_id_of(r): r for r in raws}
    answers: list[httpx.Response | None] = []
    thread = threading.Thread(
        target=lambda: answers.append(_post_batch(server.url, raws, section)), daemon=True
    )
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not batch.keys() & set(_stored_ids(engine)):
        assert time.monotonic() < deadline, "no item of the batch was stored"
        time.sleep(0.005)
    caught = kill_inside_write(server, db.url)
    thread.join(timeout=WAIT_S)
    assert answers == [None], "the kill must cut the batch before its answer"
    stored = sorted(batch.keys() & set(_stored_ids(engine)))
    assert 1 <= len(stored) < len(raws), "the kill must land inside the batch"
    FIGURES.add(section, kills_inside_write=int(caught), kills_mid_batch=1)
    return batch, stored


def test_acknowledged_rollouts_survive_sigkill(
    backend: str, fresh_db: Database, fresh_engine: Engine, tmp_path: Path
) -> None:
    section = f"crash/{backend}"
    server = ServerProcess(fresh_db.url, tmp_path / "server.log")
    factory = RolloutFactory(f"crash-{backend}", max_bytes=100_000)
    stream = Stream()
    rng = random.Random(7)
    verified: set[str] = set()
    server.start()
    threads = [
        threading.Thread(
            target=_client_loop, args=(i, server.url, factory, stream, section), daemon=True
        )
        for i in range(SIZE.crash_clients)
    ]
    try:
        for thread in threads:
            thread.start()
        for kill in range(SIZE.kills):
            acked_now = len(stream.acked_ids())
            # Enough budget that the stream is still flowing when the kill lands.
            stream.budget = acked_now + 3 * SIZE.acks_between_kills
            _wait_for_acks(stream, acked_now + SIZE.acks_between_kills)
            before = stream.acked_ids()
            with stream.lock:
                in_flight = stream.in_flight
            batch: dict[str, bytes] = {}
            if kill == SIZE.kills - 1:
                # Inside a big batch: its committed items stay, the others never were.
                small = RolloutFactory(f"crash-{backend}-big", max_bytes=BIG_BATCH_MAX_BYTES)
                batch, batch_stored = _kill_mid_batch(
                    server, fresh_db, fresh_engine, small, section
                )
                with stream.lock:
                    stream.sent.update(batch)
            elif kill % 2:
                # Inside a write transaction: the rollout being written must vanish whole.
                in_write = kill_inside_write(server, fresh_db.url)
                FIGURES.add(section, kills_inside_write=int(in_write))
            else:
                # At a random point of the stream (reading, parsing, writing, answering).
                time.sleep(rng.uniform(0.0, 0.25))
                server.kill()
            FIGURES.add(section, kills=1, in_flight_at_kill=in_flight)
            time.sleep(rng.uniform(0.0, 0.5))  # clients hit a closed port meanwhile
            server.start()

            new = [r for r in before if r not in verified]
            problems = verify_stored(server.url, stream.sent, new)
            assert not problems, f"acknowledged before kill {kill + 1}, then lost: {problems[:5]}"
            verified.update(new)
            FIGURES.add(section, acknowledged_before_kill=len(new))
            # The live map (lookups only): a run stored after a snapshot of it would look
            # "never sent", and every rollout enters the map before it is posted.
            assert partial_runs(fresh_engine, stream.sent) == []
            # A producer that never saw its acknowledgement retries: the acknowledged come
            # back `duplicate`; the cut batch's items come back created or duplicate.
            with httpx.Client(base_url=server.url, timeout=30) as http:
                for run_id in rng.sample(before, min(3, len(before))):
                    response = http.post("/v1/rollouts", content=stream.sent[run_id])
                    count_response(section, response)
                    assert response.status_code == 200, response.text
                    assert response.json()["status"] == "duplicate"
            if batch:
                retried = _post_batch(server.url, list(batch.values()), section)
                assert retried is not None
                assert retried.status_code == 207
                statuses = {r["run_id"]: r["status"] for r in retried.json()["results"]}
                assert {statuses[r] for r in batch_stored} == {"duplicate"}
                assert {s for r, s in statuses.items() if r not in batch_stored} == {"created"}
                for run_id, status in statuses.items():
                    stream.ack(run_id, status)
                FIGURES.add(section, retried_after_kill=len(batch))

        stream.stop.set()
        for thread in threads:
            thread.join(timeout=WAIT_S)
            assert not thread.is_alive(), "a client did not finish"
        assert not stream.errors, stream.errors[:5]

        acked = stream.acked_ids()
        documents = stored_documents(fresh_engine)
        # Every post ended acknowledged (the clients retried across each restart), so the
        # store holds exactly the acknowledged rollouts, each equal to the bytes sent.
        assert set(documents) == set(acked)
        assert [r for r in acked if documents[r] != stream.sent[r]] == []
        assert partial_runs(fresh_engine, stream.sent) == []
        duplicates = sum(1 for s in stream.acked.values() if s == "duplicate")
        FIGURES.add(
            section,
            acknowledged=len(acked),
            verified=len(acked),
            committed_but_unacknowledged=duplicates,
            lost=0,
            partial=0,
            conflicts=0,
        )
    finally:
        stream.stop.set()
        server.stop()

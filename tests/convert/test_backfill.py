"""Backfill: converted traces for legacy-only runs; idempotent, survives a kill, concurrent."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
from sqlalchemy import Engine, func, select, text

from tests.conftest import Example
from tracestore.backfill import backfill, count_pending
from tracestore.convert import CONVERTER_VERSION, source_sha256, trajectories_to_trace
from tracestore.db.uow import read_session
from tracestore.ingest.service import ingest_bytes
from tracestore.models import Run, Trace, TraceEvent

TRACESTORE = str(Path(sys.executable).parent / "tracestore")


def _legacy_docs(examples: list[Example], copies: int) -> list[bytes]:
    legacy = [e.doc for e in examples if e.label["kind"] == "legacy_only"]
    return [
        orjson.dumps(dict(doc, run_id=f"{doc['run_id']}-{i}"))
        for i in range(copies)
        for doc in legacy
    ]


def _traces_per_legacy_run(engine: Engine) -> dict[str, int]:
    with read_session(engine) as session:
        rows = session.execute(
            select(Run.run_id, func.count(Trace.id))
            .outerjoin(Trace, (Trace.run_pk == Run.id) & Trace.trajectory_idx.is_(None))
            .where(Run.trace_kind.is_(None), Run.n_trajectories > 0)
            .group_by(Run.run_id)
        ).all()
    return dict(rows)


def test_backfill_converts_legacy_only_runs_once(engine: Engine, examples: list[Example]) -> None:
    for ex in examples:
        ingest_bytes(engine, ex.raw)
    legacy = {e.label["run_id"]: e.doc for e in examples if e.label["kind"] == "legacy_only"}
    assert count_pending(engine) == len(legacy)
    result = backfill(engine, batch_size=4)
    assert (result.runs, result.skipped, result.failed) == (len(legacy), 0, {})
    assert count_pending(engine) == 0
    assert _traces_per_legacy_run(engine) == dict.fromkeys(legacy, 1)
    with read_session(engine) as session:
        for run_id, doc in legacy.items():
            trace = session.execute(
                select(Trace).join(Run, Run.id == Trace.run_pk).where(Run.run_id == run_id)
            ).scalar_one()
            assert trace.origin == "converted"
            assert trace.converter == "trajectories_to_trace"
            assert trace.converter_version == CONVERTER_VERSION
            assert trace.source_hash == source_sha256(doc)
            env_events = session.scalar(
                select(func.count())
                .select_from(TraceEvent)
                .where(TraceEvent.trace_pk == trace.id, TraceEvent.event_type == "environment")
            )
            assert env_events == sum(len(t["steps"]) for t in doc["trajectories"])
            assert trace.n_events == len(trajectories_to_trace(doc).data["event_history"])
    # Idempotent: a second run finds nothing to do.
    again = backfill(engine)
    assert (again.runs, again.skipped) == (0, 0)
    # Received traces are never touched: every other run keeps exactly its own.
    with read_session(engine) as session:
        origins = session.execute(select(Trace.origin, func.count()).group_by(Trace.origin))
        counts = dict(origins.all())
    received = sum(
        1 for e in examples if e.label["expect_status"] == "created" and e.doc["trace"] is not None
    )
    assert counts == {"converted": len(legacy), "received": received}


def _converted(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM traces WHERE origin = 'converted'")
            ).scalar_one()
        )


def _spawn(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [TRACESTORE, "backfill", "--db", url, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
    )


def test_backfill_survives_a_kill(engine: Engine, examples: list[Example]) -> None:
    docs = _legacy_docs(examples, copies=60)  # 360 legacy-only runs
    for raw in docs:
        ingest_bytes(engine, raw)
    url = engine.url.render_as_string(hide_password=False)
    proc = _spawn(url, "--batch-size", "2")
    deadline = time.monotonic() + 120
    # Kill it for real once some batches are committed and before it is done.
    while _converted(engine) < 10:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    done_before = _converted(engine)
    assert 10 <= done_before < len(docs), "the kill must land midway"
    # The batch in flight rolled back whole: every converted run has its full trace.
    counts = _traces_per_legacy_run(engine)
    assert set(counts.values()) <= {0, 1}
    rerun = _spawn(url)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    assert f"{len(docs) - done_before} runs converted" in out
    assert _traces_per_legacy_run(engine) == dict.fromkeys(counts, 1)
    assert count_pending(engine) == 0


def test_concurrent_backfills_never_convert_a_run_twice(
    engine: Engine, examples: list[Example]
) -> None:
    # PostgreSQL: batches lock their runs with SKIP LOCKED and share the work. SQLite:
    # batches take the write lock in turn (BEGIN IMMEDIATE) and each sees the others' work.
    docs = _legacy_docs(examples, copies=50)  # 300 runs
    for raw in docs:
        ingest_bytes(engine, raw)
    url = engine.url.render_as_string(hide_password=False)
    procs = [_spawn(url, "--batch-size", "3") for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in procs]
    converted = 0
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        match = re.search(r"(\d+) runs converted", out)
        assert match, out
        converted += int(match.group(1))
    # Each run converted by exactly one process, and stored once.
    assert converted == len(docs)
    assert _traces_per_legacy_run(engine) == {orjson.loads(d)["run_id"]: 1 for d in docs}

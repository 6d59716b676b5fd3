"""The commit-ordered cut (issue 15, item 1): ingest_seq, the watermark, migration 0005."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.conftest import minimal_rollout
from tests.lake.conftest import (
    LakeStore,
    OpenWrite,
    check_lake_once,
    export_until_complete,
    settled,
)
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.ingest.service import ingest_bytes
from tracestore.reports.watermark import POSTGRESQL, SQLITE, take_cut


def _seqs(store: LakeStore) -> dict[str, int]:
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id, ingest_seq FROM runs")).all()
    return {r.run_id: r.ingest_seq for r in rows}


def test_runs_get_a_sequence_in_commit_order(lake_store: LakeStore) -> None:
    lake_store.ingest("a1", "a2")
    lake_store.ingest("b1")
    seqs = _seqs(lake_store)
    assert None not in seqs.values()
    # A later transaction always gets a larger value; runs of one transaction may share
    # one (PostgreSQL: the transaction's id).
    assert max(seqs["a1"], seqs["a2"]) < seqs["b1"]
    settled(lake_store.engine)
    cut = take_cut(lake_store.engine)
    assert cut.kind == (SQLITE if lake_store.backend == "sqlite" else POSTGRESQL)
    assert cut.store_id == lake_store.store_id()
    assert cut.upto > seqs["b1"]


def test_a_transaction_open_across_the_cut_lands_in_the_next_export(
    lake_store: LakeStore, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    lake_store.ingest("before")
    settled(lake_store.engine)  # no older transaction anywhere holds "before" back
    late = OpenWrite(lake_store, "late")  # written, stamped, not committed
    try:
        if lake_store.backend == "postgresql":
            # Younger transactions commit while `late` stays open: their runs must wait
            # for it, or an export after them would have passed `late`'s sequence.
            lake_store.ingest("younger")
            assert _seqs(lake_store)["younger"] > late.seq
        cut = take_cut(lake_store.engine)
        assert cut.upto <= late.seq
        first = lake_store.export(lake, settle=False)
        assert check_lake_once(lake, lake_store) == {"before"}
        assert first.runs == 1
        if lake_store.backend == "postgresql":
            assert cut.held_back >= 1
            assert any("older transaction still open" in n for n in first.notices)
    finally:
        late.commit()
    lake_store.ingest("after")
    want = lake_store.run_ids()
    assert want == {"before", "late", "after"} | (
        {"younger"} if lake_store.backend == "postgresql" else set()
    )
    assert export_until_complete(lake_store, lake, want) == want


def test_runs_written_without_a_sequence_are_sequenced_by_the_export(
    lake_store: LakeStore,
) -> None:
    if lake_store.backend != "sqlite":
        pytest.skip("PostgreSQL rows always get one: the column's default")
    lake_store.ingest("a", "b")
    with lake_store.engine.begin() as conn:
        conn.execute(text("UPDATE runs SET ingest_seq = NULL WHERE run_id = 'a'"))
    cut = take_cut(lake_store.engine)
    seqs = _seqs(lake_store)
    assert seqs["a"] > seqs["b"]
    assert cut.upto == seqs["a"] + 1
    assert cut.notices
    assert "sequenced now" in cut.notices[0]
    assert take_cut(lake_store.engine).notices == ()


def test_the_migration_sequences_stored_runs_and_names_the_store(
    backend: str, tmp_path_factory: pytest.TempPathFactory, pg_databases: object
) -> None:
    from tests.conftest import new_database

    db = new_database(backend, "mig15", tmp_path_factory, pg_databases)  # type: ignore[arg-type]
    engine = create_engine(db.url)
    try:
        # A store the release before 0005 left: a run stored, the schema at 0004 (named:
        # hold_back would stop one revision behind head, which moves on with new ones).
        migrate.upgrade(engine)
        ingest_bytes(engine, json.dumps(minimal_rollout("stored-before")).encode())
        migrate.downgrade(engine, "0004")
        assert migrate.current_revision(engine) == "0004"
        migrate.upgrade(engine)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT run_id, ingest_seq FROM runs")).all()
            seqs: dict[str, int] = {r.run_id: r.ingest_seq for r in rows}
            ids = conn.execute(text("SELECT store_id FROM store_identity")).scalars().all()
        assert set(seqs) == {"stored-before"}
        assert None not in seqs.values()
        assert len(ids) == 1
        assert len(ids[0]) == 32
        ingest_bytes(engine, json.dumps(minimal_rollout("after")).encode())
        with engine.connect() as conn:
            after = conn.execute(
                text("SELECT ingest_seq FROM runs WHERE run_id = 'after'")
            ).scalar_one()
        assert after > max(seqs.values())
        # Any transaction open on the PostgreSQL server (another test's, another run's)
        # holds the watermark back: wait for it, as every export of the lake tests does.
        settled(engine)
        assert take_cut(engine).upto > after
        migrate.downgrade(engine, "0004")
        migrate.upgrade(engine)
        with engine.connect() as conn:
            again = conn.execute(text("SELECT store_id FROM store_identity")).scalars().all()
        assert len(again) == 1
    finally:
        engine.dispose()

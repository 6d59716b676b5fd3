"""Retention (issue 20.2) and datasets (20.3), on both databases: rules select exactly what
they say, pinned runs survive, a sweep beside live ingest deletes the plan and nothing
acknowledged after it, an interrupted sweep finishes when run again, space comes back."""

from __future__ import annotations

import json
import secrets
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import Engine, text

from tests.conftest import Database, minimal_rollout, row_counts
from tests.deletion.conftest import orphans
from tracestore.api import create_app
from tracestore.db.uow import read_session, write_session
from tracestore.durations import parse_age
from tracestore.errors import Conflict, InvalidRequest
from tracestore.ingest.service import ingest_bytes, ingest_many
from tracestore.retention import schedule
from tracestore.retention.space import store_size, vacuum
from tracestore.retention.sweep import all_rules, apply, plan
from tracestore.settings import RetentionRuleSetting, Settings
from tracestore.store.datasets import (
    create_dataset,
    dataset_manifest,
    dataset_run_ids,
    drop_dataset,
    manifest_hash,
)
from tracestore.store.deletion import Deletion, delete_run, deletions
from tracestore.store.retention import Rule, drop_rule, set_rule, stored_rules
from tracestore.store.runs import RunFilter

NOW = datetime.now(UTC)


def _doc(run_id: str, env: str = "e", policy: str = "p") -> bytes:
    doc = minimal_rollout(run_id)
    doc["trajectories"][0]["env_id"] = env
    doc["trajectories"][0]["policy_id"] = policy
    return json.dumps(doc).encode()


def _store(engine: Engine, ids: list[str], env: str = "e", age_days: float = 0) -> None:
    """Store runs, then date them `age_days` back (received_at is set at ingest)."""
    results = ingest_many(engine, [_doc(i, env) for i in ids])
    assert {r.status for r in results} == {"created"}
    if age_days:
        with engine.begin() as conn:
            for run_id in ids:
                conn.execute(
                    text("UPDATE runs SET received_at = :t WHERE run_id = :r"),
                    {"t": NOW - timedelta(days=age_days), "r": run_id},
                )


def _run_ids(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT run_id FROM runs")).scalars())


def _pin(engine: Engine, name: str, f: RunFilter) -> dict[str, object]:
    with write_session(engine) as session:
        return create_dataset(session, name, f, created_by="test", now=datetime.now(UTC))


def test_rules_select_by_age_count_and_scope(engine: Engine) -> None:
    old = [f"old-{i}" for i in range(5)]
    fresh = [f"fresh-{i}" for i in range(5)]
    other = [f"other-{i:02d}" for i in range(12)]  # env 'o', all fresh, oldest first
    _store(engine, old, age_days=40)
    _store(engine, fresh, age_days=1)
    for run_id in other:
        _store(engine, [run_id], env="o")
    by_age = Rule("month", max_age_s=parse_age("30d"))
    by_count = Rule("o-last-10", keep_last=10, env_id="o")
    planned = plan(engine, [by_age, by_count], now=NOW + timedelta(minutes=1))
    selected = {r.run_id: r.rule for r in planned.runs}
    assert selected == {
        **dict.fromkeys(old, "month"),
        "other-00": "o-last-10",
        "other-01": "o-last-10",
    }
    assert planned.by_rule() == {"month": 5, "o-last-10": 2}
    # A dry run (the plan) deleted nothing.
    assert len(_run_ids(engine)) == 22

    swept = apply(engine, planned, batch_size=2)
    assert swept.deleted == 7
    assert swept.batches == 4
    assert _run_ids(engine) == set(fresh) | set(other[2:])
    assert orphans(engine) == {}
    with read_session(engine) as session:
        audit = deletions(session, limit=100)
    assert {(a["run_id"], a["deleted_by"], a["via"]) for a in audit} == {
        *((r, "retention:month", "retention") for r in old),
        ("other-00", "retention:o-last-10", "retention"),
        ("other-01", "retention:o-last-10", "retention"),
    }


def test_each_rule_counts_every_run_it_selects(engine: Engine) -> None:
    # `retention show` counted a run only under the first rule selecting it: the second
    # rule here showed 5, not 10 (found by exploratory QA).
    _store(engine, [f"old-{i}" for i in range(5)], age_days=40)
    _store(engine, [f"fresh-{i}" for i in range(5)], age_days=1)
    month = Rule("month", max_age_s=parse_age("30d"))
    every_e = Rule("every-e", keep_last=0, env_id="e")
    planned = plan(engine, [month, every_e], now=NOW + timedelta(minutes=1))
    assert planned.by_rule() == {"month": 5, "every-e": 10}
    assert len(planned.runs) == 10  # each planned once
    assert planned.as_dict(runs=False)["selected"] == 10
    # The first rule that selects a run is the one its audit names.
    assert {r.rule for r in planned.runs if r.run_id.startswith("old-")} == {"month"}


def test_an_age_past_a_floats_range_is_refused() -> None:
    # It was stored as infinity: `retention show` said "older than infs" and its JSON
    # null, as for a rule with no age (found by exploratory QA).
    huge = "9" * 400 + "d"
    with pytest.raises(InvalidRequest, match="too long a duration"):
        parse_age(huge)
    with pytest.raises(ValidationError, match="too long a duration"):
        RetentionRuleSetting(name="forever", max_age=huge)
    assert parse_age("99999999999d") == 99999999999 * 86400  # long, but a number


@pytest.mark.parametrize("age", ["999999d", "99999999999d"])
def test_an_age_past_the_calendar_selects_nothing_and_stops_no_other_rule(
    engine: Engine, age: str
) -> None:
    # Such a rule was accepted, then its cutoff (now - age) overflowed: the whole plan
    # failed, in `retention show`/`apply` and in every scheduled sweep, so no rule
    # deleted anything.
    _store(engine, [f"old-{i}" for i in range(3)], age_days=40)
    forever = Rule("forever", max_age_s=parse_age(age))
    month = Rule("month", max_age_s=parse_age("30d"))
    planned = plan(engine, [forever, month], now=NOW + timedelta(minutes=1))
    assert planned.by_rule() == {"forever": 0, "month": 3}
    assert apply(engine, planned).deleted == 3


def test_pinned_runs_survive_a_sweep_until_their_dataset_is_dropped(engine: Engine) -> None:
    _store(engine, [f"train-{i}" for i in range(4)], env="train", age_days=90)
    _store(engine, [f"junk-{i}" for i in range(3)], env="junk", age_days=90)
    manifest = _pin(engine, "sft-2026-12", RunFilter(env_id="train"))
    assert manifest["n_runs"] == 4
    assert manifest["present"] == 4
    assert manifest["filter"] == {"env_id": "train"}
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id, content_hash FROM runs"))
        hashes = {str(r.run_id): str(r.content_hash) for r in rows}
    members = [(f"train-{i}", hashes[f"train-{i}"]) for i in range(4)]
    assert manifest["manifest_hash"] == manifest_hash(members)

    rule = Rule("quarter", max_age_s=parse_age("30d"))
    planned = plan(engine, [rule])
    assert {r.run_id for r in planned.runs} == {f"junk-{i}" for i in range(3)}
    assert planned.pinned == {"quarter": 4}
    apply(engine, planned)
    assert _run_ids(engine) == {f"train-{i}" for i in range(4)}

    # Datasets are immutable: the name cannot be taken again, an empty one is refused.
    with pytest.raises(Conflict), write_session(engine) as session:
        create_dataset(session, "sft-2026-12", RunFilter(), created_by=None, now=NOW)
    with pytest.raises(InvalidRequest, match="selects no runs"), write_session(engine) as session:
        create_dataset(session, "none", RunFilter(env_id="nope"), created_by=None, now=NOW)

    with write_session(engine) as session:
        drop_dataset(session, "sft-2026-12")
    apply(engine, plan(engine, [rule]))
    assert _run_ids(engine) == set()
    assert orphans(engine) == {}


def test_a_dataset_made_during_a_sweep_keeps_its_runs(engine: Engine) -> None:
    _store(engine, [f"r-{i}" for i in range(6)], age_days=60)
    planned = plan(engine, [Rule("all-old", max_age_s=parse_age("7d"))])
    assert len(planned.runs) == 6
    # After the plan, before the deletes: a trainer pins two of the planned runs.
    _pin(engine, "late", RunFilter(correlation_id=None, env_id="e", until=None))
    swept = apply(engine, planned, batch_size=4)
    assert swept.deleted == 0
    assert swept.pinned_meanwhile == 6
    assert len(_run_ids(engine)) == 6


def test_a_sweep_beside_live_ingest_deletes_exactly_the_plan(engine: Engine) -> None:
    before = [f"before-{i}" for i in range(120)]
    _store(engine, before)
    # (when its write began, when it was acknowledged, run_id): a run acknowledged before
    # the plan began must be in it; a run whose write began after the plan was made must
    # not. (Its acknowledgement time alone does not say: the writer can be paused between
    # its commit and reading the clock while the plan is made, and the failing test saw
    # it.)
    acked: list[tuple[float, float, str]] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def ingest() -> None:
        n = 0
        try:
            while not stop.is_set():
                run_id = f"live-{n}"
                began = time.monotonic()
                result = ingest_bytes(engine, _doc(run_id))
                assert result.status == "created"
                acked.append((began, time.monotonic(), run_id))  # acknowledged from here on
                n += 1
        except BaseException as exc:
            failures.append(exc)

    writer = threading.Thread(target=ingest)
    writer.start()
    try:
        while len(acked) < 10:
            time.sleep(0.01)
        # Keep nothing: every run the plan sees is selected, so the test sees any run the
        # sweep takes beyond its plan.
        started = time.monotonic()
        planned = plan(engine, [Rule("everything", keep_last=0)])
        planned_at = time.monotonic()
        swept = apply(engine, planned, batch_size=16)
        while len([a for a in acked if a[0] > planned_at]) < 10:  # began after the plan
            time.sleep(0.01)
    finally:
        stop.set()
        writer.join(timeout=60)
    assert failures == []
    plan_ids = {r.run_id for r in planned.runs}
    acked_before = {r for _began, t, r in acked if t < started} | set(before)
    began_after = {r for began, _t, r in acked if began > planned_at}
    assert acked_before <= plan_ids
    assert not (began_after & plan_ids)
    assert swept.deleted == len(plan_ids)
    assert swept.gone == 0
    with read_session(engine) as session:
        audit = {a["run_id"] for a in deletions(session, limit=100_000)}
    assert audit == plan_ids
    remaining = _run_ids(engine)
    assert remaining == {r for _began, _t, r in acked} - plan_ids
    assert began_after <= remaining
    assert orphans(engine) == {}


def test_a_sweep_never_deletes_a_run_stored_after_its_plan_under_a_reused_key(
    engine: Engine,
) -> None:
    # On SQLite a deleted run's primary key goes to the next run stored. A sweep planned
    # the newest run; before its batch, that run was deleted by hand and a new one stored
    # (with the same key there): the batch deleted the new run, by key, and its audit said
    # retention (found by exploratory QA). Two sweeps side by side did the same.
    _store(engine, [f"old-{i}" for i in range(5)], age_days=30)
    planned = plan(engine, [Rule("everything", keep_last=0)])
    second, newest = planned.runs[-2:]
    for run in (newest, second):  # deleted by hand after the plan
        with write_session(engine) as session:
            delete_run(session, run.run_id, Deletion(by="cli:op", via="cli"), NOW)
    # `second` posted again: a new run under the same run_id and, on SQLite, the same key:
    # only its ingest_seq tells it from the run planned. Then a new run under the key of
    # `newest` (on SQLite), another run_id.
    _store(engine, [second.run_id])
    _store(engine, ["new-after-plan"])
    with engine.connect() as conn:
        keys = {r.run_id: r.id for r in conn.execute(text("SELECT run_id, id FROM runs"))}
    if engine.dialect.name == "sqlite":  # the keys reused: what the test is about
        assert keys[second.run_id] == second.pk
        assert keys["new-after-plan"] == newest.pk
    swept = apply(engine, planned, batch_size=2)
    assert swept.deleted == 3
    assert swept.gone == 2
    assert _run_ids(engine) == {"new-after-plan", second.run_id}
    with read_session(engine) as session:
        audit = deletions(session, limit=100)
    for run in (newest, second):
        assert [a["deleted_by"] for a in audit if a["run_id"] == run.run_id] == ["cli:op"]
    assert all(a["run_id"] != "new-after-plan" for a in audit)
    assert orphans(engine) == {}


def test_an_interrupted_sweep_finishes_when_run_again(engine: Engine) -> None:
    _store(engine, [f"r-{i:02d}" for i in range(30)], age_days=10)
    rule = Rule("week", max_age_s=parse_age("7d"))
    calls = {"n": 0}

    def stop_after_two() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    first = apply(engine, plan(engine, [rule]), batch_size=7, should_stop=stop_after_two)
    assert first.deleted == 14
    assert len(_run_ids(engine)) == 16
    assert orphans(engine) == {}  # committed batches are whole
    second = apply(engine, plan(engine, [rule]), batch_size=7)
    assert second.deleted == 16
    assert _run_ids(engine) == set()
    with read_session(engine) as session:
        assert len(deletions(session, limit=1000)) == 30


def test_rules_are_stored_and_read_from_settings(engine: Engine, database: Database) -> None:
    with write_session(engine) as session:
        set_rule(session, Rule("a", keep_last=5, env_id="x"), NOW)
        set_rule(session, Rule("a", max_age_s=60.0), NOW)  # replaces
        set_rule(session, Rule("b", keep_last=1), NOW)
    with read_session(engine) as session:
        assert [(r.name, r.max_age_s, r.keep_last, r.env_id) for r in stored_rules(session)] == [
            ("a", 60.0, None, None),
            ("b", None, 1, None),
        ]
    settings = Settings(
        database_url=database.url,
        retention_rules=[
            RetentionRuleSetting(name="b", keep_last=99),  # the stored 'b' wins
            RetentionRuleSetting(name="c", max_age="2w", env_id="y"),
        ],
    )
    rules = all_rules(engine, settings)
    assert [(r.name, r.source, r.keep_last, r.max_age_s) for r in rules] == [
        ("a", "stored", None, 60.0),
        ("b", "stored", 1, None),
        ("c", "settings", None, 14 * 86400.0),
    ]
    with write_session(engine) as session:
        drop_rule(session, "a")
    with pytest.raises(InvalidRequest):
        Rule("no-limit")
    with pytest.raises(InvalidRequest):
        parse_age("soon")
    with pytest.raises(ValidationError, match="as a duration"):
        RetentionRuleSetting(name="x", max_age="soon")


def test_the_server_sweeps_on_a_schedule_only_when_asked(
    engine: Engine, database: Database
) -> None:
    _store(engine, [f"r-{i}" for i in range(5)], age_days=3)
    _pin(engine, "keep", RunFilter(correlation_id=None, env_id="e", until=NOW, since=None))
    _store(engine, ["unpinned"], age_days=3)
    rules = [RetentionRuleSetting(name="day", max_age="1d")]
    off = Settings(database_url=database.url, retention_rules=rules)
    assert off.retention_interval == 0
    with TestClient(create_app(off)):
        time.sleep(0.5)
    assert len(_run_ids(engine)) == 6  # off by default: nothing deleted
    on = off.model_copy(update={"retention_interval": 0.1})
    with TestClient(create_app(on)):
        deadline = time.monotonic() + 20
        while "unpinned" in _run_ids(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert _run_ids(engine) == {f"r-{i}" for i in range(5)}
    assert schedule.sweep_once(engine, on) is not None


def _auto_vacuum_off(engine: Engine) -> None:
    pooled = engine.raw_connection()
    try:
        raw = pooled.driver_connection
        assert raw is not None
        raw.execute("PRAGMA auto_vacuum=NONE")
        raw.execute("VACUUM")  # the mode changes with the VACUUM that follows
    finally:
        pooled.close()
    assert store_size(engine).mode == "none"


def test_a_sweep_gives_space_back(
    engine: Engine, database: Database, request: pytest.FixtureRequest
) -> None:
    ids = [f"big-{i}" for i in range(60)]
    # Random text: documents are stored compressed, and repeated text takes no room.
    docs = [json.dumps(minimal_rollout(r, note=secrets.token_hex(20_000))).encode() for r in ids]

    def fill() -> None:
        assert {r.status for r in ingest_many(engine, docs)} == {"created"}
        if engine.dialect.name == "sqlite":
            checkpoint()

    def checkpoint() -> None:
        # The WAL is copied into the file and emptied: the file's size is the store's.
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    if engine.dialect.name == "sqlite":
        vacuum(engine, incremental=True)  # later sweeps give pages back as they go
        assert store_size(engine).mode == "incremental"
        # The mode is the file's: the tests after this one share it (a later test's
        # `db vacuum` found it incremental and failed).
        request.addfinalizer(lambda: _auto_vacuum_off(engine))
    fill()
    full = store_size(engine).bytes
    swept = apply(engine, plan(engine, [Rule("all", keep_last=0)]), batch_size=20)
    assert swept.deleted == 60
    if engine.dialect.name == "sqlite":
        assert swept.vacuumed_pages > 0
        checkpoint()
        assert full > 1_000_000
        assert store_size(engine).bytes < full * 0.3
        assert store_size(engine).free_bytes == 0
    else:
        # PostgreSQL keeps its files; VACUUM makes the dead rows' room reusable, so the
        # same data again takes (almost) no more room.
        vacuum(engine)
        fill()
        assert store_size(engine).bytes < full * 1.1
    assert row_counts(engine)["runs"] == (0 if engine.dialect.name == "sqlite" else 60)


@pytest.fixture
def two_datasets(engine: Engine) -> None:
    _store(engine, ["a-1", "a-2"], env="a")
    _store(engine, ["b-1"], env="b")
    _pin(engine, "set-a", RunFilter(env_id="a"))
    _pin(engine, "set-all", RunFilter())


def test_dataset_manifests_say_what_is_still_there(engine: Engine, two_datasets: None) -> None:
    with read_session(engine) as session:
        assert dataset_run_ids(session, "set-a") == ["a-1", "a-2"]
        assert dataset_manifest(session, "set-all")["n_runs"] == 3
    from tracestore.store.deletion import Deletion, delete_run

    with write_session(engine) as session:
        delete_run(session, "a-1", Deletion("t", "cli", force=True), NOW)
    (audit,) = _audit_rows(engine)
    assert audit["pinned_by"] == ["set-a", "set-all"]
    ingest_bytes(engine, _doc("a-1", env="changed"))  # stored again, other content
    with read_session(engine) as session:
        m = dataset_manifest(session, "set-a")
    assert (m["present"], m["missing"], m["changed"]) == (1, 0, 1)


def _audit_rows(engine: Engine) -> list[dict[str, object]]:
    with read_session(engine) as session:
        return deletions(session)

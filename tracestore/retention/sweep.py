"""The retention sweep: which runs the rules select (the plan), and deleting them in
bounded batches, each its own transaction, beside live ingest.

The plan is read in one snapshot at one instant (`now`): a run acknowledged after it is
never in it, whatever the rules (a count rule keeps the newest runs *of the plan*). Each
batch then deletes the planned runs that still exist and are still unpinned, locking them
first (store/deletion.py), so a dataset made during the sweep keeps its runs. A killed
sweep has committed whole batches only; running it again plans again and finishes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine

from tracestore.db.uow import read_session, write_session
from tracestore.durations import parse_age
from tracestore.errors import InvalidRequest
from tracestore.retention.space import incremental_vacuum
from tracestore.settings import Settings
from tracestore.store.deletion import Deletion, delete_pks
from tracestore.store.retention import Rule, count_pinned, select_runs, stored_rules

DEFAULT_BATCH = 500


def settings_rules(settings: Settings) -> list[Rule]:
    """The rules given in TRACESTORE_RETENTION_RULES."""
    rules = []
    for given in settings.retention_rules:
        age = parse_age(given.max_age, name=f"rule {given.name}") if given.max_age else None
        rules.append(
            Rule(
                given.name,
                max_age_s=age,
                keep_last=given.keep_last,
                env_id=given.env_id,
                policy_id=given.policy_id,
                source="settings",
            )
        )
    return rules


def all_rules(engine: Engine, settings: Settings) -> list[Rule]:
    """The stored rules, then the settings' (a stored rule wins over a settings rule of
    the same name)."""
    with read_session(engine) as session:
        rules = stored_rules(session)
    names = {r.name for r in rules}
    return rules + [r for r in settings_rules(settings) if r.name not in names]


@dataclass(frozen=True, slots=True)
class Planned:
    """A run the sweep will delete, and the first rule that selected it."""

    pk: int
    run_id: str
    # With pk and run_id, the exact run planned: on SQLite a deleted run's pk is given to
    # the next run stored, so a pk alone may name a run stored after the plan.
    ingest_seq: int | None
    doc_bytes: int
    received_at: datetime
    rule: str


@dataclass(slots=True)
class Plan:
    """What the rules select at `now`, oldest first; pinned runs counted per rule."""

    now: datetime
    rules: list[Rule]
    runs: list[Planned] = field(default_factory=list)
    pinned: dict[str, int] = field(default_factory=dict)
    # Runs each rule selects, a run two rules select counted under both (it is deleted
    # once, under the first): counted only under the first, a later rule's figure fell
    # as soon as an earlier one took some of its runs (found by exploratory QA).
    selected: dict[str, int] = field(default_factory=dict)

    def by_rule(self) -> dict[str, int]:
        """The unpinned runs each rule selects (their sum may pass the plan's runs)."""
        return {r.name: self.selected.get(r.name, 0) for r in self.rules}

    def as_dict(self, *, runs: bool = True) -> dict[str, Any]:
        """The plan as JSON."""
        body: dict[str, Any] = {
            "now": self.now.isoformat(),
            "rules": [r.as_dict() for r in self.rules],
            "selected": len(self.runs),
            "selected_by_rule": self.by_rule(),
            "doc_bytes": sum(r.doc_bytes for r in self.runs),
            "pinned_skipped": self.pinned,
        }
        if runs:
            body["runs"] = [
                {"run_id": r.run_id, "received_at": r.received_at.isoformat(), "rule": r.rule}
                for r in self.runs
            ]
        return body


def plan(engine: Engine, rules: list[Rule], now: datetime | None = None) -> Plan:
    """What `rules` select at `now` (default: the present), read in one snapshot."""
    result = Plan(now or datetime.now(UTC), rules)
    seen: set[int] = set()
    with read_session(engine) as session:
        conn = session.connection()
        if conn.dialect.name == "postgresql":
            # One snapshot for every rule's query: what one rule sees, the next sees too.
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        for rule in rules:
            rows = select_runs(conn, rule, result.now)
            result.selected[rule.name] = len(rows)
            for row in rows:
                if row.id not in seen:
                    seen.add(row.id)
                    result.runs.append(
                        Planned(
                            row.id,
                            row.run_id,
                            row.ingest_seq,
                            row.doc_bytes,
                            row.received_at,
                            rule.name,
                        )
                    )
            result.pinned[rule.name] = count_pinned(conn, rule, result.now)
    result.runs.sort(key=lambda r: r.pk)
    return result


@dataclass(slots=True)
class Swept:
    """What a sweep did."""

    deleted: int = 0
    doc_bytes: int = 0
    batches: int = 0
    # Planned, but pinned by a dataset made during the sweep (left alone).
    pinned_meanwhile: int = 0
    # Planned, but already gone (deleted by someone else meanwhile).
    gone: int = 0
    vacuumed_pages: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The outcome as JSON."""
        return {
            "deleted": self.deleted,
            "doc_bytes": self.doc_bytes,
            "batches": self.batches,
            "pinned_meanwhile": self.pinned_meanwhile,
            "gone": self.gone,
            "vacuumed_pages": self.vacuumed_pages,
        }


def apply(
    engine: Engine,
    planned: Plan,
    *,
    batch_size: int = DEFAULT_BATCH,
    progress: Callable[[int], None] | None = None,
    vacuum: bool = True,
    should_stop: Callable[[], bool] | None = None,
) -> Swept:
    """Delete the planned runs, `batch_size` per transaction; `progress(n)` after each
    batch with the runs it handled. With `vacuum`, a SQLite store in incremental
    auto-vacuum mode gives its freed pages back to the file system after each batch."""
    if batch_size < 1:
        raise InvalidRequest("the batch size must be 1 or more")
    swept = Swept()
    runs = planned.runs
    for start in range(0, len(runs), batch_size):
        if should_stop is not None and should_stop():
            break
        batch = runs[start : start + batch_size]
        by_rule: dict[str, list[Planned]] = {}
        for run in batch:
            by_rule.setdefault(run.rule, []).append(run)
        with write_session(engine) as session:
            for rule, members in by_rule.items():
                how = Deletion(by=f"retention:{rule}", via="retention", reason=f"rule {rule}")
                exact = [(m.pk, m.run_id, m.ingest_seq) for m in members]
                outcome = delete_pks(session, exact, how, planned.now)
                swept.deleted += len(outcome.deleted)
                swept.doc_bytes += sum(int(d["doc_bytes"]) for d in outcome.deleted)
                swept.pinned_meanwhile += len(outcome.pinned)
                swept.gone += len(members) - len(outcome.deleted) - len(outcome.pinned)
        swept.batches += 1
        if vacuum:
            swept.vacuumed_pages += incremental_vacuum(engine)
        if progress is not None:
            progress(len(batch))
    return swept

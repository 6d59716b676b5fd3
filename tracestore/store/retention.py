"""Retention rules and the runs they select (issue 20). Functions take a session or a
connection and never commit; the sweep that deletes in batches is tracestore.retention.

A rule's scope is the runs of its env and policy (the list filters' meaning; none: every
run). It selects the runs of its scope received more than `max_age_s` ago, and those past
the newest `keep_last` (newest by key, as the list orders them): either limit is enough.
Pinned runs (store/datasets.py) are never selected; they are counted instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, union, update
from sqlalchemy.orm import Session

from tracestore.errors import InvalidRequest, NotFound
from tracestore.models import RetentionRule, Run
from tracestore.store.datasets import NAME, pinned_run_ids
from tracestore.store.runs import RunFilter, filtered
from tracestore.timewindow import EARLIEST


@dataclass(frozen=True, slots=True)
class Rule:
    """A retention rule, stored (`tracestore retention set`) or from the settings."""

    name: str
    max_age_s: float | None = None
    keep_last: int | None = None
    env_id: str | None = None
    policy_id: str | None = None
    source: str = "stored"  # or 'settings'

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise InvalidRequest(
                f"retention rule name {self.name!r} is not valid: letters, digits, '.', '_' "
                "and '-', starting with a letter or digit"
            )
        if self.max_age_s is None and self.keep_last is None:
            raise InvalidRequest(f"retention rule {self.name!r} needs a max age or a keep-last")
        if self.max_age_s is not None and self.max_age_s <= 0:
            raise InvalidRequest(f"retention rule {self.name!r}: the max age must be positive")
        if self.keep_last is not None and self.keep_last < 0:
            raise InvalidRequest(f"retention rule {self.name!r}: keep-last must be 0 or more")

    def as_dict(self) -> dict[str, Any]:
        """The rule as JSON."""
        return {
            "name": self.name,
            "max_age_s": self.max_age_s,
            "keep_last": self.keep_last,
            "env_id": self.env_id,
            "policy_id": self.policy_id,
            "source": self.source,
        }

    def scope(self, until: datetime | None = None) -> RunFilter:
        """The list filter of the rule's runs (received before `until`, when given)."""
        return RunFilter(env_id=self.env_id, policy_id=self.policy_id, until=until)


def stored_rules(session: Session) -> list[Rule]:
    """The rules stored in the database, by name."""
    rows = session.connection().execute(select(RetentionRule).order_by(RetentionRule.name))
    return [
        Rule(r.name, r.max_age_s, r.keep_last, r.env_id, r.policy_id, source="stored") for r in rows
    ]


def set_rule(session: Session, rule: Rule, now: datetime) -> None:
    """Store `rule`, replacing a stored rule of the same name."""
    conn = session.connection()
    values = {
        "max_age_s": rule.max_age_s,
        "keep_last": rule.keep_last,
        "env_id": rule.env_id,
        "policy_id": rule.policy_id,
        "updated_at": now,
    }
    done = conn.execute(
        update(RetentionRule).where(RetentionRule.name == rule.name).values(**values)
    )
    if not done.rowcount:
        conn.execute(insert(RetentionRule).values(name=rule.name, created_at=now, **values))


def drop_rule(session: Session, name: str) -> None:
    """Remove a stored rule (NotFound when there is none of that name)."""
    done = session.connection().execute(delete(RetentionRule).where(RetentionRule.name == name))
    if not done.rowcount:
        raise NotFound(f"no stored retention rule named {name!r}", name=name)


def age_cutoff(max_age_s: float, now: datetime) -> datetime:
    """The receive time before which a run is older than `max_age_s` at `now`; the
    calendar's start for an age further back than it goes (`--max-age 999999d`: such a
    rule selects nothing by age, where it broke every sweep with an OverflowError)."""
    try:
        return now - timedelta(seconds=max_age_s)
    except OverflowError:
        return EARLIEST


def _selected(rule: Rule, now: datetime) -> Any:
    """Keys of the runs `rule` selects at `now`, pinned ones included."""
    parts = []
    if rule.max_age_s is not None:
        cutoff = age_cutoff(rule.max_age_s, now)
        parts.append(filtered(select(Run.id), rule.scope(until=cutoff)))
    if rule.keep_last is not None:
        newest_first = filtered(select(Run.id), rule.scope()).order_by(Run.id.desc())
        parts.append(newest_first.offset(rule.keep_last))
    if len(parts) == 1:
        return parts[0].subquery()
    return union(*(p.subquery().select() for p in parts)).subquery()


def select_runs(conn: Connection, rule: Rule, now: datetime) -> list[Any]:
    """(id, run_id, ingest_seq, doc_bytes, received_at) of the unpinned runs `rule`
    selects at `now`, oldest first."""
    keys = _selected(rule, now)
    query = (
        select(Run.id, Run.run_id, Run.ingest_seq, Run.doc_bytes, Run.received_at)
        .where(Run.id.in_(select(keys.c[0])))
        .where(Run.run_id.not_in(pinned_run_ids()))
        .order_by(Run.id)
    )
    return list(conn.execute(query))


def count_pinned(conn: Connection, rule: Rule, now: datetime) -> int:
    """Runs `rule` would select at `now` but that a dataset pins."""
    keys = _selected(rule, now)
    query = (
        select(func.count())
        .select_from(Run)
        .where(Run.id.in_(select(keys.c[0])))
        .where(Run.run_id.in_(pinned_run_ids()))
    )
    return int(conn.execute(query).scalar_one())

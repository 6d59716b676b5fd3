"""Where an export cuts the store: its id, and a commit-ordered watermark on `ingest_seq`.

An incremental export takes the runs with `after <= ingest_seq < upto`, where `upto` is
a watermark below which no run can still appear: every run with a smaller sequence has
committed (or never will). The next export starts at this `upto`. A run committed after
an export therefore always lands in a later one, never in neither (issue 15: the cut on
`received_at` lost runs whose transaction committed after the cut but stamped before it).

* SQLite: `ingest_seq` is a counter that ingest assigns inside its write transaction
  (store/rollouts.py), and SQLite has one writer at a time, so values commit in the order
  they are handed out. The watermark is max + 1 of what has committed; a writer still
  open holds a larger value, so its runs go to the next export. Runs some other writer
  left without a value are sequenced first, under the write lock (`publish`).
* PostgreSQL: `ingest_seq` is the id of the transaction that wrote the run (the column's
  default). Transaction ids are handed out at a transaction's first write, not at
  commit, so a long transaction can commit a lower id later. The watermark is the
  oldest transaction id still in progress (`pg_snapshot_xmin` of a fresh snapshot):
  every transaction below it has ended, so no run below it can appear any more. A run
  whose transaction is still open stays above the watermark until it commits; the runs
  committed meanwhile by younger transactions wait with it (`held_back`). An open
  transaction delays an export; it can never make it miss a run.

Both are read in the process that writes the store, never next to DuckDB's SQLite
library (reports/live.py), and before DuckDB reads anything: what DuckDB reads later
holds every run below the watermark.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, text

from tracestore.db.engine import write_engine
from tracestore.errors import InvalidRequest
from tracestore.store.rollouts import MAX_INGEST_SEQ

SQLITE = "sqlite_counter"
POSTGRESQL = "postgresql_xact_id"
_SQLITE_UNSEQUENCED = text("SELECT 1 FROM runs WHERE ingest_seq IS NULL LIMIT 1")
_SQLITE_UPTO = text(f"SELECT ({MAX_INGEST_SEQ.text}) + 1")
_PG_WATERMARK = text("SELECT (pg_snapshot_xmin(pg_current_snapshot()))::text::bigint")
# The oldest transaction that holds the watermark back, for the notice (best effort: the
# columns of other users' sessions are hidden from a role without pg_read_all_stats).
_PG_OLDEST = text(
    "SELECT pid, xact_start FROM pg_stat_activity WHERE backend_xid IS NOT NULL "
    "ORDER BY age(backend_xid) DESC LIMIT 1"
)


@dataclass(frozen=True, slots=True)
class Cut:
    """Where one export cuts the store: runs with ingest_seq below `upto` are final."""

    store_id: str
    kind: str  # SQLITE or POSTGRESQL: how ingest_seq is assigned (never mix the two)
    upto: int
    # Runs already committed at or above `upto` (PostgreSQL: waiting for an older open
    # transaction to end); the next export takes them.
    held_back: int = 0
    notices: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The cut as stored in a manifest or lake state."""
        return {"store_id": self.store_id, "kind": self.kind, "upto": self.upto}


def store_id(conn: Connection) -> str:
    """The store's id (table store_identity, drawn by migration 0005)."""
    rows = conn.execute(text("SELECT store_id FROM store_identity")).scalars().all()
    if len(rows) != 1:
        raise InvalidRequest(
            f"the store has {len(rows)} rows in store_identity, not one: run "
            "'tracestore db upgrade' on a store from before revision 0005"
        )
    return str(rows[0])


def publish(conn: Connection) -> int:
    """Give a sequence to runs written without one (SQLite); returns how many.

    Ingest assigns it, so this finds nothing unless another writer (an older tracestore
    during an upgrade, a bulk loader) left rows without one. Runs in the caller's
    transaction, which must hold SQLite's write lock (BEGIN IMMEDIATE): the values are
    then commit-ordered like ingest's own.
    """
    if conn.dialect.name != "sqlite":
        return 0  # the column's default gives every PostgreSQL row its value
    ids = conn.execute(text("SELECT id FROM runs WHERE ingest_seq IS NULL ORDER BY id")).scalars()
    todo = list(ids)
    if not todo:
        return 0
    start = conn.execute(MAX_INGEST_SEQ).scalar_one()
    conn.execute(
        text("UPDATE runs SET ingest_seq = :seq WHERE id = :id"),
        [{"seq": start + 1 + i, "id": run_pk} for i, run_pk in enumerate(todo)],
    )
    return len(todo)


def take_cut(engine: Engine) -> Cut:
    """Sequence any unsequenced runs (SQLite), then read the store's id and watermark."""
    if engine.dialect.name == "sqlite":
        # A read transaction is enough: a writer still open holds max + 1 (or more), which
        # the watermark read here (max + 1 of what has committed) does not pass, so its
        # runs go to the next export. No waiting behind a long writer.
        with engine.connect() as conn:
            unsequenced = conn.execute(_SQLITE_UNSEQUENCED).first() is not None
            if not unsequenced:
                return Cut(store_id(conn), SQLITE, int(conn.execute(_SQLITE_UPTO).scalar_one()))
        # Rows without a value: sequenced under the write lock, the watermark read there.
        with write_engine(engine).begin() as conn:
            published = publish(conn)
            cut = Cut(store_id(conn), SQLITE, int(conn.execute(_SQLITE_UPTO).scalar_one()))
        if not published:
            return cut
        notice = f"{published} runs had no ingest sequence (written by another writer)"
        return Cut(cut.store_id, cut.kind, cut.upto, 0, (notice + ": sequenced now",))
    if engine.dialect.name != "postgresql":
        raise InvalidRequest(f"cannot export a {engine.dialect.name} store")
    with engine.connect() as conn:
        sid = store_id(conn)
        mark = int(conn.execute(_PG_WATERMARK).scalar_one())
        conn.rollback()
        # A later snapshot: runs committed between the two reads count as held back too.
        held = conn.execute(
            text("SELECT count(*) FROM runs WHERE ingest_seq >= :upto"), {"upto": mark}
        ).scalar_one()
        notices: tuple[str, ...] = ()
        if held:
            notices = (_held_back_notice(conn, int(held)),)
        conn.rollback()
    return Cut(sid, POSTGRESQL, mark, int(held), notices)


def _held_back_notice(conn: Connection, held: int) -> str:
    text_ = (
        f"{held} committed runs wait for an older transaction still open on the PostgreSQL "
        "server; the next export takes them"
    )
    try:
        row = conn.execute(_PG_OLDEST).first()
    except Exception:  # pg_stat_activity unreadable here: the count alone still helps
        return text_
    if row is not None and row.xact_start is not None:
        age = (datetime.now(UTC) - row.xact_start).total_seconds()
        text_ += f" (the oldest: pid {row.pid}, open for {age:.0f}s)"
    return text_

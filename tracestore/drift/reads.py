"""Legacy reads: which routes count, who read, and the in-memory tally flushed to the store.

Phase 3 of the migration waits until no client reads legacy trajectories
(docs/FORMAT.md §7); the API's observability middleware records each read here.
"""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime

from sqlalchemy import Engine, bindparam, select
from sqlalchemy.orm import Session

from tracestore.db.uow import write_session
from tracestore.models import Run
from tracestore.store.drift import ReadCount, upsert_legacy_reads

LEGACY_ROUTES = {
    "/v1/rollouts/{run_id}/trajectories": "trajectories",
    "/v1/rollouts/{run_id}": "rollout",
}
# Reads by this name are a person's look (or a caller that says nothing of itself): listed
# in phase 3, never counted against its gate (tracestore/api/clients.py).
UNATTRIBUTED = "anonymous"
_N_TRAJECTORIES = select(Run.n_trajectories).where(Run.run_id == bindparam("run_id"))


def has_trajectories(session: Session, run_id: str) -> bool:
    """Whether the stored run has trajectories: reading it whole is then a legacy read."""
    n = session.connection().execute(_N_TRAJECTORIES, {"run_id": run_id}).scalar()
    return bool(n)


class LegacyReadTracker:
    """Counts legacy reads in memory; `flush` adds them to the store with one upsert each.

    The request path only takes a lock and bumps a counter: no database write per GET.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, date, str], tuple[int, datetime]] = {}

    def record(self, client: str, route: str, at: datetime | None = None) -> None:
        """Count one read of `route` by `client`."""
        at = at or datetime.now(UTC)
        key = (client, at.date(), route)
        with self._lock:
            reads, last = self._pending.get(key, (0, at))
            self._pending[key] = (reads + 1, max(last, at))

    def pending(self) -> int:
        """Reads counted but not yet flushed."""
        with self._lock:
            return sum(reads for reads, _ in self._pending.values())

    def flush(self, engine: Engine) -> int:
        """Write the pending counts (one transaction); on failure they stay pending."""
        with self._lock:
            taken, self._pending = self._pending, {}
        if not taken:
            return 0
        counts = [ReadCount(c, d, r, n, last) for (c, d, r), (n, last) in taken.items()]
        try:
            with write_session(engine) as session:
                upsert_legacy_reads(session.connection(), counts)
        except Exception:
            # Put them back (merged with reads counted meanwhile) for the next flush.
            with self._lock:
                for key, (n, last) in taken.items():
                    reads, seen = self._pending.get(key, (0, last))
                    self._pending[key] = (reads + n, max(seen, last))
            raise
        return sum(c.reads for c in counts)

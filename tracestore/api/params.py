"""Parameters several routers share: the run_id path segment and time-window instants."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Path

# `:path` so that a run_id holding '/' (sent as %2F, which the server decodes before
# routing) still reaches its rollout. The routes under a run (/trace, /trajectories,
# /drift) are registered before the bare one, and ingest refuses run_ids that end in one
# of those suffixes (ingest/parse.py), so no id is ever ambiguous.
RUN_PATH = "/rollouts/{run_id:path}"

RunIdPath = Annotated[
    str,
    Path(description="The rollout's run_id (a '/' in it is sent as %2F).", min_length=1),
]

EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)


def instant(value: datetime | None) -> datetime | None:
    """A query's time as aware UTC: no zone reads as UTC; the calendar's ends are clamped."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        # 0001-01-01T00:00+14:00 lies before datetime.min in UTC (9999-12-31T23:59-14:00
        # after datetime.max): nothing is stored outside the calendar, so the end is exact.
        return EARLIEST if value.year == 1 else LATEST

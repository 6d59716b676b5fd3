"""Parameters several routers share: the run_id path segment and time-window instants."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Path
from starlette.convertors import Convertor, register_url_convertor


class RunIdConvertor(Convertor[str]):
    """Any run_id: '/' (sent as %2F, decoded before routing) and line breaks included.

    Starlette's `path` convertor is `.*`, which stops at a newline; run_ids may hold one.
    """

    regex = "(?s:.+)"

    def convert(self, value: str) -> str:
        """The path segment is the run_id."""
        return value

    def to_string(self, value: str) -> str:
        """The run_id is the path segment."""
        return value


register_url_convertor("run_id", RunIdConvertor())

# The routes under a run (/trace, /trajectories, /drift) are registered before the bare
# one, which would match them too, and ingest refuses run_ids that end in one of those
# suffixes (ingest/parse.py), so no id is ever ambiguous.
RUN_PATH = "/rollouts/{run_id:run_id}"

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

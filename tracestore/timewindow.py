"""The one time grammar of `since` / `until`, for every route, verb and report.

An ISO date or time (`2025-11-20`, `2025-11-20T12:00:00Z`; no zone means UTC) or a
duration back from now (`30m`, `12h`, `7d`, `2w`). Pure: the API, the command line and
the reports import it, and it imports none of them.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from tracestore.errors import InvalidRequest

EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)

_DURATION = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
WHEN_HELP = (
    "an ISO date or time (2025-11-20, 2025-11-20T12:00:00Z; no zone means UTC) "
    "or a duration back from now (30m, 12h, 7d, 2w)"
)


def as_utc(value: datetime) -> datetime:
    """`value` as aware UTC: no zone reads as UTC; the calendar's ends are clamped."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        # 0001-01-01T00:00+14:00 lies before datetime.min in UTC (9999-12-31T23:59-14:00
        # after datetime.max): nothing is stored outside the calendar, so the end is exact.
        return EARLIEST if value.year == 1 else LATEST


def _ago(amount: float, unit: str, now: datetime) -> datetime:
    try:
        return now - timedelta(**{_UNITS[unit]: amount})
    except OverflowError:
        # Further back than the calendar goes (e.g. 99999999w): its start, like an
        # ISO time before it.
        return EARLIEST


def parse_when(text: str, *, name: str = "time", now: datetime | None = None) -> datetime:
    """Parse an ISO date/time (naive means UTC) or a duration back from now, to aware UTC.

    InvalidRequest (naming `name`) for anything else.
    """
    duration = _DURATION.match(text)
    if duration is not None:
        return _ago(float(duration["n"]), duration["unit"], now or datetime.now(UTC))
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        hint = ""
        if _PLUS_AS_SPACE.search(text):
            # An unescaped '+' in a URL's query arrives as a space.
            hint = " (a '+' in a URL's query string is read as a space: write it %2B)"
        raise InvalidRequest(
            f"{name}: cannot read {text!r}{hint}: use {WHEN_HELP}", **{name: text}
        ) from None
    return as_utc(value)


# An offset whose '+' became a space: `2025-11-20T00:00:00 05:00`.
_PLUS_AS_SPACE = re.compile(r"\d \d{2}(?::?\d{2})?$")


def parse_optional(text: str | None, *, name: str, now: datetime | None = None) -> datetime | None:
    """parse_when for an optional parameter: None or "" (an empty form field) is not given."""
    if not text:
        return None
    return parse_when(text, name=name, now=now)


# The drift window's `days` (API and CLI alike): a month by default, at most ten years.
DEFAULT_WINDOW_DAYS = 30
MAX_WINDOW_DAYS = 3660


def check_order(since: datetime | None, until: datetime | None) -> None:
    """Refuse a window whose `since` is not before its `until` (it would select nothing)."""
    if since is not None and until is not None and since >= until:
        raise InvalidRequest(
            f"since ({since.isoformat()}) must be before until ({until.isoformat()})",
            since=since.isoformat(),
            until=until.isoformat(),
        )

"""Datetime forms seen on the wire (SPEC §2), parsed to aware UTC datetimes."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

# `datetime.datetime(2025, 11, 20, 11, 59, 59, 123456, tzinfo=datetime.timezone.utc)`:
# the Python repr that task apps built on the SDK's app factory emit.
# Greedy `args`: it gives the same split as a lazy one (`args` holds no letters, so it
# ends before the one comma followed by `tzinfo`, or before the closing parenthesis) at a
# third of the cost (a lazy one tried the rest of the pattern at every character).
_REPR = re.compile(r"^datetime\.datetime\((?P<args>[\d,\s]+)(?:,\s*tzinfo\s*=\s*(?P<tz>.*))?\)$")
_TZ_DELTA = re.compile(
    r"datetime\.timezone\(datetime\.timedelta\((?P<body>[^)]*)\)(?:,\s*'[^']*')?\)"
)


def _repr_tz(text: str | None) -> timezone | None:
    if text is None:
        return None
    text = text.strip()
    if text in ("datetime.timezone.utc", "timezone.utc", "UTC", "tzutc()"):
        return UTC
    match = _TZ_DELTA.fullmatch(text)
    if match is None:
        raise ValueError(f"unknown tzinfo {text!r}")
    kwargs: dict[str, float] = {}
    for part in match.group("body").split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part:
            key, _, value = part.partition("=")
            kwargs[key.strip()] = float(value)
        else:
            # Positional form timedelta(days, seconds, microseconds).
            order = ("days", "seconds", "microseconds")
            kwargs[order[len(kwargs)]] = float(part)
    return timezone(timedelta(**kwargs))


def _parse_repr(text: str) -> datetime | None:
    match = _REPR.match(text)
    if match is None:
        return None
    parts = match.group("args").split(",")
    try:
        args = list(map(int, parts))  # the usual case: no empty part
    except ValueError:  # a trailing comma: `datetime.datetime(2025, 1, 1,)`
        args = [int(a) for a in parts if a.strip()]
    if not 3 <= len(args) <= 7:
        raise ValueError(f"bad datetime repr {text!r}")
    tz = _repr_tz(match.group("tz"))
    return datetime(*args, tzinfo=tz)  # type: ignore[misc,arg-type]  # 3 to 7 ints, checked


def parse_datetime(value: object) -> datetime | None:
    """Parse any SPEC §2 datetime form to an aware UTC datetime; None for null or unparseable.

    Naive values are taken as UTC: producers write UTC without saying so.
    """
    if value is None or isinstance(value, bool):
        return None
    parsed: datetime | None
    try:
        if isinstance(value, int | float):
            if not math.isfinite(value):
                return None
            parsed = datetime.fromtimestamp(float(value), tz=UTC)
        elif isinstance(value, str):
            text = value.strip()
            if not text:
                return None
            parsed = _parse_repr(text) if text.startswith("datetime.") else None
            if parsed is None:
                if text.endswith(("Z", "z")):
                    text = text[:-1] + "+00:00"
                parsed = datetime.fromisoformat(text)
        else:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        # Inside the try: an instant at the edge of the calendar (0001-01-01T00:00+14:00)
        # overflows when moved to UTC; such a value types as null, like any unparseable one.
        return parsed.astimezone(UTC)
    except (ValueError, OverflowError, OSError, TypeError):
        return None


# A string written as a datetime: ISO 8601 with a time (`T` or a space) or the Python repr.
# Dates alone and other strings are left as text.
_DATETIME_TEXT = re.compile(r"^(?:datetime\.datetime\(|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2})")


@dataclass(frozen=True, slots=True)
class Instant:
    """A datetime string read as the instant it names: equal to every form of it."""

    at: datetime


def as_instant(value: object) -> object:
    """`value` as an Instant when it is a string in a SPEC §2 datetime form, else unchanged."""
    if isinstance(value, str) and _DATETIME_TEXT.match(value):
        parsed = parse_datetime(value)
        if parsed is not None:
            return Instant(parsed)
    return value


# The keys whose strings are datetimes (SPEC §2: `created_at`, `completed_at`, `started_at`,
# `timestamp` in the producers' documents): only there is another form the same value.
_TIME_KEYS = frozenset(("timestamp", "time", "date", "datetime"))
_TIME_SUFFIXES = ("_at", "_time", "_timestamp", "_date", "_datetime")


def names_a_time(key: object) -> bool:
    """Whether a member named `key` holds a datetime (`created_at`, `timestamp`, ...)."""
    return isinstance(key, str) and (key in _TIME_KEYS or key.endswith(_TIME_SUFFIXES))


def with_instants(value: object, key: object = None) -> object:
    """A parsed JSON value with every datetime string of a datetime member (`names_a_time`)
    read as its Instant (for comparing); `key` names the member `value` is. A datetime-like
    string elsewhere (an observation's text, a message) stays text: read as an instant, a
    changed value passed for the same."""

    # Iterative: documents nest up to 1,024 levels, past Python's recursion limit. A list
    # takes the key of the member holding it.
    def convert(item: object, key: object) -> object:
        if isinstance(item, dict):
            copy: dict[Any, object] = dict(item)
            stack.append((copy, key))
            return copy
        if isinstance(item, list):
            items = list(item)
            stack.append((items, key))
            return items
        return as_instant(item) if names_a_time(key) else item

    stack: list[tuple[dict[Any, object] | list[object], object]] = []
    root = convert(value, key)
    while stack:
        node, held_by = stack.pop()
        if isinstance(node, dict):
            for key, child in node.items():
                node[key] = convert(child, key)
        else:
            for index, child in enumerate(node):
                node[index] = convert(child, held_by)
    return root

"""Durations written as `30d`, `12h`, `2w`, read as seconds: retention ages (rules from the
CLI, the API and TRACESTORE_RETENTION_RULES alike)."""

from __future__ import annotations

import math
import re

from tracestore.errors import InvalidRequest

_AGE = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[smhdw])\s*$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
AGE_HELP = "a duration: 90s, 30m, 12h, 30d, 2w"


def parse_age(text: str, *, name: str = "max age") -> float:
    """Seconds of a duration (`30d`, `12h`, `2w`, `1.5d`); InvalidRequest otherwise."""
    found = _AGE.match(text)
    if found is None or float(found["n"]) <= 0:
        raise InvalidRequest(f"{name}: cannot read {text!r} as {AGE_HELP}")
    seconds = float(found["n"]) * _SECONDS[found["unit"]]
    if not math.isfinite(seconds):
        # Past a float's range: it was stored as infinity, shown as "older than infs"
        # and as null in JSON, like a rule with no age at all.
        raise InvalidRequest(f"{name}: {text!r} is too long a duration to be stored")
    return seconds

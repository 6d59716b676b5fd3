"""Settings read straight from the environment by the command line, outside `Settings`.

They matter only to a few verbs, so they are read where they are used, but a value that is
not what they take is refused in one line naming the variable: a typo must not quietly
become the default.
"""

from __future__ import annotations

import math
import os

from tracestore.errors import InvalidRequest


def env_seconds(name: str, default: float) -> float:
    """Seconds from the environment variable `name` (`default` when unset or empty; `inf`
    allowed); anything but a number of 0 or more is refused."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not seconds >= 0:  # also NaN
        raise InvalidRequest(
            f"{name} must be a number of seconds, 0 or more, or inf (got {text!r})"
        )
    return seconds

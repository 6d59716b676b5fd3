"""JSON serialization that accepts every document the parser accepts.

orjson parses nesting up to 1,024 levels but serializes only up to 254; a rollout with a
deeper (valid) value must not become a 500. Such values fall back to the standard library.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import orjson

# The stdlib encoder recurses once per level; parsed documents can be 1,024 levels deep.
if sys.getrecursionlimit() < 4000:
    sys.setrecursionlimit(4000)


def dumps(value: Any) -> bytes:
    """Compact JSON bytes of `value` (orjson, or the stdlib for very deep values)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(
            value, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()

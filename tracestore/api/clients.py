"""Who is calling: the name a read is counted under in /metrics and the migration gate.

- With API keys configured: the name of the caller's key (`name:key` in
  TRACESTORE_API_KEYS; a bare key is `key-1`, `key-2`, ... by its place in the list).
- Without keys: the label the client gives itself in `X-Tracestore-Client` (letters,
  digits, `.`, `_`, `-`, at most 64). Each process takes at most MAX_LABELS distinct
  labels; later ones, and labels that do not match, count as `other`. A key sent to a
  server without keys counts as `unknown-key` (never the key itself, nor a hash of it).
- A caller with neither, and a browser loading a page (Sec-Fetch-Mode: navigate), is
  `anonymous`: a person looking at a run, not a client consuming trajectories.

Label values are therefore bounded by configuration, never by what callers send.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from tracestore.api.deps import CLIENT_STATE
from tracestore.settings import ANONYMOUS, CLIENT_NAME, OTHER, RESERVED_CLIENTS, UNKNOWN_KEY

CLIENT_HEADER = "x-tracestore-client"
MAX_LABELS = 32
# Set (in the request's scope state) by GET /v1/rollouts/{run_id}: whether the run has
# trajectories, i.e. whether reading it is a legacy read.
LEGACY_STATE = "tracestore_legacy_read"


class ClientLabels:
    """The self-chosen labels one process accepts: the first MAX_LABELS valid ones."""

    def __init__(self, limit: int = MAX_LABELS) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def accept(self, label: str) -> str:
        """`label` when it is valid and among the first `limit`; `other` otherwise."""
        if not CLIENT_NAME.fullmatch(label) or label in RESERVED_CLIENTS:
            return OTHER
        with self._lock:
            if label in self._seen:
                return label
            if len(self._seen) >= self.limit:
                return OTHER
            self._seen.add(label)
            return label


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1")).strip()
    return None


def reader(scope: Mapping[str, Any], labels: ClientLabels) -> str:
    """The name a request is counted under (see the module docstring)."""
    if (_header(scope, b"sec-fetch-mode") or "").lower() == "navigate":
        return ANONYMOUS
    named = scope.get("state", {}).get(CLIENT_STATE)
    if isinstance(named, str):
        return named
    label = _header(scope, CLIENT_HEADER.encode())
    if label:
        return labels.accept(label)
    if _header(scope, b"x-api-key") or _header(scope, b"authorization"):
        return UNKNOWN_KEY
    return ANONYMOUS


def counts_as_client(name: str) -> bool:
    """Whether reads under `name` count as a client's (the phase-3 gate); anonymous don't."""
    return name != ANONYMOUS

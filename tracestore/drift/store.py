"""Stored drift findings: computed before the ingest transaction, written inside it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection


def drift_rows(doc: Mapping[str, Any]) -> Any:
    """The drift rows of a validated rollout (pure); written later by write_drift."""
    return None


def write_drift(conn: Connection, run_pk: int, rows: Any) -> None:
    """Insert a rollout's drift rows in the caller's transaction."""
    return None

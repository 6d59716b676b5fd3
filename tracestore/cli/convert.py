"""`tracestore convert` and `tracestore backfill`."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the conversion verbs to the console script."""

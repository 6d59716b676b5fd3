"""`tracestore report`, `sql`, `export`: DuckDB analytics from the command line."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the analytics verbs to the console script."""

"""`tracestore drift`: the drift report and migration gates from the command line."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the drift verbs to the console script."""

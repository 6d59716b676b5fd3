"""Back-pressure: bounded request bytes in flight per worker (503 with Retry-After past it)."""

from __future__ import annotations

from fastapi import FastAPI

from tracestore.settings import Settings


def install(app: FastAPI, settings: Settings) -> None:
    """Add the in-flight bound to `app`."""

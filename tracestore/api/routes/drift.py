"""Drift routes (/v1/rollouts/{run_id}/drift, /v1/drift, /v1/migration/status) and reports."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

# Routes under /v1 need an API key when keys are configured; `public` ones do not.
router = APIRouter(prefix="/v1", tags=["drift"])
public = APIRouter(tags=["reports"])


def install(app: FastAPI) -> None:
    """Add what the drift service needs beyond routes (middleware, startup work)."""

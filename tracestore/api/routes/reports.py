"""Named DuckDB reports over HTTP (/v1/reports)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/v1", tags=["reports"])

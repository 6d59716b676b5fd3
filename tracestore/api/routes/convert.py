"""Served reads across formats (/trace, /trajectories) and POST /v1/convert."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/v1", tags=["convert"])

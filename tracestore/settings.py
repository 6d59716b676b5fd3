"""Service settings: one pydantic-settings class, read from TRACESTORE_* variables."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///./tracestore.db"
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


class Settings(BaseSettings):
    """Configuration of one tracestore process (API, CLI or tests)."""

    model_config = SettingsConfigDict(env_prefix="TRACESTORE_", extra="ignore")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL, description="SQLAlchemy URL of the store."
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated API keys; when set, every /v1 route requires one.",
    )
    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES,
        gt=0,
        description="Largest accepted request body, after decompression.",
    )
    max_inflight_bytes: int = Field(
        default=4 * DEFAULT_MAX_BODY_BYTES,
        gt=0,
        description=(
            "Most request-body bytes (as declared or received) held by requests in flight "
            "in one worker; past it new requests get 503 with Retry-After."
        ),
    )
    drift_budget: float = Field(
        default=0.001,
        ge=0,
        le=1,
        description="Phase 2 gate: the largest acceptable drift rate over comparable runs.",
    )
    max_batch_items: int = Field(
        default=10_000, gt=0, description="Most rollouts accepted in one batch request."
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        # The variable is a plain comma-separated list, not JSON.
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

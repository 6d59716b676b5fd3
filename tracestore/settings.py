"""Service settings: one pydantic-settings class, read from TRACESTORE_* variables."""

from __future__ import annotations

import re
from typing import Annotated, NamedTuple

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///./tracestore.db"
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# A client's name (`name:key` in TRACESTORE_API_KEYS) or self-chosen label
# (X-Tracestore-Client): short, and safe as a Prometheus label value and in a page.
CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Labels tracestore gives callers itself; no client may take one as its name.
ANONYMOUS = "anonymous"  # no key, no label: a person looking, or an unlabelled client
OTHER = "other"  # a label past the limit, or not matching CLIENT_NAME
UNKNOWN_KEY = "unknown-key"  # a key presented to a server that has none configured
RESERVED_CLIENTS = frozenset({ANONYMOUS, OTHER, UNKNOWN_KEY})


class ApiClient(NamedTuple):
    """A configured API key and the name its requests are counted under."""

    name: str
    key: str


def parse_api_keys(entries: list[str]) -> list[ApiClient]:
    """`name:key` entries keep their name; a bare `key` is named by its place, key-1 ..."""
    clients = []
    for number, entry in enumerate(entries, start=1):
        name, sep, key = entry.partition(":")
        if sep and CLIENT_NAME.fullmatch(name):
            clients.append(ApiClient(name, key))
        else:
            clients.append(ApiClient(f"key-{number}", entry))
    return clients


class Settings(BaseSettings):
    """Configuration of one tracestore process (API, CLI or tests)."""

    model_config = SettingsConfigDict(env_prefix="TRACESTORE_", extra="ignore")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL, description="SQLAlchemy URL of the store."
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description=(
            "Comma-separated API keys, each `key` or `name:key`; when set, every /v1 route, "
            "every HTML page and /metrics require one. Reads are counted per key name."
        ),
    )
    metrics_public: bool = Field(
        default=False,
        description="Serve /metrics without a key even when API keys are set (for scrapers).",
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
    max_parsed_bytes: int = Field(
        default=6 * DEFAULT_MAX_BODY_BYTES,
        gt=0,
        description=(
            "Largest size a request body may take once parsed, estimated as it streams in "
            'from its `{`, `[`, `,`, `"` and `.` (real rollouts take 4-6 bytes per byte; '
            "a body of empty objects 24); past it, 413."
        ),
    )
    db_pool_size: int = Field(
        default=8,
        gt=0,
        description=(
            "Database connections per worker process for requests that read; ingest requests "
            "have TRACESTORE_DB_WRITE_CONNECTIONS of their own, /health and /metrics one each."
        ),
    )
    db_write_connections: int = Field(
        default=4, gt=0, description="Database connections per worker process for ingest."
    )
    db_wait: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds a request waits for a database connection; past it, 503 database_busy "
            "with Retry-After."
        ),
    )
    max_header_bytes: int = Field(
        default=32 * 1024,
        ge=1024,
        description="Largest request line plus headers; past it, 431 and the connection closes.",
    )
    header_timeout: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds a connection may take to send a request's line and headers (and an idle "
            "new connection its first byte); past it, 408 and the connection closes."
        ),
    )
    body_timeout: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Longest wait, in seconds, for the next piece of a request body; past it, 408 "
            "request_timeout and the request's in-flight bytes are released."
        ),
    )
    body_min_rate: int = Field(
        default=64 * 1024,
        ge=0,
        description=(
            "Slowest average body rate, in bytes per second, accepted once a body has taken "
            "TRACESTORE_BODY_TIMEOUT seconds; slower uploads are cut with 408 (0: no floor)."
        ),
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        # The variable is a plain comma-separated list, not JSON.
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, value: list[str]) -> list[str]:
        clients = parse_api_keys(value)
        for client in clients:
            if not client.key:
                raise ValueError(f"the key named {client.name!r} is empty")
            if client.name in RESERVED_CLIENTS:
                raise ValueError(f"{client.name!r} is reserved: name the key otherwise")
        for attr in ("name", "key"):
            seen = [getattr(c, attr) for c in clients]
            if len(set(seen)) != len(seen):
                raise ValueError(f"two API keys have the same {attr}")
        return value

    def api_clients(self) -> list[ApiClient]:
        """The configured keys with their names."""
        return parse_api_keys(self.api_keys)

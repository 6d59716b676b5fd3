"""Service settings: one pydantic-settings class, read from TRACESTORE_* variables."""

from __future__ import annotations

import re
from typing import Annotated, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tracestore.durations import parse_age
from tracestore.errors import InvalidRequest

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


# What a key may do (`name:key:role`): `write` reads and ingests (a key without a role,
# as before roles existed); `admin` also deletes runs and reads the deletion audit.
ROLE_WRITE = "write"
ROLE_ADMIN = "admin"
ROLES = (ROLE_WRITE, ROLE_ADMIN)


class ApiClient(NamedTuple):
    """A configured API key, the name its requests are counted under, and its role.

    `whole`: the whole text of an entry read as `name:key[:role]`, kept as a key of its
    own (see parse_api_keys).
    """

    name: str
    key: str
    role: str = ROLE_WRITE
    whole: bool = False


def parse_api_keys(entries: list[str]) -> list[ApiClient]:
    """`name:key` entries keep their name; a bare `key` is named by its place, key-1 ...

    `name:key:role` gives the key a role (ROLES); without one it is `write`. The whole text
    of such an entry is a key too, as a bare key is (named by its place, role `write`):
    the contract's keys are comma-separated text, and one holding a colon was refused.
    """
    clients = []
    for number, entry in enumerate(entries, start=1):
        name, sep, key = entry.partition(":")
        if sep and CLIENT_NAME.fullmatch(name):
            rest, colon, role = key.rpartition(":")
            if colon and rest and role in ROLES:
                clients.append(ApiClient(name, rest, role))
            else:
                clients.append(ApiClient(name, key))
            # Never more than `write`, nor counted under the name: read as one opaque key,
            # the "name" would be part of the secret, and its ":admin" not a grant.
            clients.append(ApiClient(f"key-{number}", entry, whole=True))
        else:
            clients.append(ApiClient(f"key-{number}", entry))
    return clients


class RetentionRuleSetting(BaseModel):
    """A retention rule given in TRACESTORE_RETENTION_RULES (a JSON list of these)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    max_age: str | None = Field(default=None, description="A duration: 30d, 12h, 2w.")
    keep_last: int | None = Field(default=None, ge=0)
    env_id: str | None = None
    policy_id: str | None = None

    @field_validator("max_age")
    @classmethod
    def _check_age(cls, value: str | None) -> str | None:
        # Checked at startup, as the sweep will read it (a ValueError for pydantic).
        if value is not None:
            try:
                parse_age(value)
            except InvalidRequest as exc:
                raise ValueError(exc.message.removeprefix("max age: ")) from None
        return value


class Settings(BaseSettings):
    """Configuration of one tracestore process (API, CLI or tests)."""

    model_config = SettingsConfigDict(env_prefix="TRACESTORE_", extra="ignore")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL, description="SQLAlchemy URL of the store."
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description=(
            "Comma-separated API keys, each `key` or `name:key` (whose whole text is "
            "accepted too); when set, every /v1 route, every HTML page and /metrics require "
            "one. Reads are counted per key name."
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
        default=400 * 1024 * 1024,
        gt=0,
        description=(
            "Most memory one request body may take to ingest (its bytes, parsed value and "
            "stored copies), estimated as it streams in from its characters (real rollouts "
            "~17 bytes per byte, empty objects 75: tracestore/api/body.py); past it, 413. "
            "The default keeps a worker under 512 MiB, twice the default in-flight limit."
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
    opentelemetry: bool = Field(
        default=False,
        description=(
            "FastAPI's native OpenTelemetry spans, metrics and logs, through the providers "
            "configured globally (e.g. by opentelemetry-instrument). Off by default: "
            "tracestore's own metrics are on /metrics, and FastAPI's check for providers "
            "cost ~4% of a small post's CPU on every request."
        ),
    )
    group_commit_wait_ms: float = Field(
        default=2.0,
        ge=0,
        description=(
            "Group commit of single posts (tracestore/ingest/group.py): the longest a group "
            "about to be written waits for posts still arriving, or for the clients of the "
            "group just answered to post again, in milliseconds. A lone post waits for "
            "nobody."
        ),
    )
    group_commit_max_rollouts: int = Field(
        default=64,
        gt=0,
        # A group's look-up names each run_id as one SQLite parameter: 999 is the fewest
        # any SQLite allows a statement (its limit before 3.32), so every group fits.
        le=999,
        description=(
            "Most single posts sharing one transaction (1: each post alone; at most 999)."
        ),
    )

    retention_rules: list[RetentionRuleSetting] = Field(
        default_factory=list,
        description=(
            "Retention rules besides those stored with `tracestore retention set`: a JSON "
            'list of {"name", "max_age", "keep_last", "env_id", "policy_id"}.'
        ),
    )
    retention_interval: float = Field(
        default=0,
        ge=0,
        description=(
            "Seconds between the server's retention sweeps; 0 (the default): the server "
            "never sweeps (run `tracestore retention apply` instead)."
        ),
    )
    retention_batch_size: int = Field(
        default=500, gt=0, description="Runs deleted per transaction by a retention sweep."
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        # The variable is a plain comma-separated list, not JSON.
        if isinstance(value, str):
            keys = [k.strip() for k in value.split(",") if k.strip()]
            if value.strip() and not keys:
                # Set, yet holding only separators (a templated secret that came out
                # empty): read as no keys, the server was open without a word.
                raise ValueError("it holds no key, only commas: give keys, or leave it empty")
            return keys
        return value

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, value: list[str]) -> list[str]:
        clients = parse_api_keys(value)
        for client in clients:
            if client.whole:
                continue  # checked as the named key it was read as
            if not client.key:
                raise ValueError(f"the key named {client.name!r} is empty")
            # A key may hold colons, so `name:key:Admin` read as the key `key:Admin` with
            # the write role, and the intended key was refused (found by exploratory QA).
            # A role spelled in other letter case is taken for the typo it is.
            role = client.key.rpartition(":")[2]
            if ":" in client.key and role.lower() in ROLES:
                raise ValueError(
                    f"the key named {client.name!r} ends in ':{role}', a role's name, that "
                    "is not read as its role: write NAME:KEY:ROLE with a NAME of letters, "
                    f"digits, '.', '_' or '-' and a ROLE of {' or '.join(ROLES)}, lower-case"
                )
            if client.name in RESERVED_CLIENTS:
                raise ValueError(f"{client.name!r} is reserved: name the key otherwise")
        names = [c.name for c in clients]
        if len(set(names)) != len(names):
            raise ValueError("two API keys have the same name")
        keys = [c.key for c in clients]
        if len(set(keys)) != len(keys):
            raise ValueError("two API keys have the same key")
        return value

    def api_clients(self) -> list[ApiClient]:
        """The configured keys with their names."""
        return parse_api_keys(self.api_keys)

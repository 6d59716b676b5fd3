"""Dependencies: the app's state (settings, engine), sessions, API-key auth."""

from __future__ import annotations

import base64
import hmac
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tracestore.api.overload import Lanes
from tracestore.api.pages.session import session_client
from tracestore.errors import Forbidden, Unauthorized
from tracestore.settings import ANONYMOUS, CLIENT_NAME, ROLE_ADMIN, ApiClient, Settings

# Where the auth dependency leaves the name of the client a valid key belongs to (in the
# request's scope state: the middleware counting legacy reads reads it there).
CLIENT_STATE = "tracestore_client"
# ... and the role of that key (settings.ROLES).
ROLE_STATE = "tracestore_role"


if TYPE_CHECKING:
    # api/observability imports api/clients, which imports this module.
    from tracestore.api.observability import Observability


@dataclass(slots=True)
class AppState:
    """What every request needs: settings, the engine, and what the app counts."""

    settings: Settings
    engine: Engine
    observability: Observability
    # Database connections in bounded time, by kind of request (api/overload.py).
    lanes: Lanes


# Dependencies that do no I/O are `async def`: FastAPI runs a plain `def` dependency in the
# thread pool, and each hop there costs more than the work (bench/README.md).


async def get_state(request: Request) -> AppState:
    """The app's state."""
    state: AppState = request.app.state.tracestore
    return state


StateDep = Annotated[AppState, Depends(get_state)]


async def get_read_session(state: StateDep) -> AsyncIterator[Session]:
    """A read-only session for the request, once a read slot is free (else 503
    database_busy); it connects at its first query, on PostgreSQL in autocommit: no
    BEGIN/ROLLBACK round trips (api/overload.py `reading`)."""
    async with state.lanes.reads.session() as session:
        yield session


ReadSessionDep = Annotated[Session, Depends(get_read_session)]


async def get_metrics_session(state: StateDep) -> AsyncIterator[Session]:
    """A read-only session on /metrics' own connection: never behind the request pool."""
    async with state.lanes.metrics.session() as session:
        yield session


MetricsSessionDep = Annotated[Session, Depends(get_metrics_session)]


@asynccontextmanager
async def analytics_slots(state: AppState) -> AsyncIterator[None]:
    """Hold one of this process's analytics children, then a read slot, for a report
    (which reaches the store through its own connections, in the child); both waits
    together take at most the lanes' wait.

    In that order: reports queued behind the two running used to hold a read slot each
    while they waited, and eight of them took every slot the store's other readers
    (trainers' look-ups, fetches) had: those waited `TRACESTORE_DB_WAIT`, then 503."""
    lanes = state.lanes
    started = time.monotonic()
    async with lanes.analytics.slot():
        left = max(lanes.reads.wait - (time.monotonic() - started), 0.0)
        async with lanes.reads.slot(left):
            yield


def presented_key(request: Request) -> str | None:
    """The key from `X-API-Key`, `Authorization: Bearer`, or the password of
    `Authorization: Basic` (what a browser sends after asking for it)."""
    key = request.headers.get("x-api-key")
    if key:
        return key
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and token:
        return token
    if scheme.lower() == "basic" and token:
        try:
            _user, sep, password = base64.b64decode(token, validate=True).decode().partition(":")
        except ValueError:  # binascii.Error, UnicodeDecodeError, non-ASCII text
            return None
        return password if sep and password else None
    return None


def identify_client(presented: str, clients: Sequence[ApiClient]) -> ApiClient | None:
    """The configured key `presented` is (name, key, role), compared in constant time."""
    given = presented.encode()
    found = None
    for client in clients:
        # Compare against all keys (no early exit): timing says nothing about which matched.
        if hmac.compare_digest(given, client.key.encode()):
            found = client
    return found


def identify(presented: str, clients: Sequence[ApiClient]) -> str | None:
    """The name of the configured key `presented` is, compared in constant time; or None."""
    client = identify_client(presented, clients)
    return None if client is None else client.name


def key_is_valid(presented: str, keys: list[str]) -> bool:
    """Constant-time check of a key against every configured key."""
    return identify(presented, [ApiClient(str(i), key) for i, key in enumerate(keys)]) is not None


def check_key(request: Request, settings: Settings) -> None:
    """Refuse the request (401) when keys are configured and none valid is presented;
    remember whose key it was (CLIENT_STATE)."""
    if not settings.api_keys:
        return
    presented = presented_key(request)
    if presented is None:
        if session_client(request, settings) is not None:
            # A browser signed in on /login (api/pages/session.py): a person, not a client.
            request.scope.setdefault("state", {})[CLIENT_STATE] = ANONYMOUS
            return
        raise Unauthorized("an API key is required: send X-API-Key or Authorization: Bearer")
    client = identify_client(presented, settings.api_clients())
    if client is None:
        raise Unauthorized("the API key is not valid")
    request.scope.setdefault("state", {})[CLIENT_STATE] = client.name
    request.scope["state"][ROLE_STATE] = client.role


async def require_api_key(request: Request, state: StateDep) -> None:
    """Refuse the request (401) when keys are configured and none valid is presented."""
    check_key(request, state.settings)


async def require_admin(request: Request, state: StateDep) -> str:
    """Refuse the request unless keys are off or its key has the admin role (401 without a
    valid key, 403 with another role); returns who asks, for the audit."""
    settings = state.settings
    # The admin routes: deleting runs, and reading the deletion audit (a GET).
    what = "reading the deletion audit" if request.method in ("GET", "HEAD") else "deleting"
    if not settings.api_keys:
        # An open server (no keys): anyone may delete, as anyone may write; the audit
        # records the label the client gives, if any.
        label = request.headers.get("x-tracestore-client", "")
        return label if CLIENT_NAME.fullmatch(label) else ANONYMOUS
    if presented_key(request) is None:
        # A browser's session cookie only reads: deleting needs the key itself.
        raise Unauthorized(f"{what} needs an API key with the admin role: send X-API-Key")
    check_key(request, settings)
    scope_state = request.scope.get("state", {})
    if scope_state.get(ROLE_STATE) != ROLE_ADMIN:
        raise Forbidden(
            f"the API key {scope_state.get(CLIENT_STATE)!r} has the role "
            f"{scope_state.get(ROLE_STATE)!r}; {what} needs a key with the admin role "
            "(TRACESTORE_API_KEYS entry NAME:KEY:admin)"
        )
    name: str = scope_state[CLIENT_STATE]
    return name


AdminDep = Annotated[str, Depends(require_admin)]


async def require_metrics_key(request: Request, state: StateDep) -> None:
    """As require_api_key, unless TRACESTORE_METRICS_PUBLIC opens /metrics to scrapers."""
    if not state.settings.metrics_public:
        check_key(request, state.settings)

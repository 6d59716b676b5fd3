"""Dependencies: the app's state (settings, engine), sessions, API-key auth."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from tracestore.errors import Unauthorized
from tracestore.settings import Settings


@dataclass(slots=True)
class AppState:
    """What every request needs: settings and the engine."""

    settings: Settings
    engine: Engine


# Dependencies that do no I/O are `async def`: FastAPI runs a plain `def` dependency in the
# thread pool, and each hop there costs more than the work (bench/README.md).


async def get_state(request: Request) -> AppState:
    """The app's state."""
    state: AppState = request.app.state.tracestore
    return state


StateDep = Annotated[AppState, Depends(get_state)]


def _end(session: Session) -> None:
    session.rollback()  # a read session never writes
    session.close()


async def get_read_session(state: StateDep) -> AsyncIterator[Session]:
    """A read-only session for the request; it connects at its first query."""
    session = Session(state.engine, expire_on_commit=False)  # no I/O yet
    try:
        yield session
    finally:
        # Rolling back and returning the connection is I/O: off the event loop.
        await run_in_threadpool(_end, session)


ReadSessionDep = Annotated[Session, Depends(get_read_session)]


def presented_key(request: Request) -> str | None:
    """The key from `X-API-Key` or `Authorization: Bearer`."""
    key = request.headers.get("x-api-key")
    if key:
        return key
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def key_is_valid(presented: str, keys: list[str]) -> bool:
    """Constant-time check of a key against every configured key."""
    given = presented.encode()
    ok = False
    for key in keys:
        # Compare against all keys (no early exit): timing says nothing about which matched.
        ok |= hmac.compare_digest(given, key.encode())
    return ok


async def require_api_key(request: Request, state: StateDep) -> None:
    """Refuse the request (401) when keys are configured and none valid is presented."""
    keys = state.settings.api_keys
    if not keys:
        return
    presented = presented_key(request)
    if presented is None:
        raise Unauthorized("an API key is required: send X-API-Key or Authorization: Bearer")
    if not key_is_valid(presented, keys):
        raise Unauthorized("the API key is not valid")

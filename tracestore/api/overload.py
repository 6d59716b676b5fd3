"""Graceful overload: database connections are handed out on the event loop, in bounded time.

Sync routes run in Starlette's thread pool (anyio's 40 threads). When requests waited for a
pooled connection *inside* those threads, a flood filled every thread with waiters while
the step that gives a connection back, itself run in a thread, waited for a free one:
nothing moved until SQLAlchemy's pool timeout (30 s), and then every waiter failed with a
500. Abandoned requests stayed queued and ran their queries for nobody.

Here a request takes a *slot* of a lane before it touches the database. It waits for the
slot on the event loop (holding no thread) for at most `TRACESTORE_DB_WAIT` seconds, else
503 `database_busy` with `Retry-After`. A lane never has more slots than connections
waiting for it, so a request holding a slot gets its connection at once. The lanes:

- `reads`: every route that reads the store (`TRACESTORE_DB_POOL_SIZE` slots);
- `writes`: ingest (`TRACESTORE_DB_WRITE_CONNECTIONS` slots), so no flood of readers
  starves producers, nor a flood of producers the readers;
- `health` (/health, /info) and `metrics` (/metrics): one slot each, on a small engine and
  threads of their own: the cheap routes never wait behind the pool or the thread pool;
- `analytics`: not connections but this process's two analytics children (DuckDB, one
  report each); a report waits for one before it takes a read slot, so reports queued
  behind the running ones hold neither read slots nor threads.

Connections go back through the lane's own threads, never queued behind requests, and
shielded from cancellation. `AbandonedRequests` cancels a body-less request (every GET)
whose client has gone: it stops waiting for its slot at once, or, when its query is
already running, gives its connection back as soon as the query ends.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar, TypeVarTuple

import anyio
import anyio.to_thread
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tracestore.db.engine import create_engine
from tracestore.reports.live import WORKERS as ANALYTICS_CHILDREN
from tracestore.settings import Settings

log = logging.getLogger("tracestore.api")

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

# Seconds a client should wait after a 503 database_busy.
BUSY_RETRY_AFTER = 1
# The lane of the reports' analytics children (Lanes.analytics).
ANALYTICS_LANE = "analytics"
# Connections of the main pool outside the lanes: the store's own background work (the
# legacy-read flush, the drift page's flush, SQL fallbacks of reports) never waits for a
# request's slot, and requests never wait for it.
SPARE_CONNECTIONS = 2
# Status recorded (in the metrics) for a request whose client left before its answer:
# nginx's "client closed request". Nothing is sent: there is nobody to send it to.
CLIENT_CLOSED = 499


class DatabaseBusy(Exception):
    """No database connection came free within the wait: 503 database_busy."""

    def __init__(self, lane: str, waited: float) -> None:
        what = "analytics process" if lane == ANALYTICS_LANE else f"{lane} connection"
        super().__init__(f"no {what} came free within {waited:g} s")
        self.lane = lane
        self.waited = waited


def reading(engine: Engine) -> Engine:
    """The engine read sessions use: `engine`, on PostgreSQL in autocommit.

    A read session sends only SELECTs, and under PostgreSQL's READ COMMITTED each one
    already sees its own snapshot inside a transaction: autocommit reads the same rows
    without the BEGIN and ROLLBACK round trips around them (psycopg sends neither, and
    giving the connection back sends nothing). SQLite keeps its deferred transaction (one
    WAL snapshot for all of a session's statements; BEGIN costs no round trip there).
    """
    if (
        engine.dialect.name == "postgresql"
        and engine.get_execution_options().get("isolation_level") != "AUTOCOMMIT"
    ):
        return engine.execution_options(isolation_level="AUTOCOMMIT")
    return engine


@contextmanager
def read_session(engine: Engine) -> Iterator[Session]:
    """A read session as a lane hands it out (`reading`), ended as a lane ends it: what
    the API's reads run on, outside a server (benchmarks, tests). Pass an engine `reading`
    gave to spare making its autocommit copy each time."""
    session = Session(reading(engine), expire_on_commit=False)
    try:
        yield session
    finally:
        _end(session)


class Lane:
    """A share of database connections, handed out in turn on the event loop."""

    def __init__(
        self, name: str, engine: Engine, slots: int, wait: float, *, reads: bool = False
    ) -> None:
        self.name = name
        self.engine = engine
        # Sessions of a lane of reads: on PostgreSQL in autocommit (`reading`).
        self.session_engine = reading(engine) if reads else engine
        self.slots = slots
        self.wait = wait
        self._free = anyio.Semaphore(slots)
        # The lane's own threads, one per slot: its work and its connections' return
        # never queue behind other requests for a thread.
        self._threads = anyio.CapacityLimiter(slots)

    @property
    def free(self) -> int:
        """Slots free now (a `slot()` entered right after a positive answer takes one at
        once: nothing comes between them on the event loop)."""
        return self._free.value

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot now."""
        return self._free.statistics().tasks_waiting

    @asynccontextmanager
    async def slot(self, wait: float | None = None) -> AsyncIterator[None]:
        """Hold one slot; DatabaseBusy when none came free within `wait` seconds (the
        lane's wait by default)."""
        wait = self.wait if wait is None else wait
        try:
            # A free slot is taken at once: no cancel scope, no trip through the event
            # loop (each costs more than a look-up's bookkeeping).
            self._free.acquire_nowait()
        except anyio.WouldBlock:
            acquired = False
            with anyio.move_on_after(wait):
                await self._free.acquire()
                acquired = True
            if not acquired:
                raise DatabaseBusy(self.name, wait) from None
        try:
            yield
        finally:
            self._free.release()

    async def run(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """`fn(*args)` in one of the lane's threads, holding one of its slots."""
        async with self.slot():
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._threads)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """A read session on the lane's engine, holding a slot; it connects at first use."""
        async with self.slot(), self.opened() as session:
            yield session

    @asynccontextmanager
    async def opened(self) -> AsyncIterator[Session]:
        """A session on the lane's engine for a caller that holds one of its slots."""
        session = Session(self.session_engine, expire_on_commit=False)  # no I/O yet
        try:
            yield session
        finally:
            if not _ends_quietly(session):
                # Giving the connection back is I/O (a rollback): off the event loop, in
                # the lane's own threads, and shielded, so a cancelled (abandoned) request
                # still returns it.
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(_end, session, limiter=self._threads)
            else:
                # Nothing to wait on (_ends_quietly): ended here, with no thread hop (and
                # nothing to await, so nothing to cancel).
                _end(session)


def _ends_quietly(session: Session) -> bool:
    """Whether ending `session` waits on nothing (so it may end on the event loop): it
    never connected; or it is on SQLite, where the ROLLBACK of a read transaction is a
    local call that takes no lock and sends nothing; or it is on PostgreSQL in autocommit
    and the server said no transaction is open (psycopg then sends no ROLLBACK, nor does
    the pool's reset). A thread hop costs 0.12-0.18 ms of CPU on the benchmark's 2-vCPU
    VM, more than a look-up's own Python."""
    if not session.in_transaction():
        return True
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        return True
    if dialect != "postgresql":
        return False
    try:
        # The session's connection (already there: in_transaction), and psycopg's own.
        driver: Any = session.connection().connection.driver_connection
        return bool(driver.autocommit) and driver.info.transaction_status.name == "IDLE"
    except Exception:  # anything unexpected (an invalidated connection): the general path
        return False


def _end(session: Session) -> None:
    # A read session never writes: closing it rolls back whatever transaction it has.
    session.close()


class ParsingBusy(Exception):
    """The memory ingests in progress may take stayed spoken for the whole wait: 503."""

    def __init__(self, waited: float) -> None:
        super().__init__(f"no room to parse a body came free within {waited:g} s")
        self.waited = waited


class ParseBudget:
    """Bounds the memory all ingests of one worker may take at once.

    Each request holds, while its body is parsed and stored, what api/body.py estimated it
    costs (an upper bound). One hostile body is bounded by the parsed-size limit; without
    this, four of them at once (the write lane's slots, or a group of single posts) took a
    worker past twice the in-flight limit. A request waits on the event loop for room, at
    most `wait` seconds (else ParsingBusy: 503); the only one in progress is always let in,
    so a worker always makes progress.
    """

    def __init__(self, limit: int, wait: float) -> None:
        self.limit = limit
        self.wait = wait
        self.held = 0
        self._room = anyio.Event()
        self._waiting = 0  # requests waiting for room

    @property
    def waiting(self) -> int:
        """Requests waiting for room now."""
        return self._waiting

    def settle(self, charge: int, exact: Callable[[], int] | None = None) -> int:
        """The charge `hold(charge, exact)` takes now: the exact one (smaller, at a cost)
        when `charge`, an upper bound, does not fit."""
        if exact is not None and self.held + charge > self.limit:
            return min(charge, exact())
        return charge

    def fits(self, charge: int) -> bool:
        """Whether `hold(charge)` would go in now, without waiting (on the event loop,
        nothing comes between this answer and a `hold` entered right after it)."""
        return not self.held or self.held + charge <= self.limit

    def hold(
        self, charge: int, exact: Callable[[], int] | None = None, *, wait: float | None = None
    ) -> _Held:
        """Hold `charge` bytes of the budget while the block runs, waiting for room at
        most `wait` seconds (the budget's wait by default). `exact` gives a smaller
        charge at a cost (the body's estimate, where `charge` is its upper bound): asked
        only when `charge` does not fit. (A request never waits for more while it holds
        some: two doing so at once would keep each other out.)"""
        return _Held(self, charge, exact, wait)

    async def _enter(self, charge: int, exact: Callable[[], int] | None, wait: float | None) -> int:
        charge = self.settle(charge, exact)
        if self.held and self.held + charge > self.limit:
            wait = self.wait if wait is None else wait
            # Only when it must wait: a cancel scope costs more than a small ingest's
            # bookkeeping (bench/README.md item 14).
            self._waiting += 1
            try:
                with anyio.move_on_after(wait):
                    while self.held and self.held + charge > self.limit:
                        await self._room.wait()
            finally:
                self._waiting -= 1
            if self.held and self.held + charge > self.limit:
                raise ParsingBusy(wait)
        self.held += charge
        return charge

    def _exit(self, charge: int) -> None:
        self.held -= charge
        if self._waiting:
            # Wake every waiter: each checks whether its own charge fits now. (Only then a
            # new Event: making one per request showed in a small post's profile.)
            self._room.set()
            self._room = anyio.Event()


class _Held:
    """`ParseBudget.hold`'s context: a class, not an @asynccontextmanager, whose generator
    and wrapper cost a small post ~1 us (bench/README.md item 24)."""

    __slots__ = ("_budget", "_charge", "_exact", "_wait")

    def __init__(
        self,
        budget: ParseBudget,
        charge: int,
        exact: Callable[[], int] | None,
        wait: float | None,
    ) -> None:
        self._budget, self._charge, self._exact, self._wait = budget, charge, exact, wait

    async def __aenter__(self) -> None:
        self._charge = await self._budget._enter(self._charge, self._exact, self._wait)

    async def __aexit__(self, *_exc: object) -> None:
        self._budget._exit(self._charge)


class Lanes:
    """The lanes of one app, and the engines behind them."""

    def __init__(self, settings: Settings) -> None:
        wait = settings.db_wait
        reads, writes = settings.db_pool_size, settings.db_write_connections
        self.engine = create_engine(
            settings.database_url, connections=reads + writes + SPARE_CONNECTIONS, wait=wait
        )
        # /health and /metrics on an engine of their own: two connections, one each.
        self.service_engine = create_engine(settings.database_url, connections=2, wait=wait)
        self.reads = Lane("read", self.engine, reads, wait, reads=True)
        self.writes = Lane("write", self.engine, writes, wait)
        self.health = Lane("health", self.service_engine, 1, wait)
        self.metrics = Lane("metrics", self.service_engine, 1, wait)
        # Not a connection lane: this process's analytics children, one report each
        # (reports/live.py). A report waits here before it takes a read slot.
        self.analytics = Lane(ANALYTICS_LANE, self.engine, ANALYTICS_CHILDREN, wait)
        # Not a connection lane: the memory ingests take while they parse and store.
        self.parsing = ParseBudget(settings.max_parsed_bytes, wait)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
        self.service_engine.dispose()


def _has_body(scope: Scope) -> bool:
    for key, value in scope.get("headers", ()):
        name = key.lower()
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


class AbandonedRequests:
    """ASGI middleware: cancels a body-less request whose client left before its answer.

    Such a request reads nothing from its client after the (empty) body, so the
    disconnect is watched for beside it. Cancelling it ends its wait for a lane's slot at
    once; a query already running in a thread finishes first (threads cannot be
    interrupted), then the session's shielded clean-up gives the connection back.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.abandoned = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI call; watch body-less HTTP requests for their client leaving."""
        if scope["type"] != "http" or _has_body(scope):
            await self.app(scope, receive, send)
            return
        first = await receive()
        if first["type"] == "http.disconnect":
            await self._record_abandoned(send)
            return
        gone = anyio.Event()
        complete = False
        delivered = False

        async def app_receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return first
            await gone.wait()
            return {"type": "http.disconnect"}

        async def tracked_send(message: Message) -> None:
            nonlocal complete
            if message["type"] == "http.response.body" and not message.get("more_body"):
                complete = True
            await send(message)

        abandoned = False
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                nonlocal abandoned
                # The server answers http.disconnect when the client leaves, and also once
                # the response is complete: only the first is an abandoned request.
                while (await receive())["type"] != "http.disconnect":
                    pass
                gone.set()
                if not complete:
                    abandoned = True
                    group.cancel_scope.cancel()

            group.start_soon(watch)
            try:
                await self.app(scope, app_receive, tracked_send)
            finally:
                group.cancel_scope.cancel()  # the watcher, once the app is done
        if abandoned:
            await self._record_abandoned(send)

    async def _record_abandoned(self, send: Send) -> None:
        self.abandoned += 1
        # The server drops what is sent to a client that left; the middleware outside
        # (api/observability.py) records the status instead of a 500.
        await send({"type": "http.response.start", "status": CLIENT_CLOSED, "headers": []})


__all__ = [
    "BUSY_RETRY_AFTER",
    "AbandonedRequests",
    "DatabaseBusy",
    "Lane",
    "Lanes",
    "ParseBudget",
    "ParsingBusy",
]

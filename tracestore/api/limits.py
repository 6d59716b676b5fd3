"""Back-pressure: bounded request bytes in flight per worker (503 with Retry-After past it).

`InflightLimit` is pure ASGI middleware. Every HTTP request is charged the body bytes it
can hold while it is being served: its `Content-Length` when declared (reserved before any
byte is read), else the bytes as they stream in; for a gzip body, the *decoded* bytes as
they stream in (a small body may expand up to `max_body_bytes`, and `api/body.py` holds
the decoded bytes). The charge is released when the request ends, however it ends
(response sent, error, client disconnect). A request that would take the worker past
`max_inflight_bytes` is refused with 503 `overloaded` and `Retry-After`:

- at admission, before its body is read, when its declared length does not fit;
- mid-stream, when a body without a declared length (or a gzip body) grows past the
  bound; the app is then told the client went away, so nothing is written.

The oldest request in flight is never refused, so a worker always makes progress: a
bound smaller than one body does not make that body impossible to send, and bodies that
grow together cannot all cut each other off. Held bytes therefore stay below
`max_inflight_bytes` plus one body (at most `max_body_bytes`, which api/body.py enforces).

A body must keep coming: a wait of more than `body_timeout` seconds for its next piece, or
an average rate below `body_min_rate` once it has taken `body_timeout` seconds, cuts it
with 408 `request_timeout` (uvicorn has no body timeout), found by a sweep of the requests
in flight every min(1 s, timeout / 10). So a stalled or dripping upload holds its charge
for a bounded time, not forever.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import dataclass, field

import orjson
from fastapi import FastAPI
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tracestore.api.errors import error_body
from tracestore.api.headers import first_headers
from tracestore.api.overload import AbandonedRequests
from tracestore.settings import Settings

# Seconds a refused client should wait. Short: the bytes in flight drain as requests end,
# and clients add jitter on top (tracestore.client does).
RETRY_AFTER_SECONDS = 1
_GZIP = (b"gzip", b"x-gzip")
# Decoded bytes measured per step: the meter's own memory stays this small.
_METER_STEP = 64 * 1024


class _GzipMeter:
    """Counts the decoded size of a gzip stream without keeping what it decodes."""

    def __init__(self, stop_after: int) -> None:
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._stop_after = stop_after
        self.size = 0
        self.broken = False

    def feed(self, data: bytes) -> None:
        """Add the decoded size of `data` (stops counting past `stop_after` or on bad data)."""
        while data and not self.broken and self.size <= self._stop_after:
            try:
                self.size += len(self._inflater.decompress(data, _METER_STEP))
            except zlib.error:
                # api/body.py refuses the body with a clear error; it holds no more than
                # what was decoded so far, which is already counted.
                self.broken = True
                return
            data = self._inflater.unconsumed_tail
            if self._inflater.eof and self._inflater.unused_data:
                # Concatenated gzip members (RFC 1952), as api/body.py reads them.
                data = self._inflater.unused_data + data
                self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)


@dataclass(slots=True)
class Ticket:
    """One request's charge against the worker's bound."""

    charge: int = 0
    received: int = 0
    meter: _GzipMeter | None = None
    started: float = field(default_factory=time.monotonic)
    body_done: bool = False  # the last piece of the body has arrived (or there is none)
    responded: bool = False  # the app (or we) started the response
    cut: bool = False  # we refused it mid-stream and answered for it
    gone: bool = False  # the client disconnected
    # The task waiting for the body's next piece, and since when (the sweep's to cut).
    waiter: asyncio.Task[object] | None = None
    waiting_since: float = 0.0
    expired: bool = False  # the sweep cancelled the wait: a stalled body, not a cancel


_BODY_HEAD = frozenset((b"content-length", b"transfer-encoding", b"content-encoding"))
# In a request's scope: the Ticket of a request the ingest lane admitted and then handed
# down the app (its body was still arriving).
HANDED_TICKET = "tracestore.inflight_ticket"


def _body_head(scope: Scope) -> tuple[int | None, bool, bytes]:
    """The head's word on the body: its declared length (None when absent or
    unreadable), whether it is chunked, and its encoding."""
    head = first_headers(scope, _BODY_HEAD)
    encoding = head.get(b"content-encoding", b"").strip().lower()
    chunked = b"transfer-encoding" in head
    length = head.get(b"content-length")
    if length is None or not length.strip().isdigit():
        return None, chunked, encoding
    return int(length), chunked, encoding


def _refusal(
    status: int, error: dict[str, object], *extra: tuple[bytes, bytes]
) -> tuple[Message, Message]:
    body = orjson.dumps(error)
    start: Message = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *extra,
            # The rest of the body is never read: close the connection rather than leave
            # its unread bytes in front of the client's next request. The server reads
            # and drops what the client still sends for a while before it closes
            # (api/server.py), so a client that sends its whole body before reading gets
            # this answer, not a connection reset.
            (b"connection", b"close"),
        ],
    }
    return start, {"type": "http.response.body", "body": body, "more_body": False}


def overloaded_response(limit: int) -> tuple[Message, Message]:
    """The ASGI messages of the 503 `overloaded` response."""
    return _refusal(
        503,
        error_body(
            "overloaded",
            f"the server is holding its limit of {limit} request bytes in flight; "
            f"retry after {RETRY_AFTER_SECONDS} s",
            retry_after=RETRY_AFTER_SECONDS,
            limit=limit,
        ),
        (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
    )


def timeout_response(message: str) -> tuple[Message, Message]:
    """The ASGI messages of the 408 `request_timeout` response."""
    return _refusal(408, error_body("request_timeout", message))


class InflightLimit:
    """ASGI middleware bounding the request-body bytes held by requests in flight."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int,
        max_body: int,
        body_timeout: float = 30.0,
        body_min_rate: int = 0,
    ) -> None:
        self.app = app
        self.limit = limit
        self.max_body = max_body
        self.body_timeout = body_timeout
        self.body_min_rate = body_min_rate
        # One event loop per worker process: plain integers need no lock.
        self.inflight = 0
        self.refused = 0
        self.timed_out = 0
        # Requests in flight, oldest first (dicts keep insertion order).
        self._live: dict[int, Ticket] = {}
        # Stalled bodies are found by one sweep of the requests in flight every `_tick`
        # seconds while any is in flight, not by a timer per wait: asyncio.timeout around
        # each receive cost ~5 of the ~23 us the app spent around a small post (a timer
        # made, pushed on the loop's heap and cancelled per post; bench/README.md item 24).
        self._tick = min(1.0, body_timeout / 10)
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_loop: asyncio.AbstractEventLoop | None = None

    def _fits(self, ticket: Ticket, more: int) -> bool:
        oldest = next(iter(self._live.values()), ticket)
        return oldest is ticket or self.inflight + more <= self.limit

    def admit(self, size: int) -> Ticket | None:
        """Charge a request declaring a body of `size` bytes before any of it is read, as
        this middleware does (the ingest lane's, api/lane.py): its ticket, or None when it
        does not fit (the middleware refuses it). A ticket handed on in the scope
        (HANDED_TICKET) is the middleware's own from there."""
        ticket = Ticket(charge=size)
        if not self._fits(ticket, size):
            return None
        self.inflight += size
        self._live[id(ticket)] = ticket
        return ticket

    def release(self, ticket: Ticket) -> None:
        """Give back what `admit` charged (once: a ticket released already is let be)."""
        # Idempotent: the lane releases a ticket it handed down once the app returns,
        # whether or not this middleware adopted (and released) it on the way.
        if self._live.pop(id(ticket), None) is not None:
            self.inflight -= ticket.charge

    def _stalled(self) -> str:
        return f"the request body stalled: nothing arrived for {self.body_timeout:g} s"

    async def refuse_stalled(self, send: Send) -> None:
        """Answer 408 for a request whose body stalled (`wait_piece` gave None)."""
        self.timed_out += 1
        start, body = timeout_response(self._stalled())
        await send(start)
        await send(body)

    async def _refuse(self, send: Send) -> None:
        self.refused += 1
        start, body = overloaded_response(self.limit)
        await send(start)
        await send(body)

    def _too_slow(self, ticket: Ticket) -> str | None:
        """Why the body arriving for `ticket` is too slow to go on with, or None."""
        took = time.monotonic() - ticket.started
        if self.body_min_rate and took > self.body_timeout:
            rate = ticket.received / took
            if rate < self.body_min_rate:
                return (
                    f"the request body arrived at {rate:.0f} bytes/s over {took:.0f} s, "
                    f"below the floor of {self.body_min_rate} bytes/s"
                )
        return None

    def _swept(self) -> None:
        """Cut the body waits that have waited past `body_timeout`; again while any request
        is in flight."""
        self._sweep = None
        now = time.monotonic()
        for ticket in self._live.values():
            waiter = ticket.waiter
            if waiter is not None and now - ticket.waiting_since > self.body_timeout:
                ticket.expired = True
                ticket.waiter = None
                waiter.cancel()
        if self._live:
            self._sweep = asyncio.get_running_loop().call_later(self._tick, self._swept)

    async def wait_piece(self, ticket: Ticket, receive: Receive) -> Message | None:
        """The next message of a body still arriving; None when it stalled past the
        timeout (uvicorn has none for bodies)."""
        task = asyncio.current_task()
        assert task is not None
        # A sweep armed on another loop (an app served again on a new one) never comes.
        if self._sweep is None or self._sweep_loop is not task.get_loop():
            self._sweep_loop = task.get_loop()
            self._sweep = self._sweep_loop.call_later(self._tick, self._swept)
        ticket.waiter, ticket.waiting_since = task, time.monotonic()
        cancelling = task.cancelling()  # cancels already pending are not ours
        try:
            return await receive()
        except asyncio.CancelledError:
            # Ours only when no one else cancelled the task too (as asyncio.timeout tells).
            if ticket.expired and task.uncancel() <= cancelling:
                return None
            raise
        finally:
            ticket.waiter = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI call, charging and releasing its body bytes."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        handed: Ticket | None = scope.pop(HANDED_TICKET, None)
        if handed is not None:
            # Admitted by the ingest lane, which took no body-less, encoded or chunked
            # request: its charge, its place among the requests in flight, its clock.
            ticket = handed
        else:
            ticket = Ticket()
            declared, chunked, encoding = _body_head(scope)
            if not declared and not chunked:
                ticket.body_done = True  # no body to wait for (every GET)
            if encoding in _GZIP:
                ticket.meter = _GzipMeter(stop_after=self.max_body)
            # A declared body past the body limit is refused (413) before any of it is
            # read, so it holds nothing; anything else reserves its declared length up
            # front.
            reserve = declared if declared is not None and declared <= self.max_body else 0
            if reserve and not self._fits(ticket, reserve):
                await self._refuse(send)
                return
            self.inflight += reserve
            ticket.charge = reserve
            self._live[id(ticket)] = ticket

        async def cut(answer: tuple[Message, Message]) -> Message:
            # Answer for the app (unless it answered already) and tell it the client left,
            # so it stops reading, writes nothing and ends: its charge is released.
            ticket.cut = True
            if not ticket.responded:
                ticket.responded = True
                await send(answer[0])
                await send(answer[1])
            return {"type": "http.disconnect"}

        async def counted_receive() -> Message:
            # After the body only a disconnect is left to come: no timeout.
            if ticket.body_done or ticket.cut:
                message: Message | None = await receive()
            else:
                message = await self.wait_piece(ticket, receive)
            if message is None:
                self.timed_out += 1
                return await cut(timeout_response(self._stalled()))
            if message["type"] == "http.disconnect":
                ticket.gone = True
            if message["type"] != "http.request" or ticket.cut:
                return message
            if not message.get("more_body", False):
                ticket.body_done = True
            chunk: bytes = message.get("body", b"")
            ticket.received += len(chunk)
            held = ticket.received
            if ticket.meter is not None:
                ticket.meter.feed(chunk)
                held = max(held, ticket.meter.size)
            slow = None if ticket.body_done else self._too_slow(ticket)
            if slow is not None:
                self.timed_out += 1
                return await cut(timeout_response(slow))
            grow = held - ticket.charge
            if grow <= 0:
                return message
            if not ticket.responded and not self._fits(ticket, grow):
                # Past the bound mid-stream: answer 503 now and tell the app the client
                # left, so it stops reading and writes nothing.
                self.refused += 1
                return await cut(overloaded_response(self.limit))
            self.inflight += grow
            ticket.charge += grow
            return message

        async def guarded_send(message: Message) -> None:
            if ticket.cut:
                return  # we already answered this request
            if message["type"] == "http.response.start":
                ticket.responded = True
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except ClientDisconnect:
            if not (ticket.cut or ticket.gone):
                raise
            # Either the disconnect is the one we told the app about (our 503 went out
            # already) or the client did leave: nobody is waiting for an answer, so this
            # is not an error to log (the bytes it held are released below).
        finally:
            self.release(ticket)


def install(app: FastAPI, settings: Settings) -> None:
    """Add the in-flight bound and body timeouts to `app`, and the watch for abandoned
    requests inside them (api/overload.py)."""
    app.add_middleware(AbandonedRequests)
    app.add_middleware(
        InflightLimit,
        limit=settings.max_inflight_bytes,
        max_body=settings.max_body_bytes,
        body_timeout=settings.body_timeout,
        body_min_rate=settings.body_min_rate,
    )


__all__ = [
    "HANDED_TICKET",
    "RETRY_AFTER_SECONDS",
    "InflightLimit",
    "Ticket",
    "install",
    "overloaded_response",
    "timeout_response",
]

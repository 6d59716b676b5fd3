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
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import orjson
from fastapi import FastAPI
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tracestore.api.errors import error_body
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
class _Ticket:
    """One request's charge against the worker's bound."""

    charge: int = 0
    received: int = 0
    meter: _GzipMeter | None = None
    responded: bool = False  # the app (or we) started the response
    cut: bool = False  # we refused it mid-stream and answered for it
    gone: bool = False  # the client disconnected


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


def _declared_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    if value is None or not value.strip().isdigit():
        return None
    return int(value)


def overloaded_response(limit: int) -> tuple[Message, Message]:
    """The ASGI messages of the 503 `overloaded` response."""
    body = orjson.dumps(
        error_body(
            "overloaded",
            f"the server is holding its limit of {limit} request bytes in flight; "
            f"retry after {RETRY_AFTER_SECONDS} s",
            retry_after=RETRY_AFTER_SECONDS,
            limit=limit,
        )
    )
    start: Message = {
        "type": "http.response.start",
        "status": 503,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
            # The refused body is never read: close the connection rather than leave its
            # unread bytes in front of the client's next request.
            (b"connection", b"close"),
        ],
    }
    return start, {"type": "http.response.body", "body": body, "more_body": False}


class InflightLimit:
    """ASGI middleware bounding the request-body bytes held by requests in flight."""

    def __init__(self, app: ASGIApp, *, limit: int, max_body: int) -> None:
        self.app = app
        self.limit = limit
        self.max_body = max_body
        # One event loop per worker process: plain integers need no lock.
        self.inflight = 0
        self.refused = 0
        # Requests in flight, oldest first (dicts keep insertion order).
        self._live: dict[int, _Ticket] = {}

    def _fits(self, ticket: _Ticket, more: int) -> bool:
        oldest = next(iter(self._live.values()), ticket)
        return oldest is ticket or self.inflight + more <= self.limit

    async def _refuse(self, send: Send) -> None:
        self.refused += 1
        start, body = overloaded_response(self.limit)
        await send(start)
        await send(body)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI call, charging and releasing its body bytes."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ticket = _Ticket()
        declared = _declared_length(scope)
        encoding = (_header(scope, b"content-encoding") or b"").strip().lower()
        if encoding in _GZIP:
            ticket.meter = _GzipMeter(stop_after=self.max_body)
        # A declared body past the body limit is refused (413) before any of it is read,
        # so it holds nothing; anything else reserves its declared length up front.
        reserve = declared if declared is not None and declared <= self.max_body else 0
        if reserve and not self._fits(ticket, reserve):
            await self._refuse(send)
            return
        self.inflight += reserve
        ticket.charge = reserve
        key = id(ticket)
        self._live[key] = ticket

        async def counted_receive() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                ticket.gone = True
            if message["type"] != "http.request" or ticket.cut:
                return message
            chunk: bytes = message.get("body", b"")
            ticket.received += len(chunk)
            held = ticket.received
            if ticket.meter is not None:
                ticket.meter.feed(chunk)
                held = max(held, ticket.meter.size)
            grow = held - ticket.charge
            if grow <= 0:
                return message
            if not ticket.responded and not self._fits(ticket, grow):
                # Past the bound mid-stream: answer 503 now and tell the app the client
                # left, so it stops reading and writes nothing.
                ticket.cut = True
                ticket.responded = True
                await self._refuse(send)
                return {"type": "http.disconnect"}
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
            self.inflight -= ticket.charge
            del self._live[key]


def install(app: FastAPI, settings: Settings) -> None:
    """Add the in-flight bound to `app`."""
    app.add_middleware(
        InflightLimit,
        limit=settings.max_inflight_bytes,
        max_body=settings.max_body_bytes,
    )


__all__ = ["RETRY_AFTER_SECONDS", "InflightLimit", "install", "overloaded_response"]

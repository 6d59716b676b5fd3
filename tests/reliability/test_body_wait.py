"""The body timeout's sweep (api/limits.py), driven at the ASGI boundary in-process.

tests/reliability/test_stalled_uploads.py cuts stalled uploads on a real server; these
tests pin what the sweep must keep of asyncio.timeout, which it replaced: a wait past the
timeout ends as a 408, a cancel from elsewhere stays a cancel (even when the sweep cut the
same wait), and an app served on a second event loop still times out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import orjson
import pytest
from starlette.types import Message, Receive, Scope, Send

from tracestore.api.limits import HANDED_TICKET, InflightLimit

TIMEOUT_S = 0.3
TICK_S = TIMEOUT_S / 10  # the sweep's interval for this timeout


def _scope() -> Scope:
    headers = [(b"content-length", b"100"), (b"content-type", b"application/json")]
    return {"type": "http", "method": "POST", "path": "/v1/rollouts", "headers": headers}


class Reader:
    """An app that reads its body to the end (as the ingest routes do), noting what came."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            self.messages.append(message)
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                return


class Stalled:
    """The client's side: the first piece of a body, then nothing."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self._first = True

    async def receive(self) -> Message:
        if self._first:
            self._first = False
            return {"type": "http.request", "body": b"{", "more_body": True}
        await asyncio.Event().wait()  # never set: the body stalls
        raise AssertionError("unreachable")

    async def send(self, message: Message) -> None:
        self.sent.append(message)


async def _serve_stalled(limit: InflightLimit, app: Reader) -> tuple[Stalled, float]:
    client = Stalled()
    started = time.monotonic()
    await limit(_scope(), client.receive, client.send)
    return client, time.monotonic() - started


def _status(client: Stalled) -> Any:
    starts = [m for m in client.sent if m["type"] == "http.response.start"]
    return starts[0]["status"] if starts else None


def test_a_stalled_body_is_cut_with_408_after_the_timeout() -> None:
    app = Reader()
    limit = InflightLimit(app, limit=10_000, max_body=10_000, body_timeout=TIMEOUT_S)
    client, took = asyncio.run(_serve_stalled(limit, app))
    assert _status(client) == 408
    body = orjson.loads(client.sent[1]["body"])
    assert body["error"]["code"] == "request_timeout"
    assert app.messages[-1] == {"type": "http.disconnect"}  # the app was told, and ended
    # Not before the timeout; within it and a few of the sweep's ticks (a loaded machine).
    assert TIMEOUT_S <= took < TIMEOUT_S + 20 * TICK_S + 1.0, took
    assert limit.inflight == 0
    assert limit.timed_out == 1


def test_the_timeout_still_comes_on_a_second_event_loop() -> None:
    # A sweep armed on the first loop dies with it; the second must arm its own.
    app = Reader()
    limit = InflightLimit(app, limit=10_000, max_body=10_000, body_timeout=TIMEOUT_S)
    for _ in range(2):
        client, _took = asyncio.run(asyncio.wait_for(_serve_stalled(limit, app), timeout=10))
        assert _status(client) == 408
    assert limit.timed_out == 2


@pytest.mark.parametrize("also_expired", [False, True])
def test_a_cancel_from_elsewhere_stays_a_cancel(also_expired: bool) -> None:
    # The server cancels a request's task (shutdown, a client gone): that must not be read
    # as a stalled body and answered 408, even when the sweep cut the same wait.
    app = Reader()
    limit = InflightLimit(app, limit=10_000, max_body=10_000, body_timeout=TIMEOUT_S)
    client = Stalled()

    async def scenario() -> None:
        task = asyncio.ensure_future(limit(_scope(), client.receive, client.send))
        await asyncio.sleep(TIMEOUT_S / 3)
        if also_expired:
            # The sweep and another cancel in the same turn of the loop.
            for ticket in limit._live.values():
                ticket.waiting_since -= 10 * TIMEOUT_S
            limit._swept()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert _status(client) is None  # no 408 went out
    assert limit.inflight == 0  # the charge was released all the same
    assert limit.timed_out == 0


def test_a_cancel_swallowed_before_the_body_does_not_hide_the_timeout() -> None:
    # A task that caught a cancel earlier (without uncancel) still counts it; the sweep's
    # cut must be told from it as asyncio.timeout tells it (the count on entering).
    app = Reader()
    limit = InflightLimit(app, limit=10_000, max_body=10_000, body_timeout=TIMEOUT_S)

    async def scenario() -> Stalled:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)
        assert task.cancelling() == 1
        client, _took = await _serve_stalled(limit, app)
        return client

    client = asyncio.run(scenario())
    assert _status(client) == 408
    assert limit.inflight == 0


def test_a_handed_ticket_is_released_once_whoever_releases_it() -> None:
    # The ingest lane admits a post, hands its ticket down in the scope, and releases it
    # again once the app returned (in case no middleware adopted it): the second release
    # must neither count twice nor fail.
    app = Reader()
    limit = InflightLimit(app, limit=10_000, max_body=10_000, body_timeout=TIMEOUT_S)
    ticket = limit.admit(100)
    assert ticket is not None
    assert limit.inflight == 100
    body = {"type": "http.request", "body": b"x" * 100, "more_body": False}

    async def receive() -> Message:
        return body

    async def send(message: Message) -> None:
        raise AssertionError(message)  # the reader answers nothing

    scope = {**_scope(), HANDED_TICKET: ticket}
    asyncio.run(limit(scope, receive, send))
    assert app.messages == [body]
    assert (limit.inflight, limit._live) == (0, {})  # adopted, then released on its way out
    limit.release(ticket)
    assert (limit.inflight, limit._live) == (0, {})
    # Never adopted (a layer above answered, or passed a copy of the scope down): the
    # owner's release frees it.
    kept = limit.admit(300)
    assert kept is not None
    assert limit.inflight == 300
    limit.release(kept)
    assert (limit.inflight, limit._live) == (0, {})

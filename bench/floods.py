"""Floods of clients on real loopback sockets: many concurrent keep-alive readers, requests
abandoned mid-flight, and a /health probe timing the server while it is flooded. Used by
bench/overload.py and tests/reliability/test_overload.py.

The readers speak minimal HTTP/1.1 over asyncio streams: hundreds of them cost the client
process little, so the 2 cores go to the server under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import orjson

LOOPBACK = "127.0.0.1"

# 503s the server promises under load; any other 5xx is a failure.
PROMISED_503 = frozenset({"database_busy", "overloaded", "database_unavailable"})


@dataclass
class FloodResult:
    """What a flood's requests got: answers by status (and error code), transport errors."""

    answers: Counter[str] = field(default_factory=Counter)
    retry_after_missing: int = 0  # 503s without a Retry-After header

    @property
    def requests(self) -> int:
        """Requests answered or failed."""
        return sum(self.answers.values())

    @property
    def server_errors(self) -> int:
        """5xx answers that are not a promised 503 (each 500 among them)."""
        return sum(
            n
            for key, n in self.answers.items()
            if key[:1] == "5" and key.partition(" ")[2] not in PROMISED_503
        )

    def count(self, prefix: str) -> int:
        """Answers whose key starts with `prefix` (e.g. '200', '503', '5')."""
        return sum(n for key, n in self.answers.items() if key.startswith(prefix))


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str
) -> tuple[int, dict[bytes, bytes], bytes]:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {LOOPBACK}\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
    return status, headers, body


def _key(status: int, body: bytes) -> str:
    if status < 400:
        return str(status)
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        return f"{status} {orjson.loads(body)['error']['code']}"
    return str(status)


async def _reader(
    port: int,
    paths: list[str],
    stop_at: float | None,
    count: int | None,
    result: FloodResult,
    ready: asyncio.Barrier,
) -> None:
    done = 0
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    with contextlib.suppress(OSError):
        conn = await asyncio.open_connection(LOOPBACK, port)
    await ready.wait()  # every reader connected: the first requests go out together
    while (count is None or done < count) and (stop_at is None or time.monotonic() < stop_at):
        path = paths[done % len(paths)]
        done += 1
        try:
            if conn is None:
                conn = await asyncio.open_connection(LOOPBACK, port)
            status, headers, body = await _exchange(*conn, path)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            result.answers[type(exc).__name__] += 1
            if conn is not None:
                conn[1].close()
            conn = None
            await asyncio.sleep(0.05)
            continue
        result.answers[_key(status, body)] += 1
        if status == 503 and b"retry-after" not in headers:
            result.retry_after_missing += 1
        if headers.get(b"connection", b"").lower() == b"close":
            conn[1].close()
            conn = None
    if conn is not None:
        conn[1].close()


def read_flood(
    url: str,
    paths: list[str],
    clients: int,
    *,
    seconds: float | None = None,
    per_client: int | None = None,
) -> FloodResult:
    """`clients` keep-alive connections at once, each GETting `paths` in turn, for `seconds`
    or `per_client` requests each."""
    port = urlsplit(url).port
    assert port is not None
    result = FloodResult()

    async def run() -> None:
        ready = asyncio.Barrier(clients)
        stop_at = None if seconds is None else time.monotonic() + seconds
        await asyncio.gather(
            *(_reader(port, paths, stop_at, per_client, result, ready) for _ in range(clients))
        )

    asyncio.run(run())
    return result


def abandoned_requests(url: str, path: str, n: int, after: float) -> None:
    """`n` connections each send one GET of `path` and close after `after` seconds, unread."""
    port = urlsplit(url).port
    assert port is not None
    socks = []
    try:
        for _ in range(n):
            sock = socket.create_connection((LOOPBACK, port), timeout=10)
            socks.append(sock)
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {LOOPBACK}\r\n\r\n".encode())
        time.sleep(after)
    finally:
        for sock in socks:
            sock.close()


def p99(samples: list[float]) -> float:
    """The 99th percentile of `samples` (nearest rank); 0 when empty."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


class HealthProbe:
    """GET /health on a new connection every `every` seconds, in a thread: latencies."""

    def __init__(self, url: str, every: float = 0.2, timeout: float = 30.0) -> None:
        self.url = url
        self.every = every
        self.timeout = timeout
        self.latencies: list[float] = []
        self.statuses: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                status = str(httpx.get(self.url + "/health", timeout=self.timeout).status_code)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            self.latencies.append(time.monotonic() - start)
            self.statuses[status] += 1
            self._stop.wait(self.every)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout + 5)


def time_to_health(url: str, bound: float) -> float:
    """Seconds until /health answers 200 (each try waits at most what is left of `bound`);
    `bound` is exceeded when it never does."""
    start = time.monotonic()
    while (left := bound - (time.monotonic() - start)) > 0:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=left).status_code == 200:
                return time.monotonic() - start
        time.sleep(0.05)
    return time.monotonic() - start

"""Request heads that arrive whole are bounded too, and a request the HTTP parser refuses is
answered as every error is (JSON).

Before: the head bound (TRACESTORE_MAX_HEADER_BYTES, 32 KiB) counted only a head still
open after a read, so one that arrived whole in a read or two (a 40 or 100 KB header, a
helper's QA) was taken by the app (200); a request line the parser refuses (a 70 KB
target) was answered uvicorn's `400 Invalid HTTP request received.` in text/plain. A real
server (subprocess, SQLite: the bound sits in front of any database code) from raw
sockets.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.reliability.harness import LOOPBACK, ServerProcess, is_error_shape
from tracestore.settings import Settings

LIMIT = Settings.model_construct().max_header_bytes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with the default limits."""
    tmp = tmp_path_factory.mktemp("request-heads")
    with ServerProcess(f"sqlite:///{tmp / 'store.db'}", tmp / "server.log") as server:
        yield server


def _ask(server: ServerProcess, request: bytes) -> tuple[int, dict[str, object], bytes]:
    """Send `request` whole, read the answer until the server closes: status, JSON body,
    head."""
    with socket.create_connection((LOOPBACK, server.port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
                if b"connection: close" not in answer.lower() and b"\r\n\r\n" in answer:
                    head, _, body = answer.partition(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                    if len(body) >= length:
                        break
        except (TimeoutError, ConnectionError):
            pass
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head[9:12]), orjson.loads(body), head


@pytest.mark.parametrize("size", [LIMIT + 1024, 100_000, 400_000])
def test_a_head_past_the_bound_that_arrives_whole_is_refused_with_431(
    server: ServerProcess, size: int
) -> None:
    status, body, head = _ask(
        server, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    )
    assert status == 431, body
    assert is_error_shape(body)
    assert body["error"]["code"] == "headers_too_large"  # type: ignore[index]
    assert b"application/json" in head
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_many_headers_past_the_bound_together_are_refused(server: ServerProcess) -> None:
    lines = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(LIMIT // 100))
    status, body, _ = _ask(server, b"GET /health HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n")
    assert status == 431, body


def test_a_head_within_the_bound_is_served(server: ServerProcess) -> None:
    status, body, _ = _ask(
        server,
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
        + b"a" * (LIMIT - 1024)
        + b"\r\n\r\n",
    )
    assert status == 200, body


@pytest.mark.parametrize(
    "request_line",
    [b"GET /v1/rollouts/" + b"a" * 70_000 + b" HTTP/1.1", b"NOT HTTP AT ALL", b"GET / HTTP/9.9"],
    ids=["long-target", "garbage", "bad-version"],
)
def test_a_request_the_parser_refuses_gets_a_json_error(
    server: ServerProcess, request_line: bytes
) -> None:
    status, body, head = _ask(server, request_line + b"\r\nHost: x\r\n\r\n")
    assert status in (400, 431), body
    assert is_error_shape(body), body
    assert b"application/json" in head

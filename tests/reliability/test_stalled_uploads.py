"""Stalled uploads: a body that stops coming (or drips) is cut with 408 and releases its
in-flight bytes; refused uploads get a readable answer, not a connection reset.

Before: four uploads that declared their length and stalled held the in-flight bound
forever (uvicorn has no body timeout), and every other producer got 503 meanwhile; a
client sending its whole body before reading (most do) met a connection reset instead
of the 503. Real servers (subprocesses) with a 16 MiB bound, driven from raw sockets
(tests/reliability/test_backpressure.py has the uploads): one with a 2 s body timeout for
the cuts, one with the default (30 s) for the tests that need the bound held, not cut.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from tests.reliability.harness import FIGURES, LOOPBACK, ServerProcess, is_error_shape
from tests.reliability.test_backpressure import (
    BODY,
    BOUND,
    MAX_BODY,
    MIB,
    Upload,
    _doc,
    _open_upload,
)

BODY_TIMEOUT_S = 2.0
MIN_RATE = 256 * 1024  # bytes/s, once a body has taken BODY_TIMEOUT_S
ANSWER_WAIT_S = BODY_TIMEOUT_S + 8.0  # a cut comes within the timeout and some slack
# Past what loopback socket buffers hold (the client is still sending when it is refused),
# within the body limit.
BIG = 20 * MIB
# How long a fill's uploads wait for a refusal before they count as held. A declared
# upload is refused before the server reads its body, so the refusal is in the socket
# when the send ends (measured: under 0.1 ms). On the 2 s server the wait is short: the
# uploads' clocks run from their stall, and what the test does next must come well within
# 2 s. A late refusal would still fail the test there (a 503 where a 408 or 201 is due).
HELD_AFTER_S = 1.0
QUICK_FILL_WAIT_S = 0.2
FILL_WITHIN_S = 10.0  # for the bound to come free of uploads closed just before


def _server(tmp: Path, **env: str) -> ServerProcess:
    # The bound sits in front of any database code: SQLite stands for both databases.
    env = {
        "TRACESTORE_MAX_INFLIGHT_BYTES": str(BOUND),
        "TRACESTORE_MAX_BODY_BYTES": str(MAX_BODY),
        **env,
    }
    return ServerProcess(f"sqlite:///{tmp / 'store.db'}", tmp / "server.log", env=env)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with a 16 MiB in-flight bound, a 24 MiB body limit, a 2 s body timeout."""
    timeouts = {
        "TRACESTORE_BODY_TIMEOUT": str(BODY_TIMEOUT_S),
        "TRACESTORE_BODY_MIN_RATE": str(MIN_RATE),
    }
    with _server(tmp_path_factory.mktemp("stalled"), **timeouts) as server:
        yield server


@pytest.fixture(scope="module")
def patient_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The same bounds, the default body timeout (30 s): held uploads stay held.

    For the tests that need the bound full while they send: on the 2 s server the time
    spent filling it and sending counted against the held uploads' timeout (as little as
    0.2 s to spare), and once they were cut the upload meant to be refused was admitted.
    """
    with _server(tmp_path_factory.mktemp("held")) as server:
        yield server


def _fill_bound(port: int, first: int, wait: float = HELD_AFTER_S) -> list[Upload]:
    """Uploads that declare their length, send all but its last byte, and stall.

    Tried again until the whole bound admits them: the uploads of the test before may have
    been closed just now, and the server releases their bytes once it sees them go.
    """
    deadline = time.monotonic() + FILL_WITHIN_S
    while True:
        with ThreadPoolExecutor(max_workers=8) as pool:
            uploads = list(
                pool.map(
                    lambda i: _open_upload(port, "declared", i, wait),
                    range(first, first + BOUND // BODY),
                )
            )
        if all(u.status is None for u in uploads) or time.monotonic() > deadline:
            break
        for upload in uploads:
            upload.sock.close()
        time.sleep(0.2)
    assert [u.status for u in uploads] == [None] * len(uploads), [u.answer[:100] for u in uploads]
    return uploads


def _code(answer: bytes) -> str:
    body = orjson.loads(answer.partition(b"\r\n\r\n")[2])
    assert is_error_shape(body), body
    code: str = body["error"]["code"]
    return code


def test_stalled_uploads_are_cut_and_release_the_bound(server: ServerProcess) -> None:
    stalled = _fill_bound(server.port, 100, QUICK_FILL_WAIT_S)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            # The bound is full: another producer is refused for now...
            assert http.post("/v1/rollouts", content=_doc("shut-out", BODY)).status_code == 503
            start = time.monotonic()
            for upload in stalled:
                upload.read_answer(ANSWER_WAIT_S)
            took = time.monotonic() - start
            # ... until the stalled bodies are cut, each told why.
            assert [u.status for u in stalled] == [408] * len(stalled), [
                u.answer[:120] for u in stalled
            ]
            assert {_code(u.answer) for u in stalled} == {"request_timeout"}
            admitted = http.post("/v1/rollouts", content=_doc("let-in", BODY))
            assert admitted.status_code == 201, admitted.text
            # Nothing of a cut upload was stored.
            assert http.get("/v1/rollouts/flood-0100").status_code == 404
    finally:
        for upload in stalled:
            upload.sock.close()
    FIGURES.note(
        "stalled-uploads",
        stalled=len(stalled),
        body_timeout_s=BODY_TIMEOUT_S,
        cut_after_s=round(took, 2),
    )
    assert "Traceback" not in server.log_text()


def test_a_dripping_upload_is_cut(server: ServerProcess) -> None:
    body = _doc("drip", BODY)
    with socket.create_connection((LOOPBACK, server.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/rollouts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        start = time.monotonic()
        upload = Upload(sock, b"", chunked=False)
        # A byte every 0.2 s: never idle past the timeout, far below the floor rate.
        at = 0
        while upload.status is None and time.monotonic() - start < ANSWER_WAIT_S:
            with contextlib.suppress(ConnectionError):
                sock.sendall(body[at : at + 1])
            at += 1
            upload.read_answer(0.2)
        took = time.monotonic() - start
    assert upload.status == 408, upload.answer[:200]
    assert _code(upload.answer) == "request_timeout"
    assert took < ANSWER_WAIT_S
    FIGURES.note("stalled-uploads", drip_cut_after_s=round(took, 2))


def _send_whole_then_read(port: int, kind: str, size: int = BIG) -> tuple[str | None, bytes]:
    """Send an upload whole before reading anything: (the send error, the answer)."""
    body = _doc(f"whole-{kind}", size)
    head = b"POST /v1/rollouts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if kind == "chunked":
        step = MIB
        pieces = [b"%x\r\n%s\r\n" % (step, body[i : i + step]) for i in range(0, len(body), step)]
        request = head + b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(pieces) + b"0\r\n\r\n"
    else:
        request = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    error = None
    with socket.create_connection((LOOPBACK, port), timeout=30) as sock:
        try:
            sock.sendall(request)
        except OSError as exc:
            error = type(exc).__name__
        answer = b""
        sock.settimeout(10)
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    return error, answer


@pytest.mark.parametrize("kind", ["declared", "chunked"])
def test_a_refused_upload_is_answered_not_reset(patient_server: ServerProcess, kind: str) -> None:
    # The bound is full: refused at once (declared) or as soon as it grows (chunked).
    held = _fill_bound(patient_server.port, 200 if kind == "declared" else 300)
    try:
        error, answer = _send_whole_then_read(patient_server.port, kind)
    finally:
        for upload in held:
            upload.sock.close()
    assert error is None, f"sending failed with {error}: the refusal arrived as a reset"
    head = answer.partition(b"\r\n\r\n")[0].lower()
    assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
    assert b"\r\nretry-after: 1\r\n" in head
    assert _code(answer) == "overloaded"


def test_an_upload_past_the_body_limit_is_answered_not_reset(server: ServerProcess) -> None:
    error, answer = _send_whole_then_read(server.port, "declared", MAX_BODY + 8 * MIB)
    assert error is None, f"sending failed with {error}: the refusal arrived as a reset"
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert _code(answer) == "payload_too_large"


def test_an_upload_cut_mid_stream_is_answered_not_reset(patient_server: ServerProcess) -> None:
    # Three quarters of the bound held: a chunked upload is admitted (it declares
    # nothing) and cut once it grows past what is left.
    uploads = _fill_bound(patient_server.port, 400)
    uploads[-1].sock.close()  # a quarter of the bound comes free
    held = uploads[:-1]
    try:
        time.sleep(0.5)
        error, answer = _send_whole_then_read(patient_server.port, "chunked")
    finally:
        for upload in held:
            upload.sock.close()
    assert error is None, f"sending failed with {error}: the refusal arrived as a reset"
    assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
    assert _code(answer) == "overloaded"


def _bound_is_whole(server: ServerProcess, wait: float) -> None:
    # _fill_bound waits (up to FILL_WITHIN_S) for the bound to come free: a charge that is
    # never released fails it.
    uploads = _fill_bound(server.port, 500, wait)
    # Finished together: one finished after the others were stored could pass the 2 s.
    with ThreadPoolExecutor(max_workers=len(uploads)) as pool:
        list(pool.map(Upload.finish, uploads))
    for upload in uploads:
        upload.sock.close()
    assert [u.status for u in uploads] == [201] * len(uploads)
    assert "Traceback" not in server.log_text()


def test_the_bound_is_whole_again(server: ServerProcess) -> None:
    """After the cuts above, the whole bound of the 2 s server is free."""
    _bound_is_whole(server, QUICK_FILL_WAIT_S)


def test_the_bound_is_whole_again_after_the_refusals(patient_server: ServerProcess) -> None:
    """After the refusals above, the whole bound of the patient server is free."""
    _bound_is_whole(patient_server, HELD_AFTER_S)

"""Back-pressure: request bytes in flight are bounded per worker; past the bound, 503.

A real server (subprocess) runs with a small in-flight bound. Floods of slow uploads over
raw sockets try to make it hold far more than the bound: bodies that declare their
length, chunked bodies that declare none, and gzip bodies that are small on the wire but
expand on decoding. Each upload sends all but the end of its body and holds. The server
must admit only what fits, refuse the rest at once with 503 `overloaded` and
`Retry-After`, keep its peak memory near the bound (measured from /proc: VmHWM), release
the charge of every request when it ends or its client leaves, and stay healthy.
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from tests.reliability.harness import (
    FIGURES,
    LOOPBACK,
    SIZE,
    ServerProcess,
    count_response,
    is_error_shape,
)

MIB = 1024 * 1024
BOUND = 16 * MIB
MAX_BODY = 24 * MIB  # above the bound: a body alone may exceed it
BODY = 4 * MIB  # each flooding upload: BOUND holds 4 of them
# Growth of the server's peak RSS while the flood is held. Unbounded, the flood holds
# flood_connections x BODY (192 MiB and more); bounded, BOUND plus buffers and Python.
HELD_GROWTH_LIMIT = 3 * BOUND
# How long an upload waits for an answer before it counts as held. A refusal comes back
# within milliseconds on loopback (0.13 s at most in a flood of 48 measured on a loaded
# 2-core machine), but a later one would be taken for a held upload. Where that decides
# the test (the flood), the wait is long: only the few held uploads wait it out, together.
ANSWER_WAIT_S = 1.0
FLOOD_ANSWER_WAIT_S = 5.0
# Where a refusal is expected: the wait ends as soon as it comes.
REFUSAL_WAIT_S = 30.0


def _doc(run_id: str, size: int) -> bytes:
    """A valid rollout of exactly `size` bytes (padded with an undeclared key)."""
    head = {
        "run_id": run_id,
        "trajectories": [],
        "metrics": {"episode_returns": [0.0], "mean_return": 0.0, "num_steps": 0},
        "padding": "",
    }
    raw = orjson.dumps(head)
    return raw[:-2] + b"x" * (size - len(raw)) + raw[-2:]


@dataclass
class Upload:
    """One flooding connection: its socket and what the server said so far."""

    sock: socket.socket
    rest: bytes  # the end of the body, withheld
    chunked: bool
    answer: bytes = b""

    @property
    def status(self) -> int | None:
        """The HTTP status of the answer (None: no answer yet, the request is held)."""
        if not self.answer.startswith(b"HTTP/1.1 "):
            return None
        return int(self.answer[9:12])

    def read_answer(self, wait: float) -> None:
        """Read what the server sent within `wait` seconds."""
        self.sock.settimeout(wait)
        with contextlib.suppress(TimeoutError, ConnectionError):
            while chunk := self.sock.recv(65536):
                self.answer += chunk
                if b"\r\n\r\n" in self.answer and self.answer.endswith(b"}"):
                    break

    def finish(self) -> None:
        """Send the withheld end of the body and read the answer."""
        with contextlib.suppress(ConnectionError):
            if self.chunked:
                self.sock.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(self.rest), self.rest))
            else:
                self.sock.sendall(self.rest)
        self.read_answer(60)


def _open_upload(port: int, kind: str, index: int, wait: float = ANSWER_WAIT_S) -> Upload:
    body = _doc(f"flood-{index:04d}", BODY)
    headers = [
        "POST /v1/rollouts HTTP/1.1",
        f"Host: {LOOPBACK}",
        "Content-Type: application/json",
    ]
    if kind == "gzip":
        # Small on the wire, BODY bytes once decoded: hold back the gzip trailer.
        body = gzip.compress(body, compresslevel=9)
        headers += ["Content-Encoding: gzip", f"Content-Length: {len(body)}"]
        sent, rest = body[:-8], body[-8:]
    elif kind == "chunked":
        headers.append("Transfer-Encoding: chunked")
        sent, rest = body[:-1], body[-1:]
    else:
        headers.append(f"Content-Length: {len(body)}")
        sent, rest = body[:-1], body[-1:]
    sock = socket.create_connection((LOOPBACK, port), timeout=30)
    upload = Upload(sock, rest, chunked=kind == "chunked")
    try:
        sock.sendall(("\r\n".join(headers) + "\r\n\r\n").encode())
        step = 256 * 1024
        for i in range(0, len(sent), step):
            piece = sent[i : i + step]
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if upload.chunked else piece)
    except ConnectionError:
        pass  # refused and closed while we were still sending: read the answer below
    upload.read_answer(wait)
    return upload


def _bounded(tmp: Path) -> ServerProcess:
    # The bound sits in front of any database code: SQLite stands for both databases.
    env = {
        "TRACESTORE_MAX_INFLIGHT_BYTES": str(BOUND),
        "TRACESTORE_MAX_BODY_BYTES": str(MAX_BODY),
    }
    return ServerProcess(f"sqlite:///{tmp / 'store.db'}", tmp / "server.log", env=env)


def _open_many(port: int, kind: str, first: int, n: int) -> list[Upload]:
    """Open `n` uploads at once (their waits for an answer overlap)."""
    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(lambda i: _open_upload(port, kind, i), range(first, first + n)))


@pytest.fixture(scope="module")
def bounded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with a 16 MiB in-flight bound and a 24 MiB body limit."""
    with _bounded(tmp_path_factory.mktemp("backpressure")) as server:
        yield server


def _reset_peak(server: ServerProcess) -> None:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    Path(f"/proc/{server.pid}/clear_refs").write_text("5")


KINDS = ("declared", "chunked", "gzip")


def test_a_flood_of_held_uploads_is_refused_past_the_bound_and_memory_stays_bounded(
    tmp_path: Path,
) -> None:
    # A new server: its peak memory owes nothing to earlier tests. The flood mixes the
    # three kinds of body, so a hole in the accounting of any one of them lets that kind
    # through in numbers (n/3 x 4 MiB), well past the memory limit checked below.
    with _bounded(tmp_path) as server:
        _flood(server, "backpressure")


def _flood(server: ServerProcess, section: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for kind in KINDS:
            warm = http.post("/v1/rollouts", content=_doc(f"warm-{kind}", BODY))
            assert warm.status_code == 201, warm.text
    _reset_peak(server)
    before = server.memory()["VmRSS"]
    n = SIZE.flood_connections
    with ThreadPoolExecutor(max_workers=16) as pool:
        uploads = list(
            pool.map(
                lambda i: _open_upload(server.port, KINDS[i % 3], i, FLOOD_ANSWER_WAIT_S),
                range(n),
            )
        )
    try:
        held = [u for u in uploads if u.status is None]
        refused = [u for u in uploads if u.status is not None]
        peak_held = server.memory()["VmHWM"] - before
        # The bound and health checks hold while the flood is in: reads carry no body.
        health = httpx.get(server.url + "/health", timeout=10)
        assert health.status_code == 200
        assert 1 <= len(held) <= BOUND // BODY + 1, f"{len(held)} uploads admitted"
        assert len(refused) == n - len(held)
        for upload in refused:
            head, _, body = upload.answer.partition(b"\r\n\r\n")
            assert upload.status == 503, upload.answer[:300]
            assert b"\r\nretry-after: 1\r\n" in head.lower()
            assert is_error_shape(orjson.loads(body))
            assert orjson.loads(body)["error"]["code"] == "overloaded"
        assert peak_held <= HELD_GROWTH_LIMIT, f"peak grew {peak_held / MIB:.0f} MiB"
    finally:
        for upload in uploads:
            if upload.status is None:
                upload.finish()
            upload.sock.close()
    # The admitted ones complete normally once their bodies are whole.
    assert [u.status for u in held] == [201] * len(held), [u.answer[:200] for u in held]
    peak_total = server.memory()["VmHWM"] - before
    # Every charge was released: a full-size body is admitted again.
    with httpx.Client(base_url=server.url, timeout=30) as http:
        after = http.post("/v1/rollouts", content=_doc("after", BODY))
        count_response(section, after)
        assert after.status_code == 201, after.text
    FIGURES.add(
        section,
        floods=1,
        flood_uploads=n,
        admitted=len(held),
        refused_503=len(refused),
        server_errors=0,
    )
    FIGURES.note(
        section,
        bound_mib=BOUND // MIB,
        offered_mib=n * BODY // MIB,
        peak_growth_held_mib=round(peak_held / MIB, 1),
        peak_growth_total_mib=round(peak_total / MIB, 1),
    )


def test_clients_that_leave_mid_upload_release_their_bytes(bounded_server: ServerProcess) -> None:
    server = bounded_server
    # Fill the bound with held uploads, then drop them all without finishing.
    uploads = _open_many(server.port, "declared", 9000, BOUND // BODY)
    assert all(u.status is None for u in uploads), [u.answer[:100] for u in uploads]
    extra = _open_upload(server.port, "declared", 9100, REFUSAL_WAIT_S)
    assert extra.status == 503
    for upload in [*uploads, extra]:
        upload.sock.close()
    # Once the server has seen the disconnects, the whole bound is free again.
    deadline = time.monotonic() + 10
    admitted: list[Upload] = []
    while time.monotonic() < deadline:
        trial = _open_many(server.port, "declared", 9200, BOUND // BODY)
        admitted = [u for u in trial if u.status is None]
        for upload in trial:
            upload.sock.close()
        if len(admitted) == BOUND // BODY:
            break
        time.sleep(0.2)
    assert len(admitted) == BOUND // BODY
    # Nothing of the abandoned uploads was stored, and nothing went wrong in the log.
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/v1/rollouts/flood-9000").status_code == 404
    assert "Traceback" not in server.log_text()


def test_a_request_alone_is_never_refused(bounded_server: ServerProcess) -> None:
    """A bound smaller than one body must not make that body impossible to send."""
    with httpx.Client(base_url=bounded_server.url, timeout=60) as http:
        response = http.post("/v1/rollouts", content=_doc("alone", BOUND + 4 * MIB))
    assert response.status_code == 201, response.text


def test_the_client_rides_out_overload(bounded_server: ServerProcess) -> None:
    """tracestore.client waits out 503 overloaded, never sooner than Retry-After."""
    from tracestore.client import TracestoreClient

    server = bounded_server
    uploads = _open_many(server.port, "declared", 9300, BOUND // BODY)
    assert all(u.status is None for u in uploads)
    sent: list[float] = []
    answers: list[tuple[int, str | None]] = []
    answered = threading.Event()

    def on_response(response: httpx.Response) -> None:
        answers.append((response.status_code, response.headers.get("retry-after")))
        answered.set()

    def release() -> None:
        # The bound stays full until the client was answered (refused), then a while more:
        # it is refused again meanwhile. A timer from the start raced the client's first
        # post (its setup included) on a loaded runner.
        answered.wait(60)
        time.sleep(1.5)
        for upload in uploads:
            upload.finish()
            upload.sock.close()

    releaser = threading.Thread(target=release)
    releaser.start()
    hooks = {
        "request": [lambda _request: sent.append(time.monotonic())],
        "response": [on_response],
    }
    try:
        with TracestoreClient(server.url, max_retries=20, backoff=0.1, event_hooks=hooks) as client:
            result = client.post_rollout(_doc("patient", BODY))
    finally:
        answered.set()  # not answered at all (it failed): the releaser need not wait
        releaser.join(timeout=30)
    assert result["status"] == "created"
    assert answers[0] == (503, "1")  # refused first...
    assert answers[-1][0] == 201  # ...admitted once the bound drained
    for (status, after), t0, t1 in zip(answers, sent, sent[1:], strict=False):
        if status == 503:
            assert t1 - t0 >= float(after or 0), "retried sooner than Retry-After"


def test_gzip_meter_counts_concatenated_members() -> None:
    """The gzip accounting reads multi-member bodies the way api/body.py does."""
    from tracestore.api.limits import _GzipMeter

    data = gzip.compress(b"a" * 1000) + gzip.compress(b"b" * 3000)
    meter = _GzipMeter(stop_after=10**6)
    for i in range(0, len(data), 7):
        meter.feed(data[i : i + 7])
    assert meter.size == 4000
    broken = _GzipMeter(stop_after=10**6)
    broken.feed(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xff\xff\xff\xff")  # block type 3
    assert broken.broken

"""A real server writes each answer's head with its body's first piece (api/server.py
_ClosingTransport): every kind of answer still arrives whole, in order, on a kept-alive
connection (HEAD, 204, 100-continue, pipelined requests)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import h11
import orjson
import pytest

from tests.conftest import minimal_rollout
from tests.reliability.harness import LOOPBACK, ServerProcess

WAIT_S = 10.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`tracestore serve` on SQLite (the writes are the same for both databases)."""
    tmp = tmp_path_factory.mktemp("answer-writes")
    with ServerProcess(f"sqlite:///{tmp / 'store.db'}", tmp / "server.log") as server:
        yield server


class Connection:
    """One kept-alive HTTP/1.1 connection on a raw socket, answers read with h11."""

    def __init__(self, server: ServerProcess) -> None:
        self.sock = socket.create_connection((LOOPBACK, server.port), timeout=WAIT_S)
        self.h11 = h11.Connection(h11.CLIENT)

    def request(self, method: str, target: str, body: bytes = b"", **headers: str) -> bytes:
        """The bytes of one request (not sent)."""
        fields = [("Host", "test"), ("Content-Length", str(len(body))), *headers.items()]
        head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields)
        return head.encode() + b"\r\n" + body

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        """The next whole answer on the connection: status, headers, body."""
        status, headers, body = 0, {}, b""
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                data = self.sock.recv(65536)
                assert data, "the server closed the connection before the answer ended"
                self.h11.receive_data(data)
            elif isinstance(event, h11.InformationalResponse):
                continue
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.h11.start_next_cycle()
                return status, headers, body

    def send(self, data: bytes) -> None:
        """Send raw bytes; h11 is told a request went out so it reads the answer."""
        self.sock.sendall(data)

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


@pytest.fixture
def conn(server: ServerProcess) -> Iterator[Connection]:
    c = Connection(server)
    yield c
    c.close()


def _expect(c: Connection, method: str, target: str, body: bytes = b"") -> None:
    # h11 reads an answer only for a request it saw go out: send through it.
    data = c.h11.send(
        h11.Request(
            method=method,
            target=target,
            headers=[("Host", "test"), ("Content-Length", str(len(body)))],
        )
    )
    data = (data or b"") + (c.h11.send(h11.Data(data=body)) or b"") if body else (data or b"")
    data += c.h11.send(h11.EndOfMessage()) or b""
    c.send(data)


def test_a_head_answer_arrives_and_the_connection_goes_on(conn: Connection) -> None:
    _expect(conn, "HEAD", "/openapi.json")
    status, headers, body = conn.answer()
    assert status == 200
    assert int(headers["content-length"]) > 0
    assert body == b""  # a HEAD's body is never sent
    _expect(conn, "GET", "/health")
    status, _headers, body = conn.answer()
    assert status == 200
    assert orjson.loads(body)["healthy"] is True


def test_an_answer_without_a_body_arrives_and_the_connection_goes_on(
    conn: Connection,
) -> None:
    raw = orjson.dumps(minimal_rollout("writes-204"))
    _expect(conn, "POST", "/v1/rollouts", raw)
    assert conn.answer()[0] == 201
    _expect(conn, "DELETE", "/v1/rollouts/writes-204")
    status, _headers, body = conn.answer()
    assert (status, body) == (204, b"")
    _expect(conn, "GET", "/v1/rollouts/writes-204")
    assert conn.answer()[0] == 404


def test_a_client_waiting_for_100_continue_gets_it_then_its_answer(
    server: ServerProcess,
) -> None:
    raw = orjson.dumps(minimal_rollout("writes-100"))
    with socket.create_connection((LOOPBACK, server.port), timeout=WAIT_S) as sock:
        head = (
            "POST /v1/rollouts HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\nExpect: 100-continue\r\n\r\n"
        )
        sock.sendall(head.encode())
        # The body goes only once the server asks for it: a held 100 would hang here.
        interim = sock.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 "), interim
        sock.sendall(raw)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 201 "), answer
    assert orjson.loads(answer.partition(b"\r\n\r\n")[2])["status"] == "created"


def test_pipelined_requests_are_answered_whole_and_in_order(conn: Connection) -> None:
    raw = orjson.dumps(minimal_rollout("writes-pipe"))
    requests = [
        conn.request("POST", "/v1/rollouts", raw),
        conn.request("HEAD", "/openapi.json"),
        conn.request("GET", "/v1/rollouts/writes-pipe"),
        conn.request("POST", "/v1/rollouts", raw),
    ]
    conn.sock.sendall(b"".join(requests))
    answers: list[tuple[int, bytes]] = []
    buffer = b""
    for method in ("POST", "HEAD", "GET", "POST"):
        parser = h11.Connection(h11.CLIENT)
        parser.send(h11.Request(method=method, target="/", headers=[("Host", "t")]))
        parser.send(h11.EndOfMessage())
        if buffer:  # (empty data tells h11 the connection closed)
            parser.receive_data(buffer)
        status, body = 0, b""
        while True:
            event = parser.next_event()
            if event is h11.NEED_DATA:
                data = conn.sock.recv(65536)
                assert data, answers
                parser.receive_data(data)
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                buffer = bytes(parser.trailing_data[0])
                break
        answers.append((status, body))
    assert [s for s, _ in answers] == [201, 200, 200, 200]
    assert answers[1][1] == b""
    assert orjson.loads(answers[2][1]) == minimal_rollout("writes-pipe")
    assert orjson.loads(answers[3][1])["status"] == "duplicate"

"""api/headers.py: the raw header reader the body limits and the body readers share."""

from __future__ import annotations

from starlette.datastructures import Headers

from tracestore.api.headers import first_headers

NAMES = frozenset((b"content-length", b"content-encoding", b"transfer-encoding"))


def _scope(*headers: tuple[bytes, bytes]) -> dict[str, object]:
    return {"type": "http", "headers": list(headers)}


def test_the_first_of_a_repeated_header_wins_as_in_starlette() -> None:
    scope = _scope(
        (b"content-length", b"10"),
        (b"content-encoding", b"gzip"),
        (b"content-length", b"99"),
        (b"content-encoding", b"br"),
    )
    found = first_headers(scope, NAMES)
    assert found == {b"content-length": b"10", b"content-encoding": b"gzip"}
    starlette = Headers(scope=scope)
    for name, value in found.items():
        assert starlette.get(name.decode()) == value.decode()


def test_absent_headers_are_absent_and_others_ignored() -> None:
    scope = _scope((b"host", b"x"), (b"content-type", b"application/json"))
    assert first_headers(scope, NAMES) == {}
    assert first_headers({"type": "http"}, NAMES) == {}  # no headers at all


def test_every_wanted_header_is_found_wherever_it_stands() -> None:
    scope = _scope(
        (b"transfer-encoding", b"chunked"),
        (b"host", b"x"),
        (b"content-encoding", b"gzip"),
        (b"accept", b"*/*"),
        (b"content-length", b"5"),
    )
    assert first_headers(scope, NAMES) == {
        b"transfer-encoding": b"chunked",
        b"content-encoding": b"gzip",
        b"content-length": b"5",
    }

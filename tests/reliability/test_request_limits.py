"""Bounded memory for every request: request heads bounded in size and time, batch items
counted before they are held, a body's ingest cost estimated before it is parsed.

Before: an 8 MB header line was accepted; 8 unfinished 64 MiB header lines took a worker
from 140 to 644 MiB; a connection sending its head slowly (or nothing) was held forever;
the gzip of millions of `{}` lines posted as one NDJSON batch was refused (413) only after
every line had been split out, at gigabytes of RSS; the largest body of empty objects the
parsed-size estimate admitted took a worker to 595 MiB. A real server (subprocess) with
the default limits (64 MiB body, 256 MiB in flight, 32 KiB heads, 10,000 items, the
parsed-size limit), attacked from raw sockets; its peak memory is read from /proc (VmHWM,
reset before each attack).
"""

from __future__ import annotations

import gzip
import os
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from anyio.from_thread import BlockingPortal
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import EXAMPLES, Database, minimal_rollout
from tests.reliability.harness import FIGURES, LOOPBACK, ServerProcess, is_error_shape
from tracestore.api.app import create_app
from tracestore.api.body import MAX_PER_BYTE, ParsedSize, parsed_estimate
from tracestore.api.overload import ParseBudget, ParsingBusy
from tracestore.api.routes.convert import _cost
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.inspect.run import SIDE_PANELS
from tracestore.settings import Settings

MIB = 1024 * 1024
HEADER_TIMEOUT_S = 1.0
# Growth of the server's peak RSS allowed for an attack whose payload the server must not
# hold: its read buffers and Python's, no payload.
NO_PAYLOAD_GROWTH = 24 * MIB
ANSWER_WAIT_S = 10.0
# The limits the servers here run with (they see no TRACESTORE_* variable but those given).
DEFAULTS = Settings.model_construct()


def _server(tmp: Path) -> ServerProcess:
    # The bounds sit in front of any database code: SQLite stands for both databases.
    env = {"TRACESTORE_HEADER_TIMEOUT": str(HEADER_TIMEOUT_S)}
    return ServerProcess(f"sqlite:///{tmp / 'store.db'}", tmp / "server.log", env=env)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with the default limits and a 1 s deadline for request heads."""
    with _server(tmp_path_factory.mktemp("request-limits")) as server:
        yield server


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """The same, new for one test: memory an earlier attack freed but kept resident would
    hide this attack's growth."""
    with _server(tmp_path) as server:
        # Warm: a batch through the whole path, so first-use costs are not billed to an attack.
        warm = orjson.dumps(minimal_rollout("warm")) + b"\n"
        headers = {"Content-Type": "application/x-ndjson"}
        response = httpx.post(server.url + "/v1/rollouts/batch", content=warm, headers=headers)
        assert response.status_code == 207, response.text
        yield server


def _reset_peak(server: ServerProcess) -> int:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    Path(f"/proc/{server.pid}/clear_refs").write_text("5")
    return server.memory()["VmRSS"]


def _peak_growth(server: ServerProcess, before: int) -> int:
    return server.memory()["VmHWM"] - before


def _answer(sock: socket.socket, wait: float = ANSWER_WAIT_S) -> bytes:
    """What the server sends until it closes or `wait` seconds pass."""
    sock.settimeout(wait)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionError):
        pass
    return data


def _status(answer: bytes) -> int | None:
    return int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else None


def _error_code(answer: bytes) -> str:
    body = orjson.loads(answer.partition(b"\r\n\r\n")[2])
    assert is_error_shape(body), body
    code: str = body["error"]["code"]
    return code


def test_a_header_line_past_the_limit_is_refused_with_431(server: ServerProcess) -> None:
    before = _reset_peak(server)
    with socket.create_connection((LOOPBACK, server.port), timeout=30) as sock:
        # The whole request is sent before anything is read, as most clients do: the
        # answer must still arrive (not a connection reset).
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (8 * MIB) + b"\r\n\r\n")
        answer = _answer(sock)
    assert _status(answer) == 431, answer[:200]
    assert _error_code(answer) == "headers_too_large"
    assert _peak_growth(server, before) <= NO_PAYLOAD_GROWTH
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def _unfinished_header(port: int, size: int) -> bytes:
    with socket.create_connection((LOOPBACK, port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        piece = b"a" * MIB
        try:
            for _ in range(size // MIB):
                sock.sendall(piece)
        except ConnectionError:
            pass  # refused and closed while we were still sending: read the answer
        return _answer(sock)


def test_unfinished_huge_header_lines_hold_no_memory(server: ServerProcess) -> None:
    before = _reset_peak(server)
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda _: _unfinished_header(server.port, 64 * MIB), range(8)))
    growth = _peak_growth(server, before)
    FIGURES.note("request-limits", unfinished_64mib_headers_x8_peak_growth_mib=growth // MIB)
    assert [_status(a) for a in answers] == [431] * 8, [a[:100] for a in answers]
    assert growth <= NO_PAYLOAD_GROWTH, f"peak grew {growth / MIB:.0f} MiB"


def test_a_slow_request_head_is_cut_with_408(server: ServerProcess) -> None:
    with socket.create_connection((LOOPBACK, server.port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # ... and the rest never comes
        start = time.monotonic()
        answer = _answer(sock, wait=HEADER_TIMEOUT_S + ANSWER_WAIT_S)
        took = time.monotonic() - start
    assert _status(answer) == 408, answer[:200]
    assert _error_code(answer) == "request_timeout"
    assert took < HEADER_TIMEOUT_S + 5


def test_a_connection_that_sends_nothing_is_closed(server: ServerProcess) -> None:
    with socket.create_connection((LOOPBACK, server.port), timeout=30) as sock:
        start = time.monotonic()
        answer = _answer(sock, wait=HEADER_TIMEOUT_S + ANSWER_WAIT_S)
        took = time.monotonic() - start
    assert answer == b""  # closed without a word: there was no request to answer
    assert took < HEADER_TIMEOUT_S + 5


def _post_gzip(server: ServerProcess, raw: bytes, content_type: str) -> tuple[httpx.Response, int]:
    body = gzip.compress(raw, compresslevel=9)
    del raw
    before = _reset_peak(server)
    response = httpx.post(
        server.url + "/v1/rollouts/batch",
        content=body,
        headers={"Content-Type": content_type, "Content-Encoding": "gzip"},
        timeout=120,
    )
    return response, _peak_growth(server, before)


def test_a_gzip_ndjson_bomb_of_tiny_items_is_refused_while_it_streams(
    fresh_server: ServerProcess,
) -> None:
    # 20 million `{}` lines: 60 MB decoded (under the 64 MiB body limit), 60 KB on the
    # wire. Counted as they stream in, the batch is refused at its 10,001st line.
    response, growth = _post_gzip(fresh_server, b"{}\n" * 20_000_000, "application/x-ndjson")
    FIGURES.note("request-limits", ndjson_bomb_peak_growth_mib=round(growth / MIB, 1))
    assert response.status_code == 413, response.text[:300]
    assert "at most 10000 rollouts" in response.json()["error"]["message"]
    assert growth <= NO_PAYLOAD_GROWTH, f"peak grew {growth / MIB:.0f} MiB"


def test_blank_lines_are_never_held(fresh_server: ServerProcess) -> None:
    # 30 million blank lines (whitespace only): not items, and never split out one by one.
    response, growth = _post_gzip(fresh_server, b" \n" * 30_000_000, "application/x-ndjson")
    FIGURES.note("request-limits", blank_lines_peak_growth_mib=round(growth / MIB, 1))
    assert response.status_code == 422, response.text[:300]
    assert response.json()["error"]["code"] == "empty_batch"
    assert growth <= NO_PAYLOAD_GROWTH, f"peak grew {growth / MIB:.0f} MiB"


def test_a_gzip_array_bomb_of_tiny_items_is_refused_before_they_are_held(
    fresh_server: ServerProcess,
) -> None:
    # `[true,true,...]`, 5 million elements (25 MB decoded, 25 KB on the wire): cheap
    # enough once parsed to pass the parsed-size estimate (~320 MB of its 400 MiB). The
    # array is held whole (under the body limit, charged to the in-flight bound) but its
    # elements are refused at the 10,001st, before they are sliced out: ~38 bytes each,
    # 190 MB for all of them.
    raw = b"[" + b"true," * 4_999_999 + b"true]"
    assert parsed_estimate(raw) < DEFAULTS.max_parsed_bytes
    response, growth = _post_gzip(fresh_server, raw, "application/json")
    FIGURES.note("request-limits", array_bomb_peak_growth_mib=round(growth / MIB, 1))
    assert response.status_code == 413, response.text[:300]
    assert "at most 10000 rollouts" in response.json()["error"]["message"]
    # The body, its joined copy and its text: about three times 25 MB.
    assert growth <= 128 * MIB, f"peak grew {growth / MIB:.0f} MiB"


def test_a_rollout_of_tiny_values_is_refused_before_it_is_parsed(
    fresh_server: ServerProcess,
) -> None:
    # One valid rollout padded to 60 MiB with 20 million empty objects: 60 KB on the wire,
    # 2 GB once parsed. Its cost is estimated as it streams in (76 bytes per byte for
    # `{},`): refused once the estimate passes TRACESTORE_MAX_PARSED_BYTES (400 MiB),
    # about 5 MiB in, before anything is parsed.
    head = (
        b'{"run_id":"tiny","trajectories":[],"metrics":{"episode_returns":[],'
        b'"mean_return":0,"num_steps":0},"pad":['
    )
    raw = head + b"{}," * 20_000_000 + b"{}]}"
    body = gzip.compress(raw, compresslevel=9)
    del raw
    before = _reset_peak(fresh_server)
    response = httpx.post(
        fresh_server.url + "/v1/rollouts",
        content=body,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        timeout=120,
    )
    growth = _peak_growth(fresh_server, before)
    FIGURES.note("request-limits", tiny_values_rollout_peak_growth_mib=round(growth / MIB, 1))
    assert response.status_code == 413, response.text[:300]
    assert "once parsed" in response.json()["error"]["message"]
    # What was read before the estimate passed the limit (~5 MiB), nothing parsed.
    assert growth <= 48 * MIB, f"peak grew {growth / MIB:.0f} MiB"


# --- the worst body the parsed-size estimate admits -----------------------------------------

_HEAD = (
    b'{"run_id":"%s","trajectories":[],"metrics":{"episode_returns":[],'
    b'"mean_return":0,"num_steps":0},"pad":"'
)
# Printable ASCII but the characters the estimate charges more than a byte for: random
# text of these is what costs most for its estimate (a string's characters, then ~5
# copies of the body compressed only to ~0.82 on PostgreSQL).
_PRINTABLE = bytes(c for c in range(32, 127) if c not in b'"\\{[,:')
_TO_PRINTABLE = bytes.maketrans(
    bytes(range(256)), bytes(_PRINTABLE[i % len(_PRINTABLE)] for i in range(256))
)


def _random_string_rollout(run_id: str, first: str, estimate: int) -> bytes:
    """A rollout holding one random string (after `first`), its estimate just under
    `estimate` bytes."""
    head = _HEAD % run_id.encode() + first.encode()
    tail = b'"}'
    per_byte = parsed_estimate(head + b"a" * 2_000 + tail) - parsed_estimate(
        head + b"a" * 1_000 + tail
    )
    n = (estimate - parsed_estimate(head + tail)) * 1_000 // per_byte
    raw = head + os.urandom(n).translate(_TO_PRINTABLE) + tail
    assert estimate * 0.99 < parsed_estimate(raw) <= estimate
    return raw


@pytest.mark.parametrize("first", ["", "\U0001f600"], ids=["ascii", "emoji-wide"])
def test_the_worst_body_the_estimate_admits_stays_within_twice_the_inflight_limit(
    fresh_db: Database, tmp_path: Path, first: str
) -> None:
    # The shapes that come closest to their estimate (bench/hostile_memory.py measures the
    # others): one string of random printable text, ASCII (50 MiB) or made four bytes a
    # character by one emoji (30 MiB), sent as large as the estimate admits. Stored, and
    # the server's peak RSS stays within 2x TRACESTORE_MAX_INFLIGHT_BYTES (512 MiB), on
    # each database (PostgreSQL's store holds more copies of the body).
    settings = DEFAULTS
    target = 2 * settings.max_inflight_bytes
    raw = _random_string_rollout("worst", first, settings.max_parsed_bytes)
    body = gzip.compress(raw, compresslevel=1)
    over = _random_string_rollout("worst-over", first, int(settings.max_parsed_bytes * 1.03))
    over_body = gzip.compress(over, compresslevel=1)
    del raw, over
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    with ServerProcess(fresh_db.url, tmp_path / "server.log") as server:
        _reset_peak(server)
        response = httpx.post(
            server.url + "/v1/rollouts", content=body, headers=headers, timeout=300
        )
        peak = server.memory()["VmHWM"]
        assert response.status_code == 201, response.text[:300]
        # A little more of the same is refused: the limit, not luck, bounds it.
        refused = httpx.post(
            server.url + "/v1/rollouts", content=over_body, headers=headers, timeout=300
        )
        assert refused.status_code == 413, refused.text[:300]
        assert "once parsed" in refused.json()["error"]["message"]
    key = f"worst_admitted_{'wide' if first else 'ascii'}_{fresh_db.backend}_peak_rss_mib"
    FIGURES.note("request-limits", **{key: round(peak / MIB, 1)})
    assert peak <= target, f"peak RSS {peak / MIB:.0f} MiB, target {target / MIB:.0f} MiB"


# Pieces of the costliest bodies per byte: containers, numbers after separators, keys,
# escapes and characters of every width.
_WORST_PIECES = [
    b"{",
    b"[",
    b",",
    b":",
    b'"',
    b",0",
    b"[-",
    b":9",
    b" ",
    b"\\u00e9",
    b"\\ud83d",
    "é".encode(),
    "\u4e00".encode(),
    "\U0001f600".encode(),
    b"a",
]


def test_the_estimate_does_not_depend_on_how_the_body_arrives() -> None:
    # Chunks of any size (numbers and escapes cut in two, whitespace between a comma and
    # its number), whole or streamed: the same estimate, never less. A `\u` cut before its
    # digits may count as wide: more, never less.
    docs = EXAMPLES.joinpath("rollouts.jsonl").read_bytes().splitlines()[:8]
    docs += [b'[1, -2,\n 3.5 ,[4],{"a":\t5}]', '{"s":"\\u00e9 \\ud83d\\ude00 é"}'.encode()]
    for doc in docs:
        whole = parsed_estimate(doc)
        for size in (1, 2, 3, 5, 7, 64):
            streamed = ParsedSize()
            for start in range(0, len(doc), size):
                streamed.feed(doc[start : start + size])
            if b"\\u" in doc:
                assert streamed.total >= whole, (doc[:60], size)
            else:
                assert streamed.total == whole, (doc[:60], size)
    # A number is charged its object (32 bytes), after whitespace too: the same bytes
    # with letters for digits cost two numbers less.
    assert parsed_estimate(b"[\n -2,\t7]") - parsed_estimate(b"[\n ab,\tc]") == 2 * 32


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_WORST_PIECES), min_size=1, max_size=400))
def test_no_byte_is_charged_more_than_the_bound_the_count_skips_by(pieces: list[bytes]) -> None:
    # api/body.py counts nothing of a body shorter than max_parsed / MAX_PER_BYTE: that is
    # safe only if no body is estimated at more than MAX_PER_BYTE a byte.
    body = b"".join(pieces)
    assert parsed_estimate(body) <= MAX_PER_BYTE * len(body)


def test_a_body_too_small_to_pass_the_limit_is_not_counted_but_a_larger_one_is(
    tmp_path: Path,
) -> None:
    # The most expensive body per byte the estimate knows, either side of the size from
    # which counting starts (the parsed-size limit scaled down to keep the bodies small).
    limit = 64 * 1024
    worst = "\U0001f600".encode() + b"{" * (limit // MAX_PER_BYTE + 64)
    small, large = worst[: limit // MAX_PER_BYTE], worst
    assert parsed_estimate(small) <= limit < parsed_estimate(large)
    url = _migrated(tmp_path)
    app = create_app(Settings(database_url=url, max_parsed_bytes=limit))
    with TestClient(app) as client:
        for body, refused in ((small, False), (large, True)):
            response = client.post("/v1/rollouts", content=body)
            assert (response.status_code == 413) is refused, response.text[:200]


def test_the_parse_budget_lets_ingests_in_only_while_their_charges_fit() -> None:
    # api/overload.py ParseBudget: what bounds several hostile bodies parsed at once.
    async def scenario() -> list[str]:
        budget = ParseBudget(limit=100, wait=0.5)
        seen: list[str] = []
        first_in = anyio.Event()
        release_first = anyio.Event()

        async def first() -> None:
            async with budget.hold(80):
                seen.append("first in")
                first_in.set()
                await release_first.wait()
            seen.append("first out")

        async def second() -> None:
            await first_in.wait()
            async with budget.hold(30):  # 80 + 30 > 100: waits for the first
                seen.append(f"second in, {budget.held} held")

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            tg.start_soon(second)
            await first_in.wait()
            await anyio.sleep(0.05)
            assert seen == ["first in"], seen  # the second is still waiting
            release_first.set()
        # Alone, a charge past the whole budget still goes in: a worker always progresses.
        async with budget.hold(1_000):
            seen.append("alone past the limit")
        # One that never fits within the wait is refused (503 overloaded), holding nothing.
        async with budget.hold(90):
            with pytest.raises(ParsingBusy):
                async with budget.hold(20):
                    pass
            assert budget.held == 90
        # A smaller exact charge is asked for only when the bound does not fit.
        asked: list[int] = []

        def exact(charge: int) -> Callable[[], int]:
            def estimate() -> int:
                asked.append(charge)
                return charge

            return estimate

        async with budget.hold(60), budget.hold(70, exact(30)):
            assert budget.held == 90
        async with budget.hold(10, exact(5)):
            assert budget.held == 10
        assert asked == [30]
        return seen

    assert anyio.run(scenario) == [
        "first in",
        "first out",
        "second in, 30 held",
        "alone past the limit",
    ]


def _migrated(tmp_path: Path) -> str:
    """The URL of a migrated SQLite store in `tmp_path`."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = create_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    return url


def _budget(client: TestClient) -> tuple[ParseBudget, BlockingPortal]:
    """The parse budget of the app `client` serves, and the client's portal to the app's
    event loop, where the budget lives (a test holds it through the portal)."""
    assert client.portal is not None
    budget: ParseBudget = client.app.state.tracestore.lanes.parsing  # type: ignore[attr-defined]
    return budget, client.portal


@pytest.mark.parametrize("path", ["/v1/convert?to=trace", "/v1/rollouts"])
def test_conversions_wait_for_the_parse_budget_as_ingests_do(tmp_path: Path, path: str) -> None:
    # POST /v1/convert parses the whole body as an ingest does; outside the budget, eight
    # conversions at once of the empty-objects body the estimate admits took a worker to
    # 431-675 MiB (`bench.hostile_memory --only concurrent_converts_under_cap`). With the
    # budget full, a conversion waits (TRACESTORE_DB_WAIT) and is refused 503 overloaded,
    # having parsed nothing; once there is room, it is answered. /v1/rollouts: the same.
    url = _migrated(tmp_path)
    app = create_app(Settings(database_url=url, db_wait=0.3))
    body = orjson.dumps(minimal_rollout("budget-1"))
    headers = {"Content-Type": "application/json"}
    with TestClient(app) as client:
        budget, portal = _budget(client)
        with portal.wrap_async_context_manager(budget.hold(budget.limit)):
            refused = client.post(path, content=body, headers=headers)
            assert refused.status_code == 503, refused.text[:300]
            assert refused.json()["error"]["code"] == "overloaded"
            assert budget.held == budget.limit
        answered = client.post(path, content=body, headers=headers)
        assert answered.status_code in (200, 201), answered.text[:300]
        assert budget.held == 0
        if path.startswith("/v1/convert"):
            assert answered.json()["document"]["trace"]["session_id"]
        # Nothing of the refused post was stored; a conversion stores nothing at all.
        stored = [item["run_id"] for item in client.get("/v1/rollouts").json()["items"]]
        assert stored == (["budget-1"] if path == "/v1/rollouts" else [])


def _one_line_steps(n: int) -> bytes:
    steps = [{"reward": 0, "done": False}] * n
    doc = minimal_rollout("convert-steps")
    doc["trajectories"][0]["steps"] = steps
    return orjson.dumps(doc)


def test_a_conversion_holds_what_converting_costs_not_only_its_parse(tmp_path: Path) -> None:
    # One-line steps cost ~7x their parsed-size estimate converted to a trace (a time step,
    # events and messages each; bench.convert_memory): charged only the estimate, a 5 MiB
    # body of them took a worker 574 MiB past its start. The rest is held too: with room
    # for the parse but not the conversion, it waits and is refused 503; a document whose
    # conversion alone passes the budget is refused 413, though an ingest takes it.
    url = _migrated(tmp_path)
    body = _one_line_steps(20_000)
    estimate = parsed_estimate(body)
    cost = _cost(body, "trace")
    assert cost > estimate + 16 * MIB  # the conversion's own part, beyond the parse
    headers = {"Content-Type": "application/json"}
    app = create_app(Settings(database_url=url, db_wait=0.3))
    with TestClient(app) as client:
        budget, portal = _budget(client)
        others = budget.limit - estimate - 8 * MIB  # the parse fits, the conversion not
        with portal.wrap_async_context_manager(budget.hold(others)):
            refused = client.post("/v1/convert?to=trace", content=body, headers=headers)
            assert refused.status_code == 503, refused.text[:300]
            assert refused.json()["error"]["code"] == "overloaded"
        assert budget.held == 0
        answered = client.post("/v1/convert?to=trace", content=body, headers=headers)
        assert answered.status_code == 200, answered.text[:300]
        assert len(answered.json()["document"]["trace"]["session_time_steps"]) == 20_000
    # A budget the parse fits in but not the conversion: 413, and the same body ingests.
    small = int(estimate * 1.5)
    assert estimate < small < cost
    app = create_app(Settings(database_url=url, max_parsed_bytes=small))
    with TestClient(app) as client:
        too_large = client.post("/v1/convert?to=trace", content=body, headers=headers)
        assert too_large.status_code == 413, too_large.text[:300]
        assert "converting this document" in too_large.json()["error"]["message"]
        stored = client.post("/v1/rollouts", content=body, headers=headers)
        assert stored.status_code == 201, stored.text[:300]


def test_conversions_at_once_that_fit_one_at_a_time_are_all_answered(tmp_path: Path) -> None:
    # Each conversion fits the budget alone, two do not. Holding its parse while waiting
    # for the rest, each kept the other out until its wait ran out (a helper's review:
    # four at once, two 503 after the wait); in two passes of one hold each, they take
    # turns. The wait must outlast three conversions ahead (~0.9 s each alone, several
    # times that on two cores busy with the rest of the suite: a 3 s wait ran out once);
    # with the old hold, two of them still waited the whole wait and were refused.
    url = _migrated(tmp_path)
    body = _one_line_steps(20_000)
    cost = _cost(body, "trace")
    headers = {"Content-Type": "application/json"}
    app = create_app(Settings(database_url=url, max_parsed_bytes=cost + 8 * MIB, db_wait=60))
    with TestClient(app) as client, ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(
            pool.map(
                lambda _: client.post("/v1/convert?to=trace", content=body, headers=headers),
                range(4),
            )
        )
        assert [a.status_code for a in answers] == [200] * 4, [a.text[:200] for a in answers]
        assert _budget(client)[0].held == 0


def _until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    """Wait until `condition()` holds (polled), failing with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never came: {what}"
        time.sleep(0.01)


@contextmanager
def _steps_stored(
    tmp_path: Path, db_wait: float = 0.3, **settings: Any
) -> Iterator[tuple[TestClient, str, int, int]]:
    """A client of an app over a new store holding the trajectories-only run
    `convert-steps` of 20,000 one-line steps (TRACESTORE_DB_WAIT `db_wait`); the store's
    URL, the run's parsed-size estimate, and a charge that leaves the budget room for the
    run's parse but not for its conversion."""
    url = _migrated(tmp_path)
    body = _one_line_steps(20_000)
    estimate = parsed_estimate(body)
    headers = {"Content-Type": "application/json"}
    app = create_app(Settings(database_url=url, db_wait=db_wait, **settings))
    with TestClient(app) as client:
        assert client.post("/v1/rollouts", content=body, headers=headers).status_code == 201
        budget = _budget(client)[0]
        yield client, url, estimate, budget.limit - estimate - 8 * MIB


def test_served_reads_parse_and_convert_inside_the_parse_budget(tmp_path: Path) -> None:
    # GET .../trace of a run stored with trajectories only converts it on every read: a
    # stored rollout of one-line steps cost such a read ~7x its estimate, outside any
    # bound. Now the parse holds the budget, and a conversion holds what it costs: with
    # room for the parse only, the converting read waits and is refused 503, while the
    # read of the stored part is served. A conversion costing past the whole budget is
    # still served (a stored run is always readable), alone.
    with _steps_stored(tmp_path) as (client, url, estimate, others):
        budget, portal = _budget(client)
        with portal.wrap_async_context_manager(budget.hold(others)):
            refused = client.get("/v1/rollouts/convert-steps/trace")
            assert refused.status_code == 503, refused.text[:300]
            assert refused.json()["error"]["code"] == "overloaded"
            stored = client.get("/v1/rollouts/convert-steps/trajectories")
            assert stored.status_code == 200, stored.text[:300]
            assert stored.headers["X-Tracestore-Source"] == "stored"
        assert budget.held == 0
        served = client.get("/v1/rollouts/convert-steps/trace")
        assert served.status_code == 200, served.text[:300]
        assert served.headers["X-Tracestore-Source"] == "converted"
        assert len(served.json()["session_time_steps"]) == 20_000
        missing = client.get("/v1/rollouts/no-such-run/trace")
        assert missing.status_code == 404
        # A run with neither part is answered 404 from its run row, budget full or not.
        bare = {**minimal_rollout("bare"), "trajectories": [], "trace": None}
        assert client.post("/v1/rollouts", json=bare).status_code == 201
        with portal.wrap_async_context_manager(budget.hold(budget.limit)):
            for part in ("trace", "trajectories"):
                nothing = client.get(f"/v1/rollouts/bare/{part}")
                assert nothing.status_code == 404, nothing.text[:300]
                assert "no full trace (its trace is null)" in nothing.json()["error"]["message"]
        assert budget.held == 0
    app = create_app(Settings(database_url=url, max_parsed_bytes=int(estimate * 1.5)))
    with TestClient(app) as client:
        alone = client.get("/v1/rollouts/convert-steps/trace")
        assert alone.status_code == 200, alone.text[:300]
        assert len(alone.json()["session_time_steps"]) == 20_000


def test_inspections_that_convert_a_part_hold_the_parse_budget(tmp_path: Path) -> None:
    # The inspector (its JSON and the run page) converts the part a run lacks on read:
    # eight inspections at once of a stored run of 200,000 one-line steps took a worker to
    # 4.1 GiB, outside any bound (`bench.hostile_memory --only concurrent_inspections`).
    # Now an inspection that converts holds what converting costs: with room for the
    # parse only, it waits and is refused 503, while inspections that convert nothing
    # (a run with both parts, a panel that reads no part, a run that is not there) are
    # answered with the budget full.
    with _steps_stored(tmp_path) as (client, _, _, others):
        # A run with both parts: the minimal rollout and its trace.
        both_id = "both-parts"
        both = client.post("/v1/convert?to=trace", json=minimal_rollout(both_id))
        assert client.post("/v1/rollouts", json=both.json()["document"]).status_code == 201
        # A trace-only run (its trajectories converted on read), charged as much as the
        # trajectories-only one: the same room leaves out both conversions.
        trace = client.post("/v1/convert?to=trace", content=_one_line_steps(20_000))
        trace_only = {**trace.json()["document"], "run_id": "trace-only", "trajectories": []}
        assert client.post("/v1/rollouts", json=trace_only).status_code == 201
        budget, portal = _budget(client)
        with portal.wrap_async_context_manager(budget.hold(others)):
            for path in ("/v1/inspect/convert-steps", "/runs/convert-steps"):
                refused = client.get(path)
                assert refused.status_code == 503, (path, refused.text[:300])
                assert refused.json()["error"]["code"] == "overloaded"
            for run_id in ("convert-steps", "trace-only"):
                for panel in SIDE_PANELS:
                    refused = client.get(f"/v1/inspect/{run_id}?panel={panel}")
                    assert refused.status_code == 503, (run_id, panel, refused.text[:300])
        with portal.wrap_async_context_manager(budget.hold(budget.limit)):
            for path in (
                f"/v1/inspect/{both_id}",
                f"/runs/{both_id}",
                "/v1/inspect/convert-steps?panel=drift",
                "/v1/inspect/convert-steps?panel=header",
            ):
                served = client.get(path)
                assert served.status_code == 200, (path, served.text[:300])
            assert client.get("/v1/inspect/no-such-run").status_code == 404
            assert budget.held == budget.limit
        assert budget.held == 0
        inspected = client.get("/v1/inspect/convert-steps")
        assert inspected.status_code == 200, inspected.text[:300]
        parts = {p["part"]: p["source"] for p in inspected.json()["parts"]}
        assert parts == {"trajectories": "stored", "trace": "converted"}
        parts_of_trace_only = client.get("/v1/inspect/trace-only?panel=parts").json()["parts"]
        assert {p["part"]: p["source"] for p in parts_of_trace_only} == {
            "trajectories": "converted",
            "trace": "stored",
        }
        assert inspected.json()["steps"]["total"] == 20_000
        page = client.get("/runs/convert-steps?step=19999")
        assert page.status_code == 200
        assert "converted from the trajectories on read" in page.text
        assert budget.held == 0


def test_reads_that_wait_for_the_budget_answer_the_run_as_stored_after_the_wait(
    tmp_path: Path,
) -> None:
    # A converting read that must wait for the budget drops the document it loaded (any
    # number of reads may wait, each keeping up to the largest body outside any bound)
    # and reads the run again once there is room. So a run deleted and stored anew
    # meanwhile is answered as stored now: a helper's review found an inspection that
    # answered the new run's header with the deleted run's converted steps.
    new = _one_line_steps(3)  # the same run_id, three steps
    headers = {"Content-Type": "application/json"}
    paths = ("/v1/rollouts/convert-steps/trace", "/v1/inspect/convert-steps")
    with _steps_stored(tmp_path, db_wait=30) as (client, _, _, _), ThreadPoolExecutor(2) as pool:
        budget, portal = _budget(client)
        # Room for the new post, not for either conversion of the stored run.
        with portal.wrap_async_context_manager(budget.hold(budget.limit - MIB)):
            waiting = [pool.submit(client.get, path) for path in paths]
            _until(lambda: budget.waiting == len(paths), "the reads wait for the budget")
            assert client.delete("/v1/rollouts/convert-steps").status_code == 204
            assert client.post("/v1/rollouts", content=new, headers=headers).status_code == 201
        trace, inspected = (future.result(timeout=60) for future in waiting)
    assert trace.status_code == 200, trace.text[:300]
    assert len(trace.json()["session_time_steps"]) == 3
    assert inspected.status_code == 200, inspected.text[:300]
    assert inspected.json()["header"]["n_steps"] == 3
    assert inspected.json()["steps"]["total"] == 3
    assert len(inspected.json()["rewards"]["trace"]) == 3


def test_a_read_waiting_for_a_read_slot_holds_none_of_the_budget(tmp_path: Path) -> None:
    # A converting read that waited for the budget needs a read slot too, once in. Holding
    # the budget while it waited for one (reports hold slots for seconds), a read charged
    # past the whole budget kept every ingest waiting (a helper's review: an ingest 1.8 s
    # behind it, the read then 503 database_busy). It gives the budget back and waits for
    # a slot holding nothing; an ingest meanwhile is answered at once.
    estimate = parsed_estimate(_one_line_steps(20_000))
    small = orjson.dumps(minimal_rollout("during-the-wait"))
    headers = {"Content-Type": "application/json"}
    # The only read slot; a budget the run's conversion passes (it goes in alone).
    limits = {"db_pool_size": 1, "max_parsed_bytes": int(estimate * 1.5)}
    with (
        _steps_stored(tmp_path, db_wait=8, **limits) as (client, _, _, _),
        ThreadPoolExecutor(2) as pool,
        ExitStack() as slot,
    ):
        budget, portal = _budget(client)
        reads = client.app.state.tracestore.lanes.reads  # type: ignore[attr-defined]
        with portal.wrap_async_context_manager(budget.hold(1)):  # no room at once: it waits
            read = pool.submit(client.get, "/v1/rollouts/convert-steps/trace")
            _until(lambda: budget.waiting == 1, "the read waits for the budget")
            slot.enter_context(portal.wrap_async_context_manager(reads.slot()))
        _until(lambda: reads.waiting == 1, "the read waits for the read slot")
        assert budget.held == 0
        post = pool.submit(client.post, "/v1/rollouts", content=small, headers=headers)
        # Answered while the read still waits for its slot: behind the read's charge it got
        # in only once the read gave up, db_wait later. That, not how long the post took, is
        # the check (a loaded runner may take seconds over one that takes 50 ms alone).
        assert post.result(timeout=30).status_code == 201
        assert reads.waiting == 1, "the ingest got in only once the read gave up its wait"
        slot.close()
        served = read.result(timeout=60)
        assert served.status_code == 200, served.text[:300]
        assert len(served.json()["session_time_steps"]) == 20_000


def test_a_read_that_waited_holds_what_the_run_costs_now(tmp_path: Path) -> None:
    # A read that waited reads the run again once in; a run stored anew meanwhile may cost
    # more than the one it was charged for (a helper's review: a 1,000-step run replaced
    # by a 150,000-step one was converted holding 5.6 MiB of the budget, converting it
    # costs 842 MiB). It gives the budget back and waits for what the run costs now.
    url = _migrated(tmp_path)
    small, large = _one_line_steps(2_000), _one_line_steps(10_000)  # one run_id
    small_cost, large_cost = _cost(small, "trace"), _cost(large, "trace")
    assert parsed_estimate(large) + MIB < small_cost < large_cost
    headers = {"Content-Type": "application/json"}
    app = create_app(Settings(database_url=url, db_wait=30))
    with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
        assert client.post("/v1/rollouts", content=small, headers=headers).status_code == 201
        budget, portal = _budget(client)
        # Room for the small run's conversion, not the large one's.
        room_for_small = budget.limit - small_cost
        with portal.wrap_async_context_manager(budget.hold(room_for_small)):
            # And, a while, not even for the small one's: the read waits; the large run
            # (its ingest charged its estimate) is stored meanwhile.
            with portal.wrap_async_context_manager(budget.hold(MIB)):
                read = pool.submit(client.get, "/v1/rollouts/convert-steps/trace")
                _until(lambda: budget.waiting == 1, "the read waits for the budget")
                assert client.delete("/v1/rollouts/convert-steps").status_code == 204
                stored = client.post("/v1/rollouts", content=large, headers=headers)
                assert stored.status_code == 201, stored.text[:300]
            # In with the small run's charge, it finds the large run: it must wait again.
            time.sleep(2)
            assert not read.done(), read.result().text[:200]
            assert budget.held == room_for_small
        served = read.result(timeout=60)
    assert served.status_code == 200, served.text[:300]
    assert len(served.json()["session_time_steps"]) == 10_000


def test_a_read_that_waited_for_a_slot_keeps_its_turn(tmp_path: Path) -> None:
    # Waiting for a read slot, a read that gave its slot back at once to try for the budget
    # lost its turn in the slots' queue each time (a helper's review: one slot, three
    # readers holding it 50 ms in turn: the read refused 503 after 2.3 s while 51 others
    # were served). It keeps the slot it waited for when the budget has room. It waits
    # 0.15 s alone; a db_wait of 10 s leaves room for a loaded runner, and a read that loses
    # its turn is still refused then: the readers go on until it is answered.
    with _steps_stored(tmp_path, db_wait=10, db_pool_size=1) as (client, _, _, others):
        budget, portal = _budget(client)
        reads = client.app.state.tracestore.lanes.reads  # type: ignore[attr-defined]
        stop = anyio.Event()

        async def reader() -> None:  # takes the only slot for 50 ms, again and again
            while not stop.is_set():
                async with reads.slot(wait=30):
                    await anyio.sleep(0.05)

        with ThreadPoolExecutor(1) as pool:
            with portal.wrap_async_context_manager(budget.hold(others)):  # the read waits
                read = pool.submit(client.get, "/v1/rollouts/convert-steps/trace")
                _until(lambda: budget.waiting == 1, "the read waits for the budget")
                readers = [portal.start_task_soon(reader) for _ in range(3)]
                _until(lambda: reads.waiting >= 2, "the readers queue for the slot")
            try:
                served = read.result(timeout=60)
            finally:
                portal.call(stop.set)
                for task in readers:
                    task.result(timeout=30)
    assert served.status_code == 200, served.text[:300]
    assert len(served.json()["session_time_steps"]) == 20_000

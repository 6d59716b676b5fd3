"""tracestore.client against a real server: restarts, spooling, bounded retries, refusals.

The sync and the async client both ride out a SIGKILL and restart of the server in the
middle of a stream; with a spool they keep every rollout while the server is down and
deliver it on the next contact (a duplicate counts as delivered); the spool survives a
crash of the producer mid-append; conflicts and other 4xx are surfaced at once and never
spooled; retries stop after their count or their time.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import Engine

from tests.conftest import free_port
from tests.reliability.harness import (
    FIGURES,
    RolloutFactory,
    ServerProcess,
    hooks,
    run_id_of,
    stored_documents,
)
from tracestore.client import (
    AsyncTracestoreClient,
    Spool,
    TracestoreClient,
    TracestoreHTTPError,
    UnexpectedAnswer,
)
from tracestore.db.engine import create_engine

SECTION = "client"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One running server for the tests that never stop it."""
    tmp = tmp_path_factory.mktemp("client")
    with ServerProcess(f"sqlite:///{tmp / 'store.db'}", tmp / "server.log") as server:
        yield server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server on a new SQLite store (started by each test when it wants it)."""
    server = ServerProcess(f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "server.log")
    yield server
    server.stop()


@pytest.fixture
def store(server: ServerProcess) -> Iterator[Engine]:
    """An engine on the server's store."""
    engine = create_engine(server.db_url)
    yield engine
    engine.dispose()


# Quick, many retries, bounded in time: enough to ride out a restart.
PATIENT: dict[str, Any] = {
    "max_retries": 1000,
    "backoff": 0.05,
    "max_backoff": 0.3,
    "max_retry_time": 60,
}


def _wait_for(acked: list[str], n: int) -> None:
    deadline = time.monotonic() + 60
    while len(acked) < n:
        assert time.monotonic() < deadline, "the stream stalled"
        time.sleep(0.01)


def _assert_stored(store: Engine, raws: list[bytes]) -> None:
    documents = stored_documents(store)
    expected = {run_id_of(r): r for r in raws}
    assert {r: documents.get(r) for r in expected} == expected


def test_sync_client_survives_a_restart_mid_stream_and_spools_while_down(
    server: ServerProcess, store: Engine, tmp_path: Path
) -> None:
    """A patient producer rides out a SIGKILL + restart; an impatient one spools meanwhile."""
    factory = RolloutFactory("sync", max_bytes=60_000)
    streamed = [factory.make("stream-") for _ in range(60)]
    spool_path = tmp_path / "producer.spool"
    acked: list[str] = []
    errors: list[BaseException] = []
    server.start()

    def stream() -> None:
        client = TracestoreClient(server.url, event_hooks=hooks(SECTION), **PATIENT)
        try:
            with client:
                for i, raw in enumerate(streamed):
                    if i % 4 == 3:
                        status = client.post_batch([raw])["results"][0]["status"]
                    else:
                        status = client.post_rollout(raw)["status"]
                    assert status in ("created", "duplicate")
                    acked.append(run_id_of(raw))
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    streamer = threading.Thread(target=stream)
    streamer.start()
    _wait_for(acked, 15)
    server.kill()  # mid-stream
    # While the server is down, an impatient producer with a spool keeps its rollouts.
    impatient = TracestoreClient(
        server.url, spool=spool_path, max_retries=3, backoff=0.01, max_retry_time=0.5
    )
    early = [factory.make("spooled-") for _ in range(5)]
    batch = [factory.make("spooled-") for _ in range(4)]
    with impatient:
        for raw in early:
            assert impatient.post_rollout(raw) == {
                "run_id": run_id_of(raw),
                "status": "spooled",
                "spool": str(spool_path),
            }
        assert impatient.post_batch(batch)["summary"] == {"total": 4, "spooled": 4}
        assert Spool(spool_path).pending() == 9
        server.start()
        FIGURES.add(SECTION, restarts=1)
        # One of them reached the store some other way (a retry elsewhere): duplicate.
        httpx.post(server.url + "/v1/rollouts", content=early[0], timeout=30)
        late = factory.make("late-")
        assert impatient.post_rollout(late)["status"] == "created"  # the next contact...
        assert Spool(spool_path).pending() == 0  # ...delivered the whole spool
    streamer.join(timeout=120)
    assert not errors, errors
    assert len(acked) == len(streamed)
    _assert_stored(store, [*streamed, *early, *batch, late])
    assert not Path(str(spool_path) + ".rejected").exists()
    FIGURES.add(SECTION, acknowledged=len(acked), spooled=9, replayed=9, verified=70)


def test_async_client_survives_a_restart_mid_stream_and_replays_its_spool(
    server: ServerProcess, store: Engine, tmp_path: Path
) -> None:
    factory = RolloutFactory("async", max_bytes=60_000)
    streamed = [factory.make("stream-") for _ in range(40)]
    spooled = [factory.make("spooled-") for _ in range(6)]
    acked: list[str] = []
    server.start()

    async def scenario() -> None:
        patient = AsyncTracestoreClient(server.url, **PATIENT)
        impatient = AsyncTracestoreClient(
            server.url,
            spool=tmp_path / "async.spool",
            max_retries=2,
            backoff=0.01,
            max_retry_time=0.5,
            replay_on_contact=False,
        )
        async with patient, impatient:

            async def one(raw: bytes) -> None:
                body = await patient.post_rollout(raw)
                assert body["status"] in ("created", "duplicate")
                acked.append(run_id_of(raw))

            async def stream() -> None:
                # Four producers at a time on one event loop.
                for i in range(0, len(streamed), 4):
                    await asyncio.gather(*(one(r) for r in streamed[i : i + 4]))

            streaming = asyncio.create_task(stream())
            while len(acked) < 12:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(server.kill)
            results = await asyncio.gather(*(impatient.post_rollout(r) for r in spooled))
            assert {r["status"] for r in results} == {"spooled"}
            await asyncio.to_thread(server.start)
            FIGURES.add(SECTION, restarts=1)
            replay = await impatient.replay()
            assert (replay.delivered, replay.rejected, replay.remaining) == (6, 0, 0)
            assert (await impatient.replay()).delivered == 0
            await streaming
            batch = await patient.post_batch([factory.make("batch-") for _ in range(3)])
            assert batch["summary"]["created"] == 3

    asyncio.run(asyncio.wait_for(scenario(), timeout=180))
    assert len(acked) == len(streamed)
    _assert_stored(store, [*streamed, *spooled])
    FIGURES.add(SECTION, acknowledged=len(acked), spooled=6, replayed=6, verified=46)


_WRITER = textwrap.dedent(
    """
    import sys
    from tracestore.client import Spool
    spool = Spool(sys.argv[1])
    for i in range(int(sys.argv[3])):
        raw = ('{"run_id": "%s-%05d", "pad": "' % (sys.argv[2], i)).encode() + b"x" * 5000
        spool.append([raw + b'"}'])
        print(i, flush=True)  # printed only once the record is fsynced
    """
)


def _writer(spool: Path, name: str, n: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(spool), name, str(n)],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_spool_keeps_every_fsynced_record_when_the_producer_is_killed(tmp_path: Path) -> None:
    spool_path = tmp_path / "killed.spool"
    writer = _writer(spool_path, "killed", 100_000)
    assert writer.stdout is not None
    confirmed = 0
    for line in writer.stdout:
        confirmed = int(line) + 1
        if confirmed >= 200:
            break
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    # A write torn by the crash looks like this: a header and half a record.
    with open(spool_path, "ab") as handle:
        handle.write(b"TSR1 5000 0badc0de\n" + b"{" * 100)
    spool = Spool(spool_path)
    spool.append([b'{"run_id": "after-the-crash"}'])  # the restarted producer goes on
    records = [orjson.loads(r)["run_id"] for r in _records(spool)]
    assert records[-1] == "after-the-crash"
    assert len(records) - 1 >= confirmed
    assert records[:-1] == [f"killed-{i:05d}" for i in range(len(records) - 1)]


def _records(spool: Spool) -> list[bytes]:
    with spool.replay_session() as session:
        assert session is not None
        records = session.take()
        session.finish(records, [("failed", "kept")] * len(records))  # put them back
        assert session.result.damaged >= 1
    return records


def test_spool_takes_appends_from_several_processes_at_once(tmp_path: Path) -> None:
    spool_path = tmp_path / "shared.spool"
    writers = [_writer(spool_path, f"w{i}", 150) for i in range(3)]
    for writer in writers:
        assert writer.wait(timeout=120) == 0
    got = sorted(orjson.loads(r)["run_id"] for r in _records_clean(Spool(spool_path)))
    assert got == sorted(f"w{i}-{j:05d}" for i in range(3) for j in range(150))


def _records_clean(spool: Spool) -> list[bytes]:
    with spool.replay_session() as session:
        assert session is not None
        records = session.take()
        assert session.result.damaged == 0
        session.finish(records, [("failed", "kept")] * len(records))
    return records


def test_conflicts_and_invalid_rollouts_surface_at_once_and_are_never_spooled(
    shared: ServerProcess, tmp_path: Path
) -> None:
    server = shared
    spool_path = tmp_path / "never.spool"
    raw = RolloutFactory("refused").make()
    other = orjson.dumps({**orjson.loads(raw), "extra": 1})
    statuses: list[int] = []
    with TracestoreClient(
        server.url,
        spool=spool_path,
        event_hooks={"response": [lambda r: statuses.append(r.status_code)]},
    ) as client:
        assert client.post_rollout(raw)["status"] == "created"
        assert client.post_rollout(raw)["status"] == "duplicate"  # success, not an error
        with pytest.raises(TracestoreHTTPError) as conflict:
            client.post_rollout(other)
        assert (conflict.value.status, conflict.value.code) == (409, "conflict")
        with pytest.raises(TracestoreHTTPError) as invalid:
            client.post_rollout({"run_id": "x"})
        assert (invalid.value.status, invalid.value.code) == (422, "invalid_rollout")
        with pytest.raises(TracestoreHTTPError) as not_json:
            client.post_rollout(b"{nope")
        assert not_json.value.status == 400
    assert statuses == [201, 200, 409, 422, 400]  # one request each: no retry
    assert not spool_path.exists()


def test_retries_stop_after_their_count_and_their_time(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    attempts: list[str] = []
    counting = {"request": [lambda request: attempts.append(str(request.url))]}
    raw = RolloutFactory("nowhere").make()
    client = TracestoreClient(closed, max_retries=3, backoff=0.01, event_hooks=counting)
    with client, pytest.raises(httpx.TransportError):
        client.post_rollout(raw)
    assert len(attempts) == 4  # the first try and three retries
    start = time.monotonic()
    client = TracestoreClient(closed, max_retries=10**6, backoff=0.05, max_retry_time=1.0)
    with client, pytest.raises(httpx.TransportError):
        client.post_rollout(raw)
    assert time.monotonic() - start < 3.0

    async def async_budget() -> None:
        async with AsyncTracestoreClient(
            closed, max_retries=10**6, backoff=0.05, max_retry_time=1.0
        ) as client:
            with pytest.raises(httpx.TransportError):
                await client.post_rollout(raw)

    start = time.monotonic()
    asyncio.run(async_budget())
    assert time.monotonic() - start < 3.0


def test_large_rollouts_go_gzipped_and_are_stored_exactly(shared: ServerProcess) -> None:
    server = shared
    factory = RolloutFactory("gzipped", max_bytes=10**9)
    factory.templates.sort(key=lambda d: -len(orjson.dumps(d)))
    big, small = (
        factory.make(),
        orjson.dumps({**orjson.loads(factory.make()), "trace": None, "trajectories": []}),
    )
    encodings: dict[int, str | None] = {}

    def record(request: httpx.Request) -> None:
        encodings[len(request.content)] = request.headers.get("content-encoding")

    with TracestoreClient(server.url, event_hooks={"request": [record]}) as client:
        client.post_rollout(big)
        client.post_rollout(small)
    assert len(big) > 64 * 1024 > len(small)
    assert set(encodings.values()) == {"gzip", None}
    assert min(encodings) < len(big) // 2  # the big one went compressed
    engine = create_engine(server.db_url)
    try:
        _assert_stored(engine, [big, small])
    finally:
        engine.dispose()


@pytest.fixture
def not_tracestore() -> Iterator[str]:
    """A real HTTP server answering every request 200 with a sign-in page (a proxy or a
    wrong base URL in front of, or instead of, tracestore)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class SignIn(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            page = b"<html><body>Please sign in</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), SignIn)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_success_that_is_not_tracestores_answer_is_not_taken_for_stored(
    not_tracestore: str, tmp_path: Path
) -> None:
    # A 200 with HTML returned {"error": {...}} from post_rollout as if it had worked: the
    # rollout was lost without a word, spool or not (found by exploratory QA).
    raw = RolloutFactory("proxied").make()
    with TracestoreClient(not_tracestore) as client:
        with pytest.raises(UnexpectedAnswer, match="not tracestore's answer") as refused:
            client.post_rollout(raw)
        assert refused.value.code == "unexpected_answer"
        with pytest.raises(UnexpectedAnswer):
            client.post_batch([raw])

    async def post_async() -> None:
        async with AsyncTracestoreClient(not_tracestore) as client:
            await client.post_rollout(raw)

    with pytest.raises(UnexpectedAnswer):
        asyncio.run(post_async())
    # A read's 200 that is not JSON raised json.JSONDecodeError.
    with TracestoreClient(not_tracestore) as client:
        with pytest.raises(UnexpectedAnswer, match=r"not tracestore's JSON.*Please sign in"):
            client.get_rollout("proxied")
        with pytest.raises(UnexpectedAnswer, match="text/html"):
            client.get_rollout_bytes("proxied")  # it returned the page as the rollout
        with pytest.raises(UnexpectedAnswer):
            client.info()
    # With a spool, the rollout waits there for a tracestore server.
    spool_path = tmp_path / "spool"
    with TracestoreClient(not_tracestore, spool=spool_path, replay_on_contact=False) as client:
        assert client.post_rollout(raw)["status"] == "spooled"
        assert client.post_batch([raw])["summary"]["spooled"] == 1
    assert _records_clean(Spool(spool_path)) == [raw, raw]

"""Group commit of single posts (tracestore/ingest/group.py, issue 19), on both databases.

Posts that arrive together share one transaction: each still stands or falls alone (a bad,
conflicting or refused rollout gets its own answer, the others commit), every answer comes
after the commit (what was acknowledged is visible from a fresh connection), and a lone
post is written at once, whatever the wait.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest
from psycopg import pq
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import OperationalError

from tests.conftest import Database, Example, LiveServer, minimal_rollout, write_fault
from tracestore.db.engine import create_engine
from tracestore.errors import InvalidJSON, InvalidRollout
from tracestore.ingest.group import EXPECT_FOR, GroupCommit, Outcome, store_group
from tracestore.ingest.service import ingest_bytes, prepare
from tracestore.settings import Settings
from tracestore.store.documents import load_document
from tracestore.store.rollouts import IngestResult, store_many


def _raw(run_id: str, reward: float = 1.0) -> bytes:
    return orjson.dumps(minimal_rollout(run_id, reward))


class Recorder:
    """A lane's `run` for tests: the group's write in a thread, its size recorded."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    async def __call__(
        self, fn: Callable[[Engine, list[bytes]], list[Outcome]], engine: Engine, raws: list[bytes]
    ) -> list[Outcome]:
        self.sizes.append(len(raws))
        return await asyncio.to_thread(fn, engine, raws)


def _run(coro: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(coro(), timeout=60))


@pytest.fixture
def fresh(database: Database, engine: Engine) -> Iterator[Engine]:
    """An engine of its own on the (empty) store: sees only what was committed."""
    other = create_engine(database.url)
    yield other
    other.dispose()


def _visible(fresh: Engine, run_id: str) -> bytes | None:
    with fresh.connect() as conn:
        found = conn.execute(
            text("SELECT count(*) FROM runs WHERE run_id = :r"), {"r": run_id}
        ).scalar_one()
        return load_document(conn, run_id) if found else None


def test_one_group_each_alone(engine: Engine, fresh: Engine) -> None:
    ingest_bytes(engine, _raw("taken", 1.0))
    posts = {
        "ok-1": _raw("ok-1"),
        "bad-json": b'{"run_id": "bad-json", ',
        "ok-2": _raw("ok-2"),
        "not-a-rollout": orjson.dumps({"run_id": "not-a-rollout"}),
        "conflict": _raw("taken", 0.0),  # the same run_id, other content
        "duplicate": _raw("taken", 1.0),
        "refused": _raw("refused"),  # the database refuses its rows (a trigger)
        "ok-3": _raw("ok-3"),
        "twice-a": _raw("twice"),
        "twice-b": _raw("twice"),  # the same bytes, in the same group
    }
    recorder = Recorder()

    async def post_all() -> dict[str, Outcome]:
        group = GroupCommit(engine, recorder, wait=5.0, max_items=64, max_bytes=1 << 24)
        # Every post announces itself before any body is in: they form one group.
        entered = [group.arriving() for _ in posts]
        for cm in entered:
            await cm.__aenter__()
        tasks = {name: asyncio.create_task(group.submit(raw)) for name, raw in posts.items()}
        await asyncio.sleep(0)
        for cm in entered:
            await cm.__aexit__(None, None, None)
        answers = await asyncio.gather(*tasks.values(), return_exceptions=True)
        return dict(zip(tasks, answers, strict=True))

    with write_fault(engine, "steps", "refused"):
        answers = _run(post_all)
    assert recorder.sizes == [len(posts)]  # one group, one transaction
    for name in ("ok-1", "ok-2", "ok-3"):
        result = answers[name]
        assert isinstance(result, IngestResult), result
        assert result.status == "created"
        assert _visible(fresh, name) == posts[name]  # committed before it was answered
    assert isinstance(answers["bad-json"], InvalidJSON)
    assert isinstance(answers["not-a-rollout"], InvalidRollout)
    conflict, duplicate = answers["conflict"], answers["duplicate"]
    assert isinstance(conflict, IngestResult)
    assert conflict.status == "conflict"
    assert isinstance(duplicate, IngestResult)
    assert duplicate.status == "duplicate"
    assert _visible(fresh, "taken") == _raw("taken", 1.0)
    refused = answers["refused"]
    # Its own error, as alone (on SQLite the trigger's abort reads as a constraint, which
    # store_one retries, then gives up on).
    assert isinstance(refused, Exception)
    assert not isinstance(refused, InvalidJSON | InvalidRollout)
    assert _visible(fresh, "refused") is None
    twice = sorted(a.status for a in (answers["twice-a"], answers["twice-b"]))
    assert twice == ["created", "duplicate"]
    assert _visible(fresh, "twice") == posts["twice-a"]


@contextmanager
def driver_messages(engine: Engine) -> Iterator[list[str]]:
    """What the driver sends while the block runs, below SQLAlchemy (the bulk paths and
    the group's savepoint go to the driver directly): on SQLite each statement; on
    PostgreSQL each protocol message as libpq's trace writes it ("F <len> Parse ..." for a
    statement; "F <len> Sync" or "F <len> Query" where the client waits for the server)."""
    seen: list[str] = []
    sqlite = engine.dialect.name == "sqlite"
    with tempfile.TemporaryFile("w+") as trace:

        def checkout(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
            if sqlite:
                dbapi_conn.set_trace_callback(seen.append)
                return
            # Statement texts in every Parse: psycopg prepares a statement met five times
            # on a connection and then sends only its name.
            dbapi_conn.prepare_threshold = None
            dbapi_conn.pgconn.trace(trace.fileno())
            dbapi_conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

        def checkin(dbapi_conn: Any, _record: Any) -> None:
            if sqlite:
                dbapi_conn.set_trace_callback(None)
            else:
                dbapi_conn.pgconn.untrace()
                dbapi_conn.prepare_threshold = 5  # psycopg's default, as the engine has it

        event.listen(engine.pool, "checkout", checkout)
        event.listen(engine.pool, "checkin", checkin)
        try:
            yield seen
        finally:
            event.remove(engine.pool, "checkout", checkout)
            event.remove(engine.pool, "checkin", checkin)
            trace.seek(0)
            seen.extend(line for line in trace.read().splitlines() if line.startswith("F"))


def test_a_group_is_written_in_one_savepoint(engine: Engine, fresh: Engine) -> None:
    """The group's rollouts share the fast path's one savepoint: none around the whole
    group, none per rollout, never released; on PostgreSQL the group is four round trips
    (BEGIN; the look-up with the keys and the savepoint; the rows; COMMIT), where it was
    seven, and the rows one statement."""
    with driver_messages(engine) as seen:
        outcomes = store_group(engine, [_raw(f"one-{i}") for i in range(3)])
    assert [o.status for o in outcomes if isinstance(o, IngestResult)] == ["created"] * 3
    assert len([m for m in seen if "SAVEPOINT" in m]) == 1, seen
    assert not [m for m in seen if "RELEASE" in m]
    if engine.dialect.name == "postgresql":
        # Each Sync (the extended protocol's) or Query (the simple one's, for COMMIT) is a
        # wait for the server: one round trip.
        waits = [m for m in seen if m.split("\t")[2] in ("Sync", "Query")]
        assert len(waits) == 4, seen
        # And four statements before the COMMIT (BEGIN; the look-up with the keys; the
        # savepoint; the rows): the rows of every table go in one (db/bulk.py
        # combined_insert), where each table's was one, and the keys come with the
        # look-up (ten statements before).
        executes = [m for m in seen if m.split("\t")[2] == "Execute"]
        assert len(executes) == 4, seen
        (rows,) = [m for m in seen if m.split("\t")[2] == "Parse" and "INSERT" in m]
        assert 'WITH w0 AS (INSERT INTO "runs"' in rows
    assert all(_visible(fresh, f"one-{i}") is not None for i in range(3))


def test_a_stored_run_id_takes_no_keys(engine: Engine) -> None:
    """Keys are taken for the rollouts written, not for a post whose run_id is stored or
    repeated: the next run gets the next key, on PostgreSQL (whose sequences give a value
    for good) as on SQLite, so the same posts give both databases the same keys."""
    store_group(engine, [_raw("first")])
    outcomes = store_group(engine, [_raw("first"), _raw("second"), _raw("second")])
    statuses = [o.status for o in outcomes if isinstance(o, IngestResult)]
    assert statuses == ["duplicate", "created", "duplicate"]
    store_group(engine, [_raw("third")])
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id, id FROM runs")).all()
    keys: dict[str, int] = dict(rows)
    assert [keys["second"], keys["third"]] == [keys["first"] + 1, keys["first"] + 2]


def test_keys_are_taken_for_the_first_copy_of_a_run_id(
    engine: Engine, examples: list[Example]
) -> None:
    """A run_id twice in one group, the copies of different shapes (other trajectories,
    traces and time steps): the group takes keys for the rows of the copy it writes, the
    first, and no more, in every keyed table; the second copy is answered as a conflict.
    Extra keys (counted from the other copy) or too few (the write then fails and each
    rollout goes alone, the fast path's keys wasted) leave gaps: the keys must not have
    any, as SQLite's (max(id) + 1) never do."""
    full = [e for e in examples if e.label["kind"] == "crafter" and e.label["trace_kind"] == "full"]
    first = min(full, key=lambda e: e.label["n_steps"])
    other = max(full, key=lambda e: e.label["n_steps"])  # more steps, time steps, events
    assert other.label["n_steps"] > first.label["n_steps"]
    docs = [
        dict(first.doc, run_id="before-twice"),
        dict(first.doc, run_id="twice-shaped"),
        dict(other.doc, run_id="twice-shaped"),
        dict(other.doc, run_id="after-twice"),
    ]
    store_group(engine, [orjson.dumps(docs[0])])
    outcomes = store_group(engine, [orjson.dumps(d) for d in docs[1:3]])
    statuses = [o.status if isinstance(o, IngestResult) else repr(o) for o in outcomes]
    assert statuses == ["created", "conflict"]
    store_group(engine, [orjson.dumps(docs[3])])
    with engine.connect() as conn:
        for table in ("runs", "trajectories", "traces", "trace_time_steps"):
            count, low, high = conn.execute(
                text(f"SELECT count(*), min(id), max(id) FROM {table}")
            ).one()
            assert count > 0, table
            assert high - low + 1 == count, f"{table}: keys {low}..{high} for {count} rows"


def test_a_write_on_a_connection_not_yet_begun_is_committed(engine: Engine, fresh: Engine) -> None:
    """store_many on a connection whose transaction SQLAlchemy has not begun (it begins at
    the first statement, and conn.commit() commits it): the group's statements go to the
    driver, so store_many begins it; else the commit did nothing and the rows were lost."""
    with engine.connect() as conn:
        results = store_many(conn, [prepare(_raw("not-begun"))])
        conn.commit()
    assert [r.status for r in results] == ["created"]
    assert _visible(fresh, "not-begun") is not None


def test_a_failing_duplicate_check_fails_only_its_own_post(
    engine: Engine, fresh: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answering a post whose run_id is stored reads and compares the stored document; when
    that fails (the run deleted between the look-up and the read, say), the failure is
    that post's alone: the group's other posts are stored and committed."""
    from tracestore.store import rollouts

    ingest_bytes(engine, _raw("dup-gone"))
    real = rollouts._answer_existing

    def failing(conn: Any, prepared: Any, run: Any) -> IngestResult:
        if prepared.doc["run_id"] == "dup-gone":
            raise RuntimeError("the stored run vanished")
        return real(conn, prepared, run)

    monkeypatch.setattr(rollouts, "_answer_existing", failing)
    raws = [_raw("beside-1"), _raw("dup-gone"), _raw("beside-2"), _raw("dup-kept")]
    ingest_bytes(engine, raws[3])  # another stored one, answered normally
    outcomes = store_group(engine, raws)
    assert isinstance(outcomes[1], RuntimeError)
    statuses = [o.status if isinstance(o, IngestResult) else o for o in outcomes]
    assert statuses[0] == statuses[2] == "created"
    assert statuses[3] == "duplicate"
    assert _visible(fresh, "beside-1") == raws[0]
    assert _visible(fresh, "beside-2") == raws[2]


def test_a_lone_post_waits_for_nobody(engine: Engine, fresh: Engine) -> None:
    recorder = Recorder()

    async def lone() -> tuple[IngestResult, bool]:
        # An hour's wait: a lone post that waited for it would time this test out.
        group = GroupCommit(engine, recorder, wait=3600, max_items=64, max_bytes=1 << 24)
        async with group.arriving():
            raw = _raw("lone")
        task = asyncio.create_task(group.submit(raw))
        await asyncio.sleep(0)
        timer_armed = group._timer is not None
        return await task, timer_armed

    result, timer_armed = _run(lone)
    assert result.status == "created"
    assert not timer_armed
    assert recorder.sizes == [1]
    assert _visible(fresh, "lone") == _raw("lone")


@pytest.mark.parametrize("then_submits", [True, False])
def test_a_post_that_submits_after_arriving_joins_the_pending_group(
    engine: Engine, then_submits: bool
) -> None:
    recorder = Recorder()

    async def two() -> list[IngestResult]:
        group = GroupCommit(engine, recorder, wait=5.0, max_items=64, max_bytes=1 << 24)
        second = group.arriving(then_submits=then_submits)
        await second.__aenter__()  # the second post's body is coming: the first waits
        first = asyncio.create_task(group.submit(_raw("pending")))
        await asyncio.sleep(0)
        await second.__aexit__(None, None, None)
        # The ingest lane submits right after (api/lane.py): no write may start between.
        results = await asyncio.gather(first, group.submit(_raw("joins")))
        return list(results)

    results = _run(two)
    assert [r.status for r in results] == ["created", "created"]
    # With then_submits the block's end starts no write, so the two share one group;
    # without it (ingest_one's reading) the end writes the pending post alone.
    assert recorder.sizes == ([2] if then_submits else [1, 1])


def test_the_wait_for_arriving_posts_is_bounded(engine: Engine) -> None:
    recorder = Recorder()

    async def held() -> tuple[IngestResult, float | None]:
        group = GroupCommit(engine, recorder, wait=0.05, max_items=64, max_bytes=1 << 24)
        slow = group.arriving()
        await slow.__aenter__()  # another post whose body never finishes arriving
        task = asyncio.create_task(group.submit(_raw("first")))
        await asyncio.sleep(0)
        armed = group._timer
        when = None if armed is None else armed.when() - asyncio.get_running_loop().time()
        result = await task  # written once the wait is over, the other post still arriving
        await slow.__aexit__(None, None, None)
        return result, when

    result, when = _run(held)
    assert result.status == "created"
    assert when is not None
    assert when <= 0.05
    assert recorder.sizes == [1]


def test_posts_during_a_write_form_the_next_group(engine: Engine) -> None:
    recorder = Recorder()
    release = threading.Event()
    started = threading.Event()

    def slow_store(engine: Engine, raws: list[bytes]) -> list[Outcome]:
        if len(recorder.sizes) == 1:  # the first group holds its slot until released
            started.set()
            release.wait(30)
        return store_group(engine, raws)

    async def run(
        fn: Callable[[Engine, list[bytes]], list[Outcome]], engine: Engine, raws: list[bytes]
    ) -> list[Outcome]:
        recorder.sizes.append(len(raws))
        return await asyncio.to_thread(slow_store, engine, raws)

    async def flow() -> list[Any]:
        group = GroupCommit(engine, run, wait=0.001, max_items=3, max_bytes=1 << 24)
        first = asyncio.create_task(group.submit(_raw("g-0")))
        await asyncio.to_thread(started.wait, 30)
        rest = [asyncio.create_task(group.submit(_raw(f"g-{i}"))) for i in range(1, 6)]
        await asyncio.sleep(0.05)
        assert recorder.sizes == [1]  # the others wait for the group being written
        release.set()
        return await asyncio.gather(first, *rest)

    results = _run(flow)
    assert [r.status for r in results] == ["created"] * 6
    assert recorder.sizes == [1, 3, 2]  # then groups of at most max_items


async def _burst(group: GroupCommit, run_ids: list[str]) -> list[IngestResult]:
    """Posts stored as one group (they wait for a post arriving, which then ends)."""
    other = group.arriving()
    await other.__aenter__()
    tasks = [asyncio.create_task(group.submit(_raw(r))) for r in run_ids]
    await asyncio.sleep(0)
    await other.__aexit__(None, None, None)
    return await asyncio.gather(*tasks)


def test_the_clients_of_a_group_just_answered_are_waited_for(engine: Engine) -> None:
    """Posts coming back one by one after their group was answered (a task app's workers
    posting again) form one group, not a group each: the group waits for as many posts as
    were answered, at most the wait, and is written once they all came."""
    recorder = Recorder()

    async def flow() -> tuple[list[IngestResult], list[bool]]:
        group = GroupCommit(engine, recorder, wait=5.0, max_items=64, max_bytes=1 << 24)
        first = await _burst(group, [f"back-{i}" for i in range(3)])
        held = []
        again = []
        for i in range(3):  # the three clients come back, one at a time
            again.append(asyncio.create_task(group.submit(_raw(f"again-{i}"))))
            await asyncio.sleep(0.02)
            held.append(group._timer is not None)
        return [*first, *await asyncio.gather(*again)], held

    results, held = _run(flow)
    assert [r.status for r in results] == ["created"] * 6
    # Held for the second and third while they were expected; the third's arrival wrote
    # the group at once (well within the 5 s wait, or this test would have taken 5 s).
    assert held == [True, True, False]
    assert recorder.sizes == [3, 3]


def test_expected_posts_that_do_not_come_hold_a_group_at_most_the_wait(engine: Engine) -> None:
    recorder = Recorder()

    async def flow() -> tuple[float, bool]:
        group = GroupCommit(engine, recorder, wait=0.05, max_items=64, max_bytes=1 << 24)
        await _burst(group, [f"gone-{i}" for i in range(4)])
        loop = asyncio.get_running_loop()
        start = loop.time()
        await group.submit(_raw("only-one-came-back"))  # three others were expected
        took = loop.time() - start
        # They did not come within the wait: nothing is expected any more, so the next
        # post is written at once.
        task = asyncio.create_task(group.submit(_raw("next")))
        await asyncio.sleep(0)
        armed = group._timer is not None
        await task
        return took, armed

    took, armed = _run(flow)
    assert 0.04 <= took < 1.0
    assert not armed
    assert recorder.sizes == [4, 1, 1]


def test_a_client_posting_again_and_again_waits_for_nobody(engine: Engine) -> None:
    """One client posting in a loop: its own answered post is the one expected back, so
    its next post is written at once (the lone-post latency does not grow)."""
    recorder = Recorder()

    async def flow() -> list[bool]:
        group = GroupCommit(engine, recorder, wait=3600, max_items=64, max_bytes=1 << 24)
        armed = []
        for i in range(3):
            task = asyncio.create_task(group.submit(_raw(f"loop-{i}")))
            await asyncio.sleep(0)
            armed.append(group._timer is not None)
            await task
        return armed

    assert _run(flow) == [False, False, False]
    assert recorder.sizes == [1, 1, 1]


def test_an_expectation_lapses(engine: Engine) -> None:
    """Posts expected back but not come within EXPECT_FOR waits are expected no longer:
    a post after a pause is written at once."""
    recorder = Recorder()
    wait = 0.01

    async def flow() -> list[bool]:
        group = GroupCommit(engine, recorder, wait=wait, max_items=64, max_bytes=1 << 24)
        await _burst(group, [f"burst-{i}" for i in range(5)])
        await asyncio.sleep(EXPECT_FOR * wait + 0.05)
        armed = []
        # The client that came back posts again: its own answered post is all that is
        # expected now (the burst's other four lapsed), so it waits for nobody either.
        for name in ("after-a-pause", "and-again"):
            task = asyncio.create_task(group.submit(_raw(name)))
            await asyncio.sleep(0)
            armed.append(group._timer is not None)
            await task
        return armed

    assert _run(flow) == [False, False]
    assert recorder.sizes == [5, 1, 1]


def test_commit_failure_fails_every_post_of_the_group(engine: Engine, fresh: Engine) -> None:
    raws = [_raw("c-1"), _raw("c-2")]

    def failing_commit(engine: Engine, raws: list[bytes]) -> list[Outcome]:
        from sqlalchemy import event

        def boom(_conn: Any) -> None:
            raise RuntimeError("commit failed")

        event.listen(engine, "commit", boom)
        try:
            return store_group(engine, raws)
        finally:
            event.remove(engine, "commit", boom)

    outcomes = failing_commit(engine, raws)
    assert all(isinstance(o, RuntimeError) for o in outcomes)
    assert _visible(fresh, "c-1") is None
    assert _visible(fresh, "c-2") is None


def test_a_connection_lost_mid_group_fails_the_group_as_a_lost_connection(
    backend: str, engine: Engine, fresh: Engine
) -> None:
    """The database ending the connection while a group of several is written: every post
    gets the lost connection (OperationalError, answered 503 with Retry-After), not each a
    different error from retrying alone on the dead connection (that was a 500), and
    nothing of the group is stored."""
    if backend != "postgresql":
        pytest.skip("a SQLite connection is a file: no server can end it")
    raws = [_raw("lost-1"), _raw("lost-2"), _raw("lost-3")]
    with write_fault(engine, "steps", "lost-2", disconnect=True):
        outcomes = store_group(engine, raws)
    assert [type(o) for o in outcomes] == [OperationalError] * 3, outcomes
    assert all(isinstance(o, OperationalError) and o.connection_invalidated for o in outcomes)
    assert [_visible(fresh, r) for r in ("lost-1", "lost-2", "lost-3")] == [None] * 3
    # The next group is written on a fresh connection.
    again = store_group(engine, raws)
    assert [o.status if isinstance(o, IngestResult) else o for o in again] == ["created"] * 3


def _sample(metrics: str, name: str) -> float:
    """The value of the Prometheus sample `name` (with its labels) in a /metrics text."""
    values = [
        line.rsplit(" ", 1)[1] for line in metrics.splitlines() if line.startswith(name + " ")
    ]
    assert len(values) == 1, (name, values)
    return float(values[0])


def test_concurrent_http_posts_each_answered_after_commit(
    database: Database, engine: Engine
) -> None:
    """Through a live server: 24 posts at once, some bad; every 201 is there to read."""
    good = [_raw(f"h-{i}") for i in range(20)]
    ingest_bytes(engine, _raw("h-taken"))
    bad = [b"{", orjson.dumps({"run_id": "h-bad"}), _raw("h-taken", 0.0), _raw("h-taken")]
    bodies = good + bad
    answers: dict[int, httpx.Response] = {}

    def post(index: int, url: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            answers[index] = client.post("/v1/rollouts", content=bodies[index])

    with LiveServer(Settings(database_url=database.url)) as live:
        threads = [threading.Thread(target=post, args=(i, live.url)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        metrics = httpx.get(live.url + "/metrics").text
    # Every post went through a group (the bad ones too: they fail in its preparation),
    # and the histogram of group sizes counted each once.
    groups = _sample(metrics, "tracestore_group_commit_rollouts_count")
    assert _sample(metrics, "tracestore_group_commit_rollouts_sum") == len(bodies)
    assert 1 <= groups <= len(bodies)
    check = create_engine(database.url)
    try:
        for index, raw in enumerate(good):
            assert answers[index].status_code == 201, answers[index].text
            assert _visible(check, f"h-{index}") == raw
    finally:
        check.dispose()
    statuses = [answers[len(good) + i].status_code for i in range(len(bad))]
    assert statuses == [400, 422, 409, 200]
    assert answers[len(good) + 2].json()["error"]["code"] == "conflict"

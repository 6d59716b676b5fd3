"""Group commit: concurrent single posts share one transaction and one commit (issue 19).

Task apps post one rollout per request, hundreds at once. Alone, each post pays a
transaction, a commit (a WAL flush on PostgreSQL), a thread hop and the per-transaction
statements (existence check, key allocation, one write per table). Here the single posts
that reach one worker together are stored together, as the batch route stores a batch:

- a post joins the *pending* group and waits for its answer;
- the pending group is written (prepared, then stored in one transaction, in a write slot
  of `api/overload.py`'s lane) as soon as fewer than `concurrency` groups are being
  written, unless other posts are still arriving (their body is being read): then it
  waits for them, at most `wait` seconds, or until it holds `max_items` rollouts or
  `max_bytes` bytes, whichever comes first. It waits the same way, at most `wait`, for
  the posts it *expects*: when a group is answered, its clients are likely to post again
  at once (a task app's workers, a trainer's loop), so for a short while (EXPECT_FOR
  waits) that many posts are expected, each arriving post counting one off; the group is
  written as soon as they all came, or when the wait ran out (then nothing more is
  expected). Without it, the posts of a worker split into two groups taking turns (one
  written while the other gathers), each paying a transaction, a commit and the
  per-group statements, which were most of a small post's cost beyond a batch item's
  (bench/README.md item 19). A lone post (nothing arriving, nothing being written,
  nothing expected) is written at once: it waits for nobody;
- posts that come while `concurrency` groups are being written form the next group,
  written when one of those ends;
- the group's rollouts are written together in one savepoint inside the group's
  transaction (the batch route's path, `store_each`); when that fails for any reason,
  each one is stored again alone in a savepoint of its own, so a bad or conflicting
  rollout fails alone and the others commit;
- every post is answered only after its group's transaction committed: acknowledged
  still means durable. When the commit fails, every post of the group gets the error.

A post's own errors are its own answer: a body that is not JSON or not a rollout (400,
422), a conflict (409), a write failing on its rows (500), exactly as when it was stored
alone. All the committer's state lives on one event loop (no locks); the writing happens
in the lane's threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine

from tracestore.db.uow import write_connection
from tracestore.ingest.service import cyclic_gc_paused, prepare
from tracestore.store.rollouts import IngestResult, Prepared, store_each, store_many

# How long (in group-commit waits) the posts of a group just answered are expected back.
EXPECT_FOR = 5
# What a group's write gives back for each of its posts: its result, or its error.
Outcome = IngestResult | BaseException
# How a group is written: `run(store_group, engine, raws)` (a lane's `run`: a write slot,
# then one of its threads).
Runner = Callable[
    [Callable[[Engine, list[bytes]], list[Outcome]], Engine, list[bytes]], Awaitable[Any]
]


def _store_isolated(conn: Connection, prepared: Sequence[Prepared]) -> list[Outcome]:
    """Store `prepared` in the caller's transaction, each standing or falling alone.

    The batch route's path first (one look-up, one write per table, in one savepoint; a
    run_id taken meanwhile sends those rollouts alone); if that fails on anything else (a
    rollout whose rows the database refuses), each rollout is stored in a savepoint of
    its own: the one that fails gets its error (`store_each`).
    """
    if len(prepared) == 1:  # alone: its error is the transaction's, no savepoint needed
        return list(store_many(conn, prepared))
    return list(store_each(conn, prepared))


def store_group(engine: Engine, raws: list[bytes]) -> list[Outcome]:
    """Prepare and store the documents of one group in one transaction: their outcomes,
    in order. Blocking (a lane's thread runs it)."""
    # Paused until the group's documents are freed (see ingest.service.ingest_many).
    with cyclic_gc_paused():
        return _store_group(engine, raws)


def _store_group(engine: Engine, raws: list[bytes]) -> list[Outcome]:
    outcomes: list[Outcome | None] = [None] * len(raws)
    ready: list[tuple[int, Prepared]] = []
    for index, raw in enumerate(raws):
        try:
            ready.append((index, prepare(raw)))
        except Exception as exc:  # its own answer (400, 422, ...), as when alone
            outcomes[index] = exc
    if ready:
        try:
            with write_connection(engine) as conn:
                stored = _store_isolated(conn, [p for _, p in ready])
        except Exception as exc:  # the transaction did not commit: nothing is durable
            stored = [exc] * len(ready)
        for (index, _), outcome in zip(ready, stored, strict=True):
            outcomes[index] = outcome
    return [o for o in outcomes if o is not None]


@dataclass(slots=True)
class _Post:
    raw: bytes
    answer: asyncio.Future[IngestResult]


class _Arriving:
    """`GroupCommit.arriving`'s context: a class, not an @asynccontextmanager, whose
    generator and wrapper cost a small post ~1 us (bench/README.md item 24)."""

    __slots__ = ("_group", "_then_submits")

    def __init__(self, group: GroupCommit, then_submits: bool) -> None:
        self._group = group
        self._then_submits = then_submits

    async def __aenter__(self) -> None:
        self._group._arriving += 1

    async def __aexit__(self, exc_type: object, *_exc: object) -> None:
        if self._then_submits and exc_type is None:
            # Its submit, next, writes or waits: a write started here would leave it out.
            self._group._arriving -= 1
        else:
            self._group._arrived()


class GroupCommit:
    """The single posts of one worker (one event loop), written in groups (see above)."""

    def __init__(
        self,
        engine: Engine,
        run: Runner,
        *,
        wait: float,
        max_items: int,
        max_bytes: int,
        concurrency: int = 1,
        observe: Callable[[int], None] | None = None,
    ) -> None:
        self.engine = engine
        self.observe = observe  # told each group's size once it is written (metrics)
        self.run = run
        self.wait = wait
        self.max_items = max(1, max_items)
        self.max_bytes = max_bytes
        self.concurrency = max(1, concurrency)
        self.loop = asyncio.get_running_loop()
        self._pending: list[_Post] = []
        self._pending_bytes = 0
        self._arriving = 0  # posts whose body is being read
        self._writing = 0  # groups being written
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Posts expected soon (their clients' last posts were just answered), until then.
        self._expected = 0
        self._expected_until = 0.0

    def arriving(self, *, then_submits: bool = False) -> _Arriving:
        """Around reading a post's body: a group about to be written waits for it (at
        most `wait`), so posts arriving together share a commit. `then_submits`: the
        caller submits at once when the block ends without an error (else it calls
        `kick`), so the end of the block starts no write of its own."""
        return _Arriving(self, then_submits)

    def kick(self) -> None:
        """Write the pending group now, or arm its wait (a post announced as arriving
        will not be submitted)."""
        self._kick()

    def _arrived(self) -> None:
        self._arriving -= 1
        self._kick()

    async def submit(self, raw: bytes) -> IngestResult:
        """Store one document with the next group; its result once that group committed.

        Raises what storing it alone would have raised (InvalidJSON, InvalidRollout, a
        database error, DatabaseBusy when no write slot came free in time).
        """
        post = _Post(raw, self.loop.create_future())
        if self._expected:
            self._expected -= 1
        self._pending.append(post)
        self._pending_bytes += len(raw)
        self._kick()
        return await post.answer

    def _full(self) -> bool:
        return len(self._pending) >= self.max_items or self._pending_bytes >= self.max_bytes

    def _kick(self) -> None:
        """Write the pending group now, later (a timer), or when a group being written ends."""
        if not self._pending or self._writing >= self.concurrency:
            return  # nothing to write, or the end of a group being written kicks again
        if not self._full() and self.wait > 0 and (self._arriving or self._expecting()):
            if self._timer is None:  # wait for the posts arriving or expected, at most `wait`
                self._timer = self.loop.call_later(self.wait, self._waited)
            return
        self._write_pending()

    def _expecting(self) -> bool:
        return self._expected > 0 and self.loop.time() < self._expected_until

    def _waited(self) -> None:
        self._timer = None
        self._expected = 0  # they did not come within the wait: not soon, then
        if self._pending and self._writing < self.concurrency:
            self._write_pending()

    def _write_pending(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        group: list[_Post] = []
        size = 0
        while self._pending and len(group) < self.max_items:
            post = self._pending[0]
            if group and size + len(post.raw) > self.max_bytes:
                break
            self._pending.pop(0)
            self._pending_bytes -= len(post.raw)
            if post.answer.done():
                continue  # its request was cancelled before its group was written
            group.append(post)
            size += len(post.raw)
        if not group:
            self._kick()
            return
        self._writing += 1
        task = self.loop.create_task(self._write(group))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, group: list[_Post]) -> None:
        try:
            outcomes: Sequence[Outcome] = await self.run(
                store_group, self.engine, [post.raw for post in group]
            )
            written = True
        except BaseException as exc:  # no write slot (DatabaseBusy), or cancelled
            outcomes = [exc] * len(group)
            written = False
        finally:
            self._writing -= 1
        for post, outcome in zip(group, outcomes, strict=True):
            if post.answer.done():
                continue
            if isinstance(outcome, BaseException):
                post.answer.set_exception(outcome)
            else:
                post.answer.set_result(outcome)
        if written:
            # Their clients are likely to post again at once: the next group waits for
            # them. (Not after a refusal: those clients retry after its Retry-After.) An
            # expectation that lapsed meanwhile is not carried over.
            self._expected = (self._expected if self._expecting() else 0) + len(group)
            self._expected_until = self.loop.time() + EXPECT_FOR * self.wait
        self._kick()
        if written and self.observe is not None:
            # Counted once its posts are answered and the next group is started.
            self.observe(len(group))
        stopped = next((o for o in outcomes if not isinstance(o, IngestResult | Exception)), None)
        if stopped is not None:
            raise stopped  # cancelled (shutdown): its posts are told, then the task ends so

    async def drain(self) -> None:
        """Wait until nothing is pending or being written (tests, shutdown)."""
        while self._pending or self._tasks:
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            else:
                self._kick()
                await asyncio.sleep(self.wait or 0.001)


__all__ = ["GroupCommit", "Outcome", "store_group"]

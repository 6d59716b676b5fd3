"""Reads that parse a stored document, held in the worker's parse budget (api/overload.py).

A stored rollout can be as large as ingest admits, and converting it can cost several
times its parse (docs/RELIABILITY.md): a read that parses or converts one holds what that
costs, with the worker's ingests and conversions, so reads at once cannot take a worker
past its memory. Served parts (`GET .../trace`, `.../trajectories`) parse the document
always; the inspector (`/v1/inspect/{run_id}`, the run page) only when it converts a part
(it reads stored parts from the typed rows, a page at a time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Literal, TypeVar

import anyio
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from tracestore.api.body import MAX_PER_BYTE, parsed_estimate
from tracestore.api.deps import AppState
from tracestore.api.overload import DatabaseBusy, ParsingBusy
from tracestore.inspect.models import RunInspection
from tracestore.inspect.run import converted_part, inspect_run
from tracestore.models import Run
from tracestore.store.served import StoredRun, nothing_to_serve, stored_run

Part = Literal["trace", "trajectories"]
# What converting costs a worker, all told (parse included), from bench.convert_memory
# (minimal and one-line steps, steps with a tool call, 1 KB string observations, trace
# events to trajectories, to 200,000 steps; growth 0.52-0.76 of this): 2.5x the body's
# parsed-size estimate, plus 4 KiB a trajectory step converted to a trace (a step
# becomes a time step, events and messages: minimal steps cost 7x their estimate).
CONVERT_PER_ESTIMATE = 2.5
CONVERT_PER_STEP = 4096
# A read whose charge from its upper bound would pass this share of the budget is
# charged from its estimate, worked out in the thread that loads it.
ESTIMATE_PAST = 4


def conversion_cost(estimate: int, steps: int, to: str) -> int:
    """What converting a document of parsed-size estimate `estimate` and `steps`
    trajectory steps to `to` costs, all told."""
    return int(CONVERT_PER_ESTIMATE * estimate) + (CONVERT_PER_STEP * steps if to == "trace" else 0)


def _charge(run: StoredRun, part: Part, converts: bool, estimate: int) -> int:
    # A stored part costs its parse; a converted one, the conversion. A charge past the
    # whole budget goes in alone, as any does (ParseBudget): a stored run stays readable.
    return conversion_cost(estimate, run.n_steps, part) if converts else estimate


def _charged(
    run: StoredRun, part: Part, converts: bool, limit: int
) -> tuple[int, Callable[[], int] | None]:
    """What reading `run`'s `part` is charged, and how to work out a smaller exact charge
    when it does not fit (None when the charge is exact already)."""
    bound = _charge(run, part, converts, len(run.raw) * MAX_PER_BYTE)
    exact = partial(_exact_charge, run, part, converts)
    if bound > limit // ESTIMATE_PAST:
        # Its estimate instead, here in a thread (~0.45 ms per 100 KB): the bound would
        # take much of the budget from ingests.
        return exact(), None
    # As an ingest's small body: its exact charge only when its bound does not fit.
    return bound, exact


def _exact_charge(run: StoredRun, part: Part, converts: bool) -> int:
    return _charge(run, part, converts, parsed_estimate(run.raw))


@dataclass(frozen=True, slots=True)
class _More:
    """An attempt's answer when the run it read costs more than the charge it holds."""

    charge: int


def _beyond(held: int, bound: int, exact: Callable[[], int] | None) -> _More | None:
    """None when a charge of `bound` (or its exact form) is within `held`; else what to
    hold instead."""
    if bound <= held:
        return None
    charge = bound if exact is None else min(bound, exact())
    return None if charge <= held else _More(charge)


# Both reads below load the document and work out its charge in a read session; when the
# budget has room at once they go on with that document. Otherwise they drop it before
# waiting (any number of reads may wait, and a document kept meanwhile would be held by
# nothing: up to the largest body a worker accepts, each) and, once in, read the run
# again (`_once_in`): so what they answer is the run as stored after the wait, never a
# document deleted meanwhile, and charged for what it is now (a run stored anew may cost
# more: then the read gives everything back and waits for that).

T = TypeVar("T")


async def _once_in(state: AppState, charge: int, attempt: Callable[[Session, int], T | _More]) -> T:
    """`attempt(session, held)` in a thread, holding `held` of the parse budget (at least
    `charge`) and a read slot; again with more when it answers _More.

    It never waits for the one while holding the other: holding the budget while waiting
    for a read slot (reports hold them for seconds), a read charged past the whole budget
    kept every ingest waiting; holding a slot while waiting for the budget, reads waiting
    for room kept the cid look-ups (the same lane) out. A slot it waited for it keeps
    when the budget has room then (its turn in the slots' queue is not given up). All
    the waits together take at most the read lane's wait: then DatabaseBusy or
    ParsingBusy (503)."""
    budget, reads = state.lanes.parsing, state.lanes.reads
    deadline = anyio.current_time() + reads.wait

    def left() -> float:
        return max(0.0, deadline - anyio.current_time())

    try:
        while True:
            outcome: T | _More | None = None
            async with budget.hold(charge, wait=left()):
                if reads.free:  # taken at once: nothing comes between on the event loop
                    async with reads.session() as session:
                        outcome = await run_in_threadpool(attempt, session, charge)
            if outcome is None:  # no slot was free: wait for one, holding none of the budget
                async with reads.slot(wait=left()):
                    if budget.fits(charge):
                        async with budget.hold(charge), reads.opened() as session:
                            outcome = await run_in_threadpool(attempt, session, charge)
            if isinstance(outcome, _More):
                charge = outcome.charge
            elif outcome is not None:
                return outcome
            # Else the budget filled up meanwhile: wait for room again, holding no slot.
    # Refused after the last of its waits (perhaps of what was left: nothing): the answer
    # names the whole wait.
    except ParsingBusy:
        raise ParsingBusy(reads.wait) from None
    except DatabaseBusy:
        raise DatabaseBusy(reads.name, reads.wait) from None


# --- served parts -------------------------------------------------------------------------


def _stored_and_charge(
    session: Session, run_id: str, part: Part, limit: int
) -> tuple[StoredRun, int, Callable[[], int] | None]:
    """The stored run and what serving its `part` is charged (see `_charged`). NotFound
    when it is not there or has nothing to serve (from its run row: nothing parsed)."""
    run = stored_run(session, run_id)
    if not run.servable():
        raise nothing_to_serve(run_id, run.trace_kind, part)
    return run, *_charged(run, part, run.converts(part), limit)


async def served_read(
    state: AppState,
    run_id: str,
    part: Part,
    serve: Callable[[bytes, datetime, Part], Response],
) -> Response:
    """`serve(raw, received_at, part)` of the stored run `run_id`, in a thread, holding
    what parsing (or converting) its `part` costs."""
    budget = state.lanes.parsing
    async with state.lanes.reads.session() as session:
        run, bound, exact = await run_in_threadpool(
            _stored_and_charge, session, run_id, part, budget.limit
        )
    charge = budget.settle(bound, exact)
    if budget.fits(charge):
        async with budget.hold(charge):
            return await run_in_threadpool(serve, run.raw, run.received_at, part)
    del run  # not kept while waiting (above)

    def again(session: Session, held: int) -> Response | _More:
        run, bound, exact = _stored_and_charge(session, run_id, part, budget.limit)
        more = _beyond(held, bound, exact)
        return more if more is not None else serve(run.raw, run.received_at, part)

    return await _once_in(state, charge, again)


# --- the inspector ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Page:
    """What an inspection shows: a panel, and a page of steps."""

    panel: str
    offset: int
    limit: int
    step: int | None

    def inspect(
        self, session: Session, run_id: str, document: StoredRun | None = None
    ) -> RunInspection:
        return inspect_run(
            session,
            run_id,
            panel=self.panel,
            offset=self.offset,
            limit=self.limit,
            step=self.step,
            document=document,
        )


def _inspect_or_charge(
    session: Session, run_id: str, budget_limit: int, page: _Page
) -> RunInspection | tuple[StoredRun, int, Callable[[], int] | None]:
    """The inspection of `run_id` when it converts nothing; else its stored run and what
    converting it is charged (see `_charged`), to inspect within the budget."""
    row = session.execute(
        select(Run.trace_kind, Run.n_trajectories).where(Run.run_id == run_id)
    ).first()
    part = None if row is None else converted_part(row.trace_kind, row.n_trajectories, page.panel)
    if part is None:  # nothing to convert, or no such run (inspect_run's NotFound)
        return page.inspect(session, run_id)
    run = stored_run(session, run_id)
    return run, *_charged(run, part, True, budget_limit)


async def held_inspection(
    state: AppState,
    run_id: str,
    *,
    panel: str = "all",
    offset: int = 0,
    limit: int,
    step: int | None = None,
) -> RunInspection:
    """`inspect_run` in a read session and a thread, and, when it converts a part of the
    run, holding what converting costs (converted on read, a stored rollout of 200,000
    one-line steps took ~500 MiB an inspection, outside any bound)."""
    budget = state.lanes.parsing
    page = _Page(panel, offset, limit, step)
    async with state.lanes.reads.session() as session:
        found = await run_in_threadpool(_inspect_or_charge, session, run_id, budget.limit, page)
        if isinstance(found, RunInspection):
            return found
        run, bound, exact = found
        charge = budget.settle(bound, exact)
        if budget.fits(charge):  # in the same session, with the document it loaded
            async with budget.hold(charge):
                return await run_in_threadpool(page.inspect, session, run_id, run)
    del run, found  # not kept while waiting (above)

    def again(session: Session, held: int) -> RunInspection | _More:
        found = _inspect_or_charge(session, run_id, budget.limit, page)
        if isinstance(found, RunInspection):  # it converts nothing now
            return found
        run, bound, exact = found
        more = _beyond(held, bound, exact)
        return more if more is not None else page.inspect(session, run_id, run)

    return await _once_in(state, charge, again)


__all__ = [
    "CONVERT_PER_ESTIMATE",
    "CONVERT_PER_STEP",
    "ESTIMATE_PAST",
    "Part",
    "conversion_cost",
    "held_inspection",
    "served_read",
]

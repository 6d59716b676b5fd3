"""The server's retention sweep on a schedule (TRACESTORE_RETENTION_INTERVAL; off at 0).

One sweep at a time per store: on PostgreSQL a session advisory lock lets one worker of
one replica sweep while the others skip their turn; on SQLite, workers share one file and
its single write lock, and a second sweep finds the first one's work done.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

from sqlalchemy import Engine, text

from tracestore.retention.sweep import Swept, all_rules, apply, plan
from tracestore.settings import Settings

log = logging.getLogger("tracestore.retention")
# pg_try_advisory_lock key: "tracestore retention" (any constant other users leave alone).
ADVISORY_KEY = 0x7472_6163_6573_7472 & 0x7FFF_FFFF_FFFF_FFFF


def sweep_once(engine: Engine, settings: Settings) -> Swept | None:
    """One sweep with every rule, unless another process is sweeping (PostgreSQL)."""
    rules = all_rules(engine, settings)
    if not rules:
        return Swept()
    if engine.dialect.name != "postgresql":
        return apply(engine, plan(engine, rules), batch_size=settings.retention_batch_size)
    with engine.connect() as conn:
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": ADVISORY_KEY}).scalar()
        conn.commit()
        if not got:
            return None
        try:
            return apply(engine, plan(engine, rules), batch_size=settings.retention_batch_size)
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_KEY})
            conn.commit()


async def run_schedule(engine: Engine, settings: Settings) -> None:
    """Sweep every `retention_interval` seconds until cancelled; a failed sweep is logged
    and the next one tries again."""
    interval = settings.retention_interval
    while True:
        await asyncio.sleep(interval)
        try:
            swept = await asyncio.to_thread(sweep_once, engine, settings)
        except Exception:
            log.exception("retention sweep failed; the next one runs in %.0f s", interval)
            continue
        if swept is None:
            log.info("retention sweep skipped: another process is sweeping")
        elif swept.deleted or swept.pinned_meanwhile:
            log.info("retention sweep: %s", swept.as_dict())


def start(engine: Engine, settings: Settings) -> asyncio.Task[None] | None:
    """Start the schedule when TRACESTORE_RETENTION_INTERVAL is set (None: off)."""
    if settings.retention_interval <= 0:
        return None
    return asyncio.get_running_loop().create_task(run_schedule(engine, settings))


async def stop(task: asyncio.Task[None] | None) -> None:
    """Cancel the schedule (a sweep in progress finishes its batch in its thread)."""
    if task is None:
        return
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task

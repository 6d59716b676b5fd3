"""Datasets: named, immutable sets of runs that pin them (issue 20).

A dataset records the run ids a filter selected when it was made, with each run's content
hash; while it exists, deletion and retention skip those runs (a forced delete removes one
all the same, and the dataset then reports it missing). Functions take a session and
never commit.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, case, delete, func, insert, select
from sqlalchemy.orm import Session

from tracestore.errors import Conflict, InvalidRequest, NotFound
from tracestore.models import Dataset, DatasetRun, Run
from tracestore.store.runs import RunFilter, filtered

# A dataset's name: short, and safe in a path, a URL and a Parquet partition value.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_INSERT_BATCH = 5000


def check_name(name: str) -> str:
    """`name` when it is a valid dataset name; InvalidRequest otherwise."""
    if not NAME.fullmatch(name):
        raise InvalidRequest(
            f"dataset name {name!r} is not valid: letters, digits, '.', '_' and '-', up to "
            "128, starting with a letter or digit",
            name=name,
        )
    return name


def filter_as_dict(f: RunFilter) -> dict[str, Any]:
    """The filters that were given, as JSON (datetimes as ISO text)."""
    out: dict[str, Any] = {}
    for key, value in asdict(f).items():
        if value is not None:
            out[key] = value.isoformat() if isinstance(value, datetime) else value
    return out


def manifest_hash(members: Iterable[tuple[str, str]]) -> str:
    """sha256 over the sorted `run_id <TAB> content_hash` lines of a set of runs."""
    digest = hashlib.sha256()
    for run_id, content_hash in sorted(members):
        digest.update(f"{run_id}\t{content_hash}\n".encode())
    return digest.hexdigest()


def create_dataset(
    session: Session,
    name: str,
    f: RunFilter,
    *,
    created_by: str | None,
    now: datetime,
    note: str | None = None,
) -> dict[str, Any]:
    """Record the runs `f` selects now as dataset `name`, pinning them; its manifest.

    Conflict when the name is taken, InvalidRequest when the filter selects no run. On
    PostgreSQL the runs are read FOR SHARE: a delete running meanwhile either finishes
    first (the run is then not in the dataset) or waits and then sees the pin.
    """
    check_name(name)
    conn = session.connection()
    if conn.execute(select(Dataset.id).where(Dataset.name == name)).first() is not None:
        raise Conflict(f"dataset {name!r} exists: datasets are immutable", name=name)
    query = filtered(select(Run.run_id, Run.content_hash, Run.received_at), f).order_by(Run.id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(read=True, of=Run)
    members = list(conn.execute(query))
    if not members:
        raise InvalidRequest(
            f"the filter selects no runs: dataset {name!r} would be empty",
            filter=filter_as_dict(f),
        )
    pk: int = conn.execute(
        insert(Dataset)
        .values(
            name=name,
            created_at=now,
            created_by=created_by,
            note=note,
            filter=filter_as_dict(f),
            n_runs=len(members),
            manifest_hash=manifest_hash((m.run_id, m.content_hash) for m in members),
        )
        .returning(Dataset.id)
    ).scalar_one()
    rows = [
        {
            "dataset_pk": pk,
            "run_id": m.run_id,
            "content_hash": m.content_hash,
            "received_at": m.received_at,
        }
        for m in members
    ]
    for start in range(0, len(rows), _INSERT_BATCH):
        conn.execute(insert(DatasetRun), rows[start : start + _INSERT_BATCH])
    return dataset_manifest(session, name)


def _dataset(conn: Connection, name: str) -> Any:
    row = conn.execute(select(Dataset).where(Dataset.name == name)).first()
    if row is None:
        raise NotFound(f"no dataset named {name!r}", name=name)
    return row


def _header(row: Any) -> dict[str, Any]:
    return {
        "name": row.name,
        "created_at": row.created_at,
        "created_by": row.created_by,
        "note": row.note,
        "filter": row.filter,
        "n_runs": row.n_runs,
        "manifest_hash": row.manifest_hash,
    }


def dataset_manifest(session: Session, name: str) -> dict[str, Any]:
    """A dataset's manifest: what was recorded, and how many of its runs are still there
    as recorded (`present`), gone (`missing`: force-deleted) or `changed` (deleted and
    stored again with other content)."""
    conn = session.connection()
    row = _dataset(conn, name)
    counts = {"present": 0, "missing": 0, "changed": 0}
    for state, n in conn.execute(_STATES.where(DatasetRun.dataset_pk == row.id)):
        counts[state] += n
    return {**_header(row), **counts}


# A recorded run's state now: its run_id gone, stored with another content hash, or there.
_STATE = case(
    (Run.id.is_(None), "missing"),
    (Run.content_hash != DatasetRun.content_hash, "changed"),
    else_="present",
).label("state")
_STATES = (
    select(_STATE, func.count())
    .select_from(DatasetRun)
    .outerjoin(Run, Run.run_id == DatasetRun.run_id)
    .group_by(_STATE)
)


def dataset_runs(session: Session, name: str) -> list[dict[str, Any]]:
    """A dataset's runs in run_id order: run_id, content hash, received_at and state."""
    conn = session.connection()
    row = _dataset(conn, name)
    query = (
        select(DatasetRun.run_id, DatasetRun.content_hash, DatasetRun.received_at, _STATE)
        .outerjoin(Run, Run.run_id == DatasetRun.run_id)
        .where(DatasetRun.dataset_pk == row.id)
        .order_by(DatasetRun.run_id)
    )
    return [dict(r._mapping) for r in conn.execute(query)]


def dataset_run_ids(session: Session, name: str) -> list[str]:
    """The run ids a dataset recorded (NotFound when there is no such dataset)."""
    conn = session.connection()
    row = _dataset(conn, name)
    query = select(DatasetRun.run_id).where(DatasetRun.dataset_pk == row.id)
    return list(conn.execute(query.order_by(DatasetRun.run_id)).scalars())


def list_datasets(session: Session) -> list[dict[str, Any]]:
    """Every dataset's header, oldest first."""
    rows = session.connection().execute(select(Dataset).order_by(Dataset.id))
    return [_header(r) for r in rows]


def drop_dataset(session: Session, name: str) -> dict[str, Any]:
    """Drop dataset `name`, unpinning its runs (they stay); returns its manifest."""
    manifest = dataset_manifest(session, name)
    conn = session.connection()
    pk = _dataset(conn, name).id
    conn.execute(delete(DatasetRun).where(DatasetRun.dataset_pk == pk))
    conn.execute(delete(Dataset).where(Dataset.id == pk))
    return manifest


def pins(conn: Connection, run_ids: Sequence[str]) -> dict[str, list[str]]:
    """The datasets pinning each of `run_ids` (only pinned ones appear), names sorted."""
    out: dict[str, list[str]] = {}
    if not run_ids:
        return out
    query = (
        select(DatasetRun.run_id, Dataset.name)
        .join(Dataset, Dataset.id == DatasetRun.dataset_pk)
        .where(DatasetRun.run_id.in_(list(run_ids)))
        .order_by(DatasetRun.run_id, Dataset.name)
    )
    for run_id, name in conn.execute(query):
        out.setdefault(run_id, []).append(name)
    return out


def pinned_run_ids() -> Any:
    """A subquery of every pinned run_id (for `Run.run_id.not_in(...)`)."""
    return select(DatasetRun.run_id)

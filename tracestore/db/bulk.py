"""Bulk writes for the ingest hot path, below SQLAlchemy's per-row machinery.

The ORM and Core executemany spend most of an ingest's time building parameters row by
row. Here rows go straight to the driver: sqlite3 `executemany` on SQLite, `COPY ... FROM
STDIN` on PostgreSQL, on the SQLAlchemy connection's own transaction. Values are adapted
exactly as the column types in `db/types.py` would (JSON text, NUL-safe text on
PostgreSQL, naive-UTC datetime text on SQLite), so rows read back the same either way.

Primary keys are allocated before the insert, so children can reference parents without a
RETURNING round trip per row: from the table's sequence on PostgreSQL, and on SQLite from
max(id) + 1, which is safe because writers hold SQLite's single write lock from BEGIN
IMMEDIATE (`db/engine.py`) until they commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Table, text

from tracestore.db.types import JSONValue, SafeText, UTCDateTime, json_dumps, json_dumps_pg, pg_safe

Adapter = Callable[[Any], Any]


def _aware(value: datetime) -> datetime:
    # As UTCDateTime refuses them: a naive datetime names no instant (astimezone would take
    # it as local time, PostgreSQL as the session's zone).
    if value.tzinfo is None:
        raise ValueError("naive datetime: tracestore stores aware UTC datetimes only")
    return value


def _sqlite_datetime(value: datetime | None) -> str | None:
    if value is None:
        return None
    # The text SQLAlchemy's SQLite DateTime writes: naive UTC, always 6 fraction digits.
    utc = _aware(value).astimezone(UTC).replace(tzinfo=None)
    return utc.isoformat(" ", timespec="microseconds")


def _pg_text(value: str | None) -> str | None:
    return pg_safe(value) if value is not None and "\x00" in value else value


def _nullable(fn: Callable[[Any], Any]) -> Adapter:
    return lambda v: None if v is None else fn(v)


def _adapter(column_type: object, dialect: str) -> Adapter | None:
    if isinstance(column_type, JSONValue):
        return _nullable(json_dumps_pg if dialect == "postgresql" else json_dumps)
    if isinstance(column_type, SafeText) and dialect == "postgresql":
        return _pg_text
    if isinstance(column_type, UTCDateTime):
        return _sqlite_datetime if dialect == "sqlite" else _nullable(_aware)
    return None


class BulkTable:
    """One table's bulk writer for one dialect: column order and value adapters."""

    def __init__(self, table: Table, dialect: str, columns: Sequence[str]) -> None:
        self.table = table
        self.dialect = dialect
        self.columns = list(columns)
        self.adapters = [_adapter(table.c[name].type, dialect) for name in self.columns]
        names = ", ".join(f'"{c}"' for c in self.columns)
        if dialect == "postgresql":
            self.sql = f'COPY "{table.name}" ({names}) FROM STDIN'
        else:
            marks = ", ".join("?" for _ in self.columns)
            self.sql = f'INSERT INTO "{table.name}" ({names}) VALUES ({marks})'

    def tuples(self, rows: Sequence[dict[str, Any]]) -> Iterator[tuple[Any, ...]]:
        """Rows as adapted tuples in column order, one at a time.

        Lazily: serialized JSON exists for one row at a time, not for the whole rollout,
        which keeps peak memory near the parsed document's size for large rollouts.
        """
        pairs = list(zip(self.columns, self.adapters, strict=True))
        for row in rows:
            yield tuple(row[c] if fn is None else fn(row[c]) for c, fn in pairs)

    def write(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Insert `rows` (dicts holding every column of this writer) on `conn`."""
        if not rows:
            return
        raw = conn.connection.driver_connection
        data = self.tuples(rows)
        if self.dialect == "postgresql":
            with raw.cursor() as cursor, cursor.copy(self.sql) as copy:  # type: ignore[union-attr]
                for item in data:
                    copy.write_row(item)
        else:
            raw.executemany(self.sql, data)  # type: ignore[union-attr]


def allocate_ids(conn: Connection, table: Table, n: int) -> list[int]:
    """`n` fresh primary keys for `table` (see the module docstring for why this is safe)."""
    if n == 0:
        return []
    if conn.dialect.name == "postgresql":
        rows = conn.execute(
            text("SELECT nextval(pg_get_serial_sequence(:t, 'id')) FROM generate_series(1, :n)"),
            {"t": table.name, "n": n},
        )
        return [r[0] for r in rows]
    start = conn.execute(text(f'SELECT coalesce(max(id), 0) FROM "{table.name}"')).scalar_one()
    return list(range(start + 1, start + 1 + n))


_cache: dict[tuple[str, str, tuple[str, ...]], BulkTable] = {}


def writer(table: Table, dialect: str, columns: Sequence[str]) -> BulkTable:
    """The (cached) bulk writer of `table` for these columns."""
    key = (table.name, dialect, tuple(columns))
    found = _cache.get(key)
    if found is None:
        found = _cache[key] = BulkTable(table, dialect, columns)
    return found


def bulk_insert(conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    """Insert rows that all have the same keys (the columns written)."""
    if rows:
        writer(table, conn.dialect.name, list(rows[0])).write(conn, rows)

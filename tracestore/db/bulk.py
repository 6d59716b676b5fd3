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

On PostgreSQL each COPY is two round trips, and a rollout writes up to ten tables: for a
group of small rollouts that was most of the write (bench/README.md item 18). So
`bulk_insert_all` sends the tables with few values as multi-row INSERTs in one pipeline
(one round trip for all of them), and keeps COPY for a table of many rows, where its
cheaper per-row encoding wins. The INSERTs' values go as untyped text, which the server
reads as the column's type, exactly as it reads COPY's text: both paths store the same.
Each INSERT is padded to the next power-of-two row count and prepared (`padded_insert`):
its text changed with every row count, and the server parsed and planned it each time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

import psycopg
from psycopg.adapt import Dumper
from sqlalchemy import Connection, Dialect, Table
from sqlalchemy.exc import DBAPIError

from tracestore.db.types import JSONValue, SafeText, UTCDateTime, json_dumps, json_dumps_pg, pg_safe

Adapter = Callable[[Any], Any]
# A table of at most this many values (rows x columns) goes in the pipeline of INSERTs on
# PostgreSQL; a larger one by COPY (bench/README.md item 18 measured the crossing).
PIPELINE_MAX_VALUES = 2000
# The largest row count padded_insert pads to and prepares: its statements hold ~5 MB of
# a backend's memory (PERFORMANCE.md, eleventh round); up to 64, twice that.
PADDED_MAX_ROWS = 32
# The prepared statements a PostgreSQL connection keeps (psycopg's default is 100): the
# pipeline's INSERTs (a few row counts for each of ~10 tables, _pipelined) besides the
# statements psycopg prepares on its own, the look-ups' among them.
PREPARED_MAX = 256


class _Untyped(Dumper):
    """A number or boolean as untyped text (`unknown`): the server reads it as the
    column's type, as COPY's text format has it read (psycopg would send an int as
    int2/int4/int8 or numeric, which a boolean column refuses)."""

    oid = 0

    def dump(self, obj: Any) -> bytes:
        """The value's text."""
        return str(obj).encode()


class _UntypedDatetime(Dumper):
    """An aware datetime as untyped text (ISO 8601 with its offset): the same instant
    read as the column's type. Typed (timestamptz), a datetime and a NULL (untyped) in the
    same place made two prepared statements of one text (psycopg keys them by types)."""

    oid = 0

    def dump(self, obj: Any) -> bytes:
        """The value's ISO text."""
        return obj.isoformat().encode()  # type: ignore[no-any-return]


class _UntypedBytes(Dumper):
    """Bytes as untyped text in bytea's hex form, for the reason _UntypedDatetime gives."""

    oid = 0

    def dump(self, obj: Any) -> bytes:
        """`\\x` and the bytes in hex."""
        return b"\\x" + bytes(obj).hex().encode()


@contextmanager
def driver_errors(conn: Connection, statement: str) -> Iterator[None]:
    """Raise the driver's errors inside as SQLAlchemy raises them for its own statements.

    The bulk paths talk to the driver directly, so without this a lost connection reached
    the API as the driver's OperationalError, answered 500, where SQLAlchemy's is answered
    503 with Retry-After (api/errors.py); and the dead connection went back to the pool.
    A unique violation comes out as SQLAlchemy's IntegrityError (the driver's is `.orig`).
    """
    dbapi = conn.dialect.loaded_dbapi
    try:
        yield
    except dbapi.Error as exc:
        gone = conn.dialect.is_disconnect(exc, conn.connection.dbapi_connection, None)
        if gone:
            # As SQLAlchemy does on a disconnect: this connection is never handed out again.
            conn.invalidate(exc)
        raise DBAPIError.instance(
            statement, None, exc, dbapi.Error, connection_invalidated=gone, dialect=conn.dialect
        ) from exc


def _aware(value: datetime) -> datetime:
    # As UTCDateTime refuses them: a naive datetime names no instant (astimezone would take
    # it as local time, PostgreSQL as the session's zone).
    if value.tzinfo is None:
        raise ValueError("naive datetime: tracestore stores aware UTC datetimes only")
    return value


def _sqlite_datetime(value: datetime) -> str:
    # The text SQLAlchemy's SQLite DateTime writes: naive UTC, always 6 fraction digits.
    utc = _aware(value).astimezone(UTC).replace(tzinfo=None)
    return utc.isoformat(" ", timespec="microseconds")


def _pg_text(value: str) -> str:
    return pg_safe(value) if "\x00" in value else value


def _adapter(column_type: object, dialect: str) -> Adapter | None:
    # Adapters never see NULL: tuples() keeps None as None.
    if isinstance(column_type, JSONValue):
        return json_dumps_pg if dialect == "postgresql" else json_dumps
    if isinstance(column_type, SafeText) and dialect == "postgresql":
        return _pg_text
    if isinstance(column_type, UTCDateTime):
        return _sqlite_datetime if dialect == "sqlite" else _aware
    return None


class BulkTable:
    """One table's bulk writer for one dialect: column order and value adapters."""

    def __init__(self, table: Table, dialect: str, columns: Sequence[str]) -> None:
        self.table = table
        self.dialect = dialect
        self.columns = list(columns)
        self.adapters = [_adapter(table.c[name].type, dialect) for name in self.columns]
        # A row's values in column order at C speed (itemgetter of one name gives the bare
        # value), then each adapter on its own position: a generator per row over every
        # column cost more than the driver's own insert on SQLite (bench/README item 19).
        self._values: Callable[[dict[str, Any]], Any] = itemgetter(*self.columns)
        self._one = len(self.columns) == 1
        self._adapted = [(i, fn) for i, fn in enumerate(self.adapters) if fn is not None]
        self._inserts: dict[int, str] = {}  # insert_sql's, by row count
        # padded_sql's, by power-of-two row count and first parameter
        self._padded: dict[tuple[int, int], str] = {}
        # The primary key's position (never NULL: keys are allocated before the write).
        primary = [c.name for c in table.primary_key.columns]
        self._key = next((i for i, c in enumerate(self.columns) if c in primary), 0)
        self._pg_types: list[str] = []  # each column's type, as padded_insert casts to it
        names = ", ".join(f'"{c}"' for c in self.columns)
        if dialect == "postgresql":
            self.sql = f'COPY "{table.name}" ({names}) FROM STDIN'
        else:
            marks = ", ".join("?" for _ in self.columns)
            self.sql = f'INSERT INTO "{table.name}" ({names}) VALUES ({marks})'

    def tuples(self, rows: Sequence[dict[str, Any]]) -> Iterator[Sequence[Any]]:
        """Rows as adapted values in column order, one row at a time.

        Lazily: serialized JSON exists for one row at a time, not for the whole rollout,
        which keeps peak memory near the parsed document's size for large rollouts.
        """
        values, adapted = self._values, self._adapted
        for row in rows:
            found = values(row)
            if self._one:
                found = (found,)
            if not adapted:
                yield found
                continue
            out = list(found)
            for i, fn in adapted:
                value = out[i]
                if value is not None:  # NULL stays NULL, whatever the column's type
                    out[i] = fn(value)
            yield out

    def insert_sql(self, n: int) -> str:
        """A PostgreSQL INSERT of `n` rows of this writer's columns ($1, $2, ...: the
        server's own placeholders, which psycopg's RawCursor sends without parsing the
        text for them, a regex pass that cost more than the COPY it replaces)."""
        found = self._inserts.get(n)
        if found is not None:
            return found
        width = len(self.columns)
        rows = (
            "(" + ", ".join(f"${r * width + c + 1}" for c in range(width)) + ")" for r in range(n)
        )
        names = ", ".join(f'"{c}"' for c in self.columns)
        sql = f'INSERT INTO "{self.table.name}" ({names}) VALUES ' + ", ".join(rows)
        if len(self._inserts) < 256:  # the first row counts met: groups and batch chunks
            self._inserts[n] = sql
        return sql

    def padded_insert(
        self, rows: Sequence[dict[str, Any]], dialect: Dialect
    ) -> tuple[str, list[Any], bool]:
        """A PostgreSQL INSERT of `rows` and its values: ... SELECT FROM (VALUES ...) of the
        next power-of-two row count, the rows past `rows` NULLs its WHERE drops."""
        n, values = self.padded_values(rows)
        if n is None:
            return self.insert_sql(len(rows)), values, False
        return self.padded_sql(n, dialect), values, True

    def padded_values(self, rows: Sequence[dict[str, Any]]) -> tuple[int | None, list[Any]]:
        """`rows`' values for `padded_sql` of the returned row count (NULLs padding them to
        it), or for the plain `insert_sql` when the count is None."""
        width = len(self.columns)
        n = 1 << (len(rows) - 1).bit_length()
        values = [value for row in self.tuples(rows) for value in row]
        # Past PADDED_MAX_ROWS rows (a batch's table) planning is a smaller part of the
        # insert, and a prepared text of so many values holds megabytes of the backend's
        # memory: the plain INSERT, not prepared. A row without its key is refused by the
        # plain INSERT (padding rows have none).
        if n > PADDED_MAX_ROWS or None in values[self._key :: width]:
            return None, values
        values.extend([None] * (width * (n - len(rows))))
        return n, values

    def padded_sql(self, n: int, dialect: Dialect, first: int = 1) -> str:
        """The padded INSERT of `n` rows, its parameters numbered from `first`."""
        found = self._padded.get((n, first))
        if found is not None:
            return found
        if not self._pg_types:
            self._pg_types = [self.table.c[c].type.compile(dialect) for c in self.columns]
        width = len(self.columns)
        marks = ", ".join(
            "("
            + ", ".join(f"${first + r * width + c}::{t}" for c, t in enumerate(self._pg_types))
            + ")"
            for r in range(n)
        )
        names = ", ".join(f'"{c}"' for c in self.columns)
        found = (
            f'INSERT INTO "{self.table.name}" ({names}) SELECT * FROM (VALUES {marks}) '
            f'AS v({names}) WHERE v."{self.columns[self._key]}" IS NOT NULL'
        )
        if len(self._padded) < 256:  # the counts and places met: a few per workload
            self._padded[(n, first)] = found
        return found

    def write(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Insert `rows` (dicts holding every column of this writer) on `conn`."""
        if not rows:
            return
        raw = conn.connection.driver_connection
        data = self.tuples(rows)
        with driver_errors(conn, self.sql):
            if self.dialect == "postgresql":
                with raw.cursor() as cursor, cursor.copy(self.sql) as copy:  # type: ignore[union-attr]
                    for item in data:
                        copy.write_row(item)
            else:
                raw.executemany(self.sql, data)  # type: ignore[union-attr]


def allocate_ids(conn: Connection, table: Table, n: int) -> list[int]:
    """`n` fresh primary keys for `table` (see the module docstring for why this is safe)."""
    return allocate_ids_many(conn, [(table, n)])[0]


def _asked(wanted: Sequence[tuple[Table, int]]) -> list[tuple[int, Table, int]]:
    return [(i, table, n) for i, (table, n) in enumerate(wanted) if n > 0]


def _pg_keys_sql(asked: Sequence[tuple[int, Table, int]]) -> tuple[str, dict[str, int]]:
    # The counts as parameters: one statement text per set of tables, not per count
    # (psycopg prepares a text it meets often, in a cache of 100 per connection).
    parts = " UNION ALL ".join(
        f"SELECT {i}, nextval(pg_get_serial_sequence('{table.name}', 'id')) "
        f"FROM generate_series(1, %(n{i})s)"
        for i, table, _n in asked
    )
    return parts, {f"n{i}": n for i, _table, n in asked}


def _sqlite_keys_sql(asked: Sequence[tuple[int, Table, int]]) -> str:
    # Every table's max(id) in one statement: a group of small posts asked for three or
    # four, and each statement's own cost was a part of the group's fixed cost.
    maxes = ", ".join(f'(SELECT coalesce(max(id), 0) FROM "{table.name}")' for _, table, _ in asked)
    return f"SELECT {maxes}"


def _sqlite_keys(
    asked: Sequence[tuple[int, Table, int]], starts: Sequence[int], keys: list[list[int]]
) -> list[list[int]]:
    for (i, _table, n), start in zip(asked, starts, strict=True):
        keys[i] = list(range(start + 1, start + 1 + n))
    return keys


def allocate_ids_many(conn: Connection, wanted: Sequence[tuple[Table, int]]) -> list[list[int]]:
    """Fresh primary keys for several tables, `n` each: on PostgreSQL in one statement (one
    round trip), on SQLite from each table's max(id)."""
    keys: list[list[int]] = [[] for _ in wanted]
    asked = _asked(wanted)
    if not asked:
        return keys
    if conn.dialect.name == "postgresql":
        sql, counts = _pg_keys_sql(asked)
        # Through SQLAlchemy: its errors (a lost connection, a timeout) are the ones the
        # API answers (api/errors.py).
        for i, key in conn.exec_driver_sql(sql, counts):
            keys[i].append(key)
        return keys
    return _sqlite_keys(asked, conn.exec_driver_sql(_sqlite_keys_sql(asked)).one(), keys)


# The savepoint `open_write` sets and `undo_write` returns to. Never released: the commit
# keeps what was written after it, and a RELEASE was one more round trip per write.
WRITE_SAVEPOINT = "tracestore_write"


def open_write(
    conn: Connection,
    reads: Sequence[tuple[str, Sequence[Any]]],
    wanted: Sequence[tuple[Table, int]],
) -> tuple[list[list[tuple[Any, ...]]], list[list[int]] | None]:
    """Before a bulk write: run `reads` (driver SQL and its parameters; their rows come
    back) and set the savepoint that `undo_write` returns to; on SQLite also allocate keys
    for `wanted` (as allocate_ids_many), None on PostgreSQL.

    On PostgreSQL the reads and the savepoint go in one pipeline: one round trip where
    they were two, and a third for the RELEASE after the write, each ~35 us of the
    worker's CPU and more of the server's (psycopg still waits for the transaction's BEGIN
    on its own: a pipeline syncs after it). Its keys are not taken here: a sequence's
    values are taken for good, so keys taken before the look-up for a run_id it then finds
    stored would be lost, and the same rollouts would get other keys than on SQLite; the
    ingest's read takes them itself, for the run_ids it does not find (store/rollouts.py
    `_FIND_AND_KEY_PG`). On SQLite, on the driver: SQLAlchemy's own cost per statement was
    a part of a group's fixed cost (bench/README.md item 20); keys from max(id) take
    nothing from anyone.
    """
    if not conn.in_transaction():
        # As SQLAlchemy's first statement would (its autobegin): the driver's statements
        # below do not begin SQLAlchemy's transaction, and SQLite's BEGIN IMMEDIATE (the
        # write lock the keys rely on) is sent when it begins.
        conn.begin()
    raw: Any = conn.connection.driver_connection
    with driver_errors(conn, f"SAVEPOINT {WRITE_SAVEPOINT} (with its reads)"):
        if conn.dialect.name != "postgresql":
            keys: list[list[int]] = [[] for _ in wanted]
            rows = [raw.execute(sql, params).fetchall() for sql, params in reads]
            asked = _asked(wanted)
            if asked:
                _sqlite_keys(asked, raw.execute(_sqlite_keys_sql(asked)).fetchone(), keys)
            raw.execute(f"SAVEPOINT {WRITE_SAVEPOINT}")
            return rows, keys
        cursors = []
        try:
            with raw.pipeline():
                for sql, params in reads:
                    cursors.append(raw.cursor())
                    cursors[-1].execute(sql, params)
                raw.execute(f"SAVEPOINT {WRITE_SAVEPOINT}")
            return [cursor.fetchall() for cursor in cursors], None
        finally:
            for cursor in cursors:
                cursor.close()


def undo_write(conn: Connection) -> None:
    """Undo what was written since `open_write` (the transaction goes on)."""
    with driver_errors(conn, f"ROLLBACK TO SAVEPOINT {WRITE_SAVEPOINT}"):
        conn.connection.driver_connection.execute(f"ROLLBACK TO SAVEPOINT {WRITE_SAVEPOINT}")  # type: ignore[union-attr]


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


def bulk_insert_all(
    conn: Connection,
    writes: Sequence[tuple[Table, Sequence[dict[str, Any]]]],
    pipeline_max_values: int | None = None,
) -> None:
    """Insert each table's rows (each table's rows with the same keys), in the order given
    (parents first: foreign keys are checked row by row). On PostgreSQL, a table of at most
    `pipeline_max_values` values goes with the other small ones in one pipeline of INSERTs;
    a larger one by COPY, in its place in the order (None: PIPELINE_MAX_VALUES)."""
    if pipeline_max_values is None:
        pipeline_max_values = PIPELINE_MAX_VALUES
    dialect = conn.dialect.name
    todo = [(writer(table, dialect, list(rows[0])), rows) for table, rows in writes if rows]
    if dialect != "postgresql":
        for bulk, rows in todo:
            bulk.write(conn, rows)
        return
    small: list[tuple[BulkTable, Sequence[dict[str, Any]]]] = []
    # PostgreSQL binds at most 65,535 parameters to one statement.
    pipeline_max_values = min(pipeline_max_values, 65_535)
    for bulk, rows in todo:
        if len(rows) * len(bulk.columns) <= pipeline_max_values:
            small.append((bulk, rows))
            continue
        _pipelined(conn, small)  # what comes before it, first
        small = []
        bulk.write(conn, rows)
    _pipelined(conn, small)


def _pipelined(
    conn: Connection, writes: Sequence[tuple[BulkTable, Sequence[dict[str, Any]]]]
) -> None:
    """Multi-row INSERTs of `writes`, in order: one statement (see `combined_insert`)
    when every table's fits a padded INSERT, else one each in a psycopg pipeline. One
    round trip either way."""
    if not writes:
        return
    raw: Any = conn.connection.driver_connection
    if raw.prepared_max < PREPARED_MAX:
        raw.prepared_max = PREPARED_MAX
    names = ", ".join(bulk.table.name for bulk, _rows in writes)
    parts = [(bulk, *bulk.padded_values(rows)) for bulk, rows in writes]
    with driver_errors(conn, f"INSERTs into {names}"), psycopg.RawCursor(raw) as cursor:
        for kind in (int, float, bool):
            cursor.adapters.register_dumper(kind, _Untyped)
        # Every value untyped: one prepared statement for each text (see _UntypedDatetime).
        cursor.adapters.register_dumper(datetime, _UntypedDatetime)
        cursor.adapters.register_dumper(bytes, _UntypedBytes)
        counts = [n for _bulk, n, _values in parts]
        if len(parts) > 1 and None not in counts:
            shape = tuple((bulk, n) for bulk, n, _ in parts if n is not None)
            # Prepared once met a few times (psycopg's threshold), not at once: rollouts
            # of many shapes make many texts, and each prepared one holds the plans of all
            # its tables in the backend (at most PREPARED_MAX a connection, then evicted).
            cursor.execute(
                combined_insert(shape, conn.dialect),
                [v for _bulk, _n, values in parts for v in values],
                prepare=None,
            )
            return
        with raw.pipeline():
            for bulk, n, values in parts:
                if n is None:
                    cursor.execute(bulk.insert_sql(len(values) // len(bulk.columns)), values)
                else:
                    cursor.execute(bulk.padded_sql(n, conn.dialect), values, prepare=True)


@functools.lru_cache(maxsize=1024)  # the shapes of group met lately: a few per workload
def combined_insert(parts: tuple[tuple[BulkTable, int], ...], dialect: Dialect) -> str:
    """One statement inserting each table's padded rows (`n` rows of each, in order): the
    first tables' INSERTs as data-modifying WITH queries, the last one's as the statement.

    One statement where a group of small rollouts sent one a table (six to eight): each
    was ~30 us of psycopg's Python on the worker (PERFORMANCE.md, fifteenth round). The
    foreign keys still hold: PostgreSQL checks them at the end of the statement, once
    every table's rows are in (no trigger on these tables runs earlier).
    """
    first = 1
    inserts = []
    for bulk, n in parts:
        inserts.append(bulk.padded_sql(n, dialect, first))
        first += n * len(bulk.columns)
    withs = ", ".join(f"w{i} AS ({sql})" for i, sql in enumerate(inserts[:-1]))
    return f"WITH {withs} {inserts[-1]}"

"""DuckDB over the store (SQLite or PostgreSQL, read-only) or over a Parquet snapshot.

Every source ends up as the same names in DuckDB's `main` schema: the store's tables
(`runs`, `steps`, `trace_events`, ...; never `run_documents`, the raw bodies) with
normalized types, TIMESTAMPTZ in UTC for datetimes and DuckDB JSON for JSON columns, then
the friendly views of `views.sql`. Reports read those names, so their figures are the
same whichever source they run on.

The store is read in place: the SQLite file through DuckDB's sqlite extension and
PostgreSQL through its postgres extension, both attached READ_ONLY. DuckDB's sqlite
extension carries its own copy of the SQLite library, which must never open a live store
inside a process that also uses it through Python's sqlite3 (see `reports/live.py`, which
runs it in a child process); `open_live` refuses to unless told it may. The extensions are
loaded from the files of the PyPI packages duckdb-extension-sqlite-scanner and
duckdb-extension-postgres-scanner, never downloaded. When an extension cannot be loaded
(or the store cannot be attached) the tables are read through SQLAlchemy into Arrow
instead, with a one-line notice.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs
from sqlalchemy import (
    Boolean,
    Column,
    Date,
    DateTime,
    Engine,
    Float,
    Integer,
    LargeBinary,
    Numeric,
    Table,
)
from sqlalchemy.engine import URL
from sqlalchemy.types import TypeDecorator, TypeEngine

from tracestore.db.types import JSONValue, UTCDateTime
from tracestore.errors import InvalidRequest, Unavailable, first_line
from tracestore.reports import lake
from tracestore.reports.catalog import views_sql
from tracestore.reports.lake import EPOCH_SUFFIX
from tracestore.reports.memory import configured_limit, memory_limit, unreadable_limit
from tracestore.reports.snapshot import Manifest, SnapshotTable, read_manifest
from tracestore.reports.spill import spill_directory

# Tables analytics never expose: the zstd raw documents (GET /v1/rollouts/{run_id} serves
# them) are large, opaque and not for aggregation.
EXCLUDED_TABLES = frozenset({"run_documents"})
# backend -> (PyPI package, extension name, DuckDB ATTACH type)
EXTENSIONS = {
    "sqlite": ("duckdb_extension_sqlite_scanner", "sqlite_scanner", "sqlite"),
    "postgresql": ("duckdb_extension_postgres_scanner", "postgres_scanner", "postgres"),
    # Not a backend: Delta Lake tables written by `tracestore export --format delta`.
    "delta": ("duckdb_extension_delta", "delta", "delta"),
}
_ARROW_BATCH_ROWS = 50_000
T = TypeVar("T")
# True in the analytics child process (reports/live.py), the one place a live SQLite
# store may be attached by DuckDB's own SQLite library.
_SQLITE_ATTACH_ALLOWED = False


class AnalyticsError(Unavailable):
    """DuckDB could not answer (a report failed, the store could not be read): 503."""

    code = "analytics_error"


class ExtensionUnavailable(Exception):
    """A DuckDB extension file is missing or does not load."""


def quote_ident(name: str) -> str:
    """A DuckDB identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


def sql_literal(text: str) -> str:
    """A DuckDB string literal (for statements that take no parameters: LOAD, ATTACH, SET)."""
    return "'" + text.replace("'", "''") + "'"


# --- types --------------------------------------------------------------------------------


def duck_type(column: Column[Any]) -> str:
    """The DuckDB type a store column is normalized to on every source."""
    sa_type: TypeEngine[Any] = column.type
    if isinstance(sa_type, JSONValue):
        return "JSON"
    if isinstance(sa_type, UTCDateTime | DateTime):
        return "TIMESTAMPTZ"
    if isinstance(sa_type, TypeDecorator):
        sa_type = sa_type.impl_instance
    if isinstance(sa_type, Boolean):
        return "BOOLEAN"
    if isinstance(sa_type, Integer):
        return "BIGINT"
    if isinstance(sa_type, Float | Numeric):
        return "DOUBLE"
    if isinstance(sa_type, Date):
        return "DATE"
    if isinstance(sa_type, LargeBinary):
        return "BLOB"
    return "VARCHAR"


def model_tables() -> dict[str, Table]:
    """The store's tables as the models declare them, minus the excluded ones."""
    import tracestore.models  # noqa: F401  (registers every table on Base.metadata)
    from tracestore.db.base import Base

    return {str(t.name): t for t in Base.metadata.sorted_tables if t.name not in EXCLUDED_TABLES}


# --- extensions and attach strings ----------------------------------------------------------


def extension_path(backend: str, extension_dir: Path | None = None) -> Path:
    """The extension file for `backend`: in `extension_dir`, else in its PyPI package."""
    package, name, _ = EXTENSIONS[backend]
    if extension_dir is not None:
        return extension_dir / f"{name}.duckdb_extension"
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ExtensionUnavailable(f"the Python package {package} is not installed")
    base = Path(next(iter(spec.submodule_search_locations)))
    return base / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"


def load_extension(
    con: duckdb.DuckDBPyConnection, backend: str, extension_dir: Path | None = None
) -> Path:
    """LOAD the backend's scanner from its file (never INSTALL: no network); return the path."""
    path = extension_path(backend, extension_dir)
    if not path.is_file():
        raise ExtensionUnavailable(f"{path} does not exist")
    try:
        # The PyPI packages carry DuckDB's signed release binaries: a plain LOAD of the
        # path verifies the signature, so unsigned extensions stay disallowed.
        con.execute(f"LOAD {sql_literal(str(path))}")
    except duckdb.Error as exc:
        raise ExtensionUnavailable(first_line(exc)) from exc
    return path


def _libpq_value(value: str) -> str:
    # libpq keyword/value syntax: single-quoted, with \ and ' escaped by a backslash.
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def attach_target(url: URL) -> tuple[str, str]:
    """(DuckDB ATTACH type, target) for a store URL: a SQLite path or a libpq string.

    The one place SQLAlchemy URLs become DuckDB attach strings.
    """
    backend = url.get_backend_name()
    if backend == "sqlite":
        database = url.database
        if not database or database == ":memory:" or database.startswith("file:"):
            raise InvalidRequest(f"cannot read the SQLite store {database!r}: give a file path")
        path = Path(database).expanduser().resolve()
        if not path.is_file():
            raise InvalidRequest(f"no SQLite store at {path}")
        return "sqlite", str(path)
    if backend == "postgresql":
        parts: dict[str, str] = {}
        if url.host:
            parts["host"] = url.host
        if url.port:
            parts["port"] = str(url.port)
        if url.username:
            parts["user"] = url.username
        if url.password is not None:
            parts["password"] = str(url.password)
        if url.database:
            parts["dbname"] = url.database
        # psycopg URLs carry libpq parameters in the query (sslmode, host=/socket/dir, ...).
        for key, value in url.query.items():
            parts[key] = ",".join(value) if isinstance(value, tuple) else value
        return "postgres", " ".join(f"{k}={_libpq_value(v)}" for k, v in parts.items())
    raise InvalidRequest(f"analytics read SQLite or PostgreSQL stores, not {backend!r}")


# --- the connection -------------------------------------------------------------------------


def new_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB that never fetches extensions, works in UTC, and keeps to
    its memory limit (spilling what it can)."""
    limit = memory_limit()
    try:
        con = duckdb.connect(
            ":memory:",
            config={
                # Extensions come from the installed package files only: never from the
                # network, not even implicitly when a query needs one.
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
                "temp_directory": spill_directory(),
                **({"memory_limit": limit} if limit else {}),
            },
        )
    except duckdb.Error as exc:
        if configured_limit():  # the one setting an operator writes
            raise AnalyticsError(unreadable_limit(limit, first_line(exc))) from None
        raise AnalyticsError(f"DuckDB did not start: {first_line(exc)}") from None
    # Day boundaries and displayed times are UTC whatever the machine's zone.
    con.execute("SET TimeZone = 'UTC'")
    return con


@dataclass
class Analytics:
    """A DuckDB connection whose main schema holds the store's tables and friendly views."""

    con: duckdb.DuckDBPyConnection
    source: str  # 'sqlite', 'postgresql' or 'snapshot'
    tables: frozenset[str]
    missing: frozenset[str] = frozenset()
    notices: list[str] = field(default_factory=list)
    manifest: Manifest | None = None
    # How to re-read one table through SQLAlchemy (live stores read by an extension).
    _reload: Callable[[], bool] | None = None

    def __enter__(self) -> Analytics:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the DuckDB connection (the store itself is untouched)."""
        self.con.close()

    def cursor(self) -> Analytics:
        """Another connection to the same DuckDB (its views and attachment), for one thread."""
        return Analytics(
            con=self.con.cursor(),
            source=self.source,
            tables=self.tables,
            missing=self.missing,
            notices=self.notices,
            manifest=self.manifest,
            _reload=self._reload,
        )

    def relation(self, sql: str, params: dict[str, Any] | None = None) -> duckdb.DuckDBPyRelation:
        """Bind `sql` (a SELECT) with its parameters."""
        return self.con.sql(sql, params=params or None)

    def fetch(self, sql: str, params: dict[str, Any] | None = None) -> tuple[pa.Table, list[str]]:
        """Run a SELECT; return its rows as Arrow and its DuckDB column types."""
        return self.retrying(lambda: self._fetch(sql, params))

    def retrying(self, work: Callable[[], T]) -> T:
        """Run `work` (DuckDB statements over the store); run it once more after reading
        through SQLAlchemy the tables the sqlite scanner refused."""
        try:
            return work()
        except duckdb.Error as exc:
            # A SQLite JSON column holds a bare number (its NUMERIC affinity stored the
            # JSON text `5` as an integer), which the scanner refuses: read the affected
            # tables through SQLAlchemy and try once more.
            mismatch = "Mismatch Type Error" in str(exc)
            if mismatch and self._reload is not None and self._reload():
                return work()
            raise

    def _fetch(self, sql: str, params: dict[str, Any] | None) -> tuple[pa.Table, list[str]]:
        rel = self.relation(sql, params)
        types = [str(t) for t in rel.types]
        return rel.to_arrow_table(), types


def _cast(expr: str, target: str, backend: str) -> str:
    if target == "TIMESTAMPTZ" and backend == "sqlite":
        # SQLite stores naive UTC text; read it as UTC whatever the session zone.
        return f"timezone('UTC', CAST({expr} AS TIMESTAMP))"
    return f"CAST({expr} AS {target})"


def _base_view(
    con: duckdb.DuckDBPyConnection,
    table: Table,
    relation: str,
    present: Iterable[str],
    backend: str,
) -> None:
    have = set(present)
    exprs = []
    for column in table.columns:
        target = duck_type(column)
        name = quote_ident(column.name)
        epoch = column.name + EPOCH_SUFFIX
        if epoch in have:
            # An export turned this float of epoch seconds into a timestamp and kept the
            # float beside it: read the float, as the store holds it.
            exprs.append(f"{_cast(quote_ident(epoch), target, backend)} AS {name}")
        elif column.name in have:
            exprs.append(f"{_cast(name, target, backend)} AS {name}")
        else:
            # A column the source lacks (an older snapshot): NULL of the right type.
            exprs.append(f"CAST(NULL AS {target}) AS {name}")
    con.execute(
        f"CREATE OR REPLACE VIEW main.{quote_ident(table.name)} AS "
        f"SELECT {', '.join(exprs)} FROM {relation}"
    )


def _empty_view(con: duckdb.DuckDBPyConnection, table: Table) -> None:
    exprs = ", ".join(
        f"CAST(NULL AS {duck_type(c)}) AS {quote_ident(c.name)}" for c in table.columns
    )
    con.execute(
        f"CREATE OR REPLACE VIEW main.{quote_ident(table.name)} AS SELECT {exprs} WHERE false"
    )


def _finish(
    con: duckdb.DuckDBPyConnection, models: dict[str, Table], present: set[str]
) -> frozenset[str]:
    """Placeholders for absent tables, the friendly views, then lock the connection down."""
    missing = frozenset(n for n in models if n not in present)
    for name in missing:
        # An empty typed table keeps every report and view bindable; reports that need
        # it say so (their `-- requires:` header).
        _empty_view(con, models[name])
    con.execute(views_sql())
    return missing


def _sandbox(con: duckdb.DuckDBPyConnection, allowed: Iterable[Path]) -> None:
    dirs = [str(p.resolve()) + "/" for p in allowed]
    if dirs:
        con.execute(f"SET allowed_directories = [{', '.join(sql_literal(d) for d in dirs)}]")
    # No file access beyond the snapshot (and an export's target), no new ATTACH, and no
    # changing these settings back from a query: `tracestore sql` never writes.
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


# --- live store ---------------------------------------------------------------------------


def _json_text(value: Any) -> str | None:
    # SQLite's NUMERIC affinity stores the JSON text of a bare number as a number.
    if value is None or isinstance(value, str):
        return value
    import orjson

    return orjson.dumps(value).decode()


def _arrow_column(values: list[Any], target: str, backend: str) -> tuple[pa.DataType, list[Any]]:
    if target == "JSON":
        return pa.string(), [_json_text(v) for v in values] if backend == "sqlite" else values
    if target == "TIMESTAMPTZ":
        # SQLite gives text (cast by the view); PostgreSQL aware datetimes.
        return (pa.string() if backend == "sqlite" else pa.timestamp("us", tz="UTC")), values
    if target == "DATE":
        return (pa.string() if backend == "sqlite" else pa.date32()), values
    if target == "BOOLEAN":
        return pa.bool_(), [None if v is None else bool(v) for v in values]
    if target == "BIGINT":
        return pa.int64(), values
    if target == "DOUBLE":
        return pa.float64(), values
    return pa.string(), values


def arrow_from_store(engine: Engine, table: Table) -> pa.Table:
    """Read one store table through SQLAlchemy into Arrow (the fallback path)."""
    backend = engine.dialect.name
    quote = engine.dialect.identifier_preparer.quote
    columns = list(table.columns)
    targets = [duck_type(c) for c in columns]
    exprs = [
        # psycopg would parse jsonb into Python objects: take PostgreSQL's text instead.
        f"CAST({quote(c.name)} AS TEXT)"
        if t == "JSON" and backend == "postgresql"
        else quote(c.name)
        for c, t in zip(columns, targets, strict=True)
    ]
    sql = f"SELECT {', '.join(exprs)} FROM {quote(table.name)}"
    batches: list[pa.RecordBatch] = []
    schema: pa.Schema | None = None
    with engine.connect() as conn:
        result = conn.execution_options(stream_results=True).exec_driver_sql(sql)
        for rows in result.partitions(_ARROW_BATCH_ROWS):
            by_column = list(zip(*rows, strict=True))
            arrays = []
            fields = []
            for c, target, values in zip(columns, targets, by_column, strict=True):
                arrow_type, converted = _arrow_column(list(values), target, backend)
                arrays.append(pa.array(converted, type=arrow_type))
                fields.append(pa.field(c.name, arrow_type))
            schema = pa.schema(fields)
            batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
    if schema is None:
        schema = pa.schema(
            [
                pa.field(c.name, _arrow_column([], t, backend)[0])
                for c, t in zip(columns, targets, strict=True)
            ]
        )
    return pa.Table.from_batches(batches, schema=schema)


def _register_arrow(
    con: duckdb.DuckDBPyConnection, engine: Engine, table: Table, backend: str
) -> None:
    name = f"_arrow_{table.name}"
    staged = f"_staged_{table.name}"
    # Copied into a DuckDB table, not left registered: a registered Arrow object is only
    # visible to the connection that registered it, and cursors must see it too.
    con.register(staged, arrow_from_store(engine, table))
    try:
        con.execute(f"CREATE OR REPLACE TABLE main.{quote_ident(name)} AS FROM {staged}")
    finally:
        con.unregister(staged)
    _base_view(con, table, f"main.{quote_ident(name)}", [c.name for c in table.columns], backend)


def _sqlite_number_json_tables(engine: Engine, tables: Iterable[Table]) -> list[Table]:
    """Tables with a JSON column holding a bare number in SQLite (see Analytics.fetch)."""
    quote = engine.dialect.identifier_preparer.quote
    found = []
    with engine.connect() as conn:
        for table in tables:
            json_columns = [c.name for c in table.columns if duck_type(c) == "JSON"]
            if not json_columns:
                continue
            test = " OR ".join(f"typeof({quote(c)}) IN ('integer', 'real')" for c in json_columns)
            row = conn.exec_driver_sql(
                f"SELECT 1 FROM {quote(table.name)} WHERE {test} LIMIT 1"
            ).first()
            if row is not None:
                found.append(table)
    return found


def allow_sqlite_attach() -> None:
    """Mark this process as one where DuckDB may attach a live SQLite store (a child)."""
    global _SQLITE_ATTACH_ALLOWED
    _SQLITE_ATTACH_ALLOWED = True


def open_live(
    engine: Engine,
    *,
    extension_dir: Path | None = None,
    writable_dir: Path | None = None,
    in_this_process: bool = False,
) -> Analytics:
    """DuckDB over a live store, read-only, with the normalized tables and views.

    `extension_dir` overrides where the scanner extension file is looked for;
    `writable_dir` is the one directory DuckDB may write to (an export's target).
    A SQLite store is refused unless this is the analytics child process or the caller
    says `in_this_process` (a test or benchmark whose process nobody else writes through).
    """
    attach_type, target = attach_target(engine.url)
    if attach_type == "sqlite" and not (_SQLITE_ATTACH_ALLOWED or in_this_process):
        # A second SQLite library closing the file drops this process's POSIX locks; the
        # next process to close then deletes the WAL under our writers (issue 18).
        raise RuntimeError(
            "DuckDB may not attach a live SQLite store in this process: "
            "use tracestore.reports.live, which reads it in a child process"
        )
    con = new_connection()
    try:
        analytics = _live(con, engine, attach_type, target, extension_dir)
        _sandbox(con, [writable_dir] if writable_dir is not None else [])
    except BaseException:
        con.close()
        raise
    return analytics


def _live(
    con: duckdb.DuckDBPyConnection,
    engine: Engine,
    attach_type: str,
    target: str,
    extension_dir: Path | None,
) -> Analytics:
    backend = engine.dialect.name
    models = model_tables()
    notices: list[str] = []
    present: set[str] = set()
    via_extension = False
    try:
        load_extension(con, backend, extension_dir)
        con.execute(f"ATTACH {sql_literal(target)} AS store (TYPE {attach_type}, READ_ONLY)")
        via_extension = True
    except ExtensionUnavailable as exc:
        notices.append(
            f"cannot load DuckDB's {EXTENSIONS[backend][1]} extension ({exc}); "
            "reading the store through SQLAlchemy instead (slower)"
        )
    except duckdb.Error as exc:
        notices.append(
            f"DuckDB cannot attach the store ({first_line(exc)}); "
            "reading it through SQLAlchemy instead (slower)"
        )
    if via_extension:
        schema = "public" if backend == "postgresql" else "main"
        rows = con.execute(
            "SELECT table_name, column_name FROM duckdb_columns() "
            "WHERE database_name = 'store' AND schema_name = ?",
            [schema],
        ).fetchall()
        columns: dict[str, set[str]] = {}
        for table_name, column_name in rows:
            columns.setdefault(table_name, set()).add(column_name)
        for name, table in models.items():
            if name in columns:
                relation = f"store.{quote_ident(schema)}.{quote_ident(name)}"
                _base_view(con, table, relation, columns[name], backend)
                present.add(name)
    else:
        from sqlalchemy import inspect

        existing = set(inspect(engine).get_table_names())
        for name, table in models.items():
            if name in existing:
                _register_arrow(con, engine, table, backend)
                present.add(name)
    missing = _finish(con, models, present)
    analytics = Analytics(
        con=con, source=backend, tables=frozenset(present), missing=missing, notices=notices
    )
    if via_extension and backend == "sqlite":
        switched: set[str] = set()

        def reload() -> bool:
            tables = [models[n] for n in sorted(present - switched)]
            bad = _sqlite_number_json_tables(engine, tables)
            for table in bad:
                _register_arrow(con, engine, table, backend)
                switched.add(table.name)
                analytics.notices.append(
                    f"{table.name}: JSON values stored as SQLite numbers; "
                    "read through SQLAlchemy instead of the sqlite extension (slower)"
                )
            return bool(bad)

        analytics._reload = reload
    return analytics


# --- snapshot -----------------------------------------------------------------------------


def _snapshot_relation(manifest: Manifest, entry: SnapshotTable) -> str:
    if entry.rows == 0 or not entry.files:
        columns = (
            ", ".join(f"CAST(NULL AS {t}) AS {quote_ident(n)}" for n, t in entry.columns)
            or "NULL AS _empty"
        )
        return f"(SELECT {columns} WHERE false)"
    files = ", ".join(sql_literal(str(manifest.root / f)) for f in entry.files)
    hive = "true" if entry.partitioned else "false"
    # By name: batches of an incremental snapshot written by different versions may
    # differ in their columns.
    return f"read_parquet([{files}], hive_partitioning = {hive}, union_by_name = true)"


def open_snapshot(
    root: Path, *, store: str | None = None, extension_dir: Path | None = None
) -> Analytics:
    """DuckDB over what `tracestore export` wrote: a Parquet snapshot or a Delta lake.

    `store` picks one store of a lake that holds several (a snapshot holds one);
    `extension_dir` overrides where the delta extension file is looked for.
    """
    root = root.expanduser().resolve()
    kind = lake.detect(root)
    con = new_connection()
    try:
        if kind == "delta":
            return _delta(con, root, store, extension_dir)
        manifest = read_manifest(root)
        held = manifest.data.get("store_id")
        if store is not None and held != store:
            raise InvalidRequest(f"{root} holds store {held}'s snapshot, not store {store}'s")
        return _snapshot(con, root, manifest)
    except BaseException:
        con.close()
        raise


def _snapshot(con: duckdb.DuckDBPyConnection, root: Path, manifest: Manifest) -> Analytics:
    models = model_tables()
    present: set[str] = set()
    for name, entry in manifest.tables.items():
        relation = _snapshot_relation(manifest, entry)
        table = models.get(name)
        if table is None:
            # A table this code does not model (a newer snapshot): expose it as written.
            con.execute(f"CREATE VIEW main.{quote_ident(name)} AS SELECT * FROM {relation}")
            continue
        _base_view(con, table, relation, [n for n, _ in entry.columns], "snapshot")
        present.add(name)
    missing = _finish(con, models, present)
    _sandbox(con, [root])
    return Analytics(
        con=con, source="snapshot", tables=frozenset(present), missing=missing, manifest=manifest
    )


# --- Delta lake -----------------------------------------------------------------------------


def _lake_store(root: Path, stores: list[str], store: str | None) -> str | None:
    """The store whose rows to read (None: all rows, the lake holds one store)."""
    if store is not None:
        if store not in stores:
            raise InvalidRequest(
                f"the lake at {root} holds no store {store!r}; it holds: {', '.join(stores)}"
            )
        return store
    if len(stores) > 1:
        # Keys (run_pk, trace_pk, ...) are per store: joining two stores' rows would pair
        # rows of different runs.
        raise InvalidRequest(
            f"the lake at {root} holds {len(stores)} stores ({', '.join(stores)}): "
            "choose one with --store"
        )
    return None


def _delta_from_package(con: duckdb.DuckDBPyConnection, path: Path, store: str | None) -> str:
    """Copy one Delta table into DuckDB through the deltalake package (the fallback)."""
    from deltalake import DeltaTable

    filters = [("store_id", "=", store)] if store is not None else None
    data = DeltaTable(str(path)).to_pyarrow_table(filters=filters)
    name = f"_lake_{path.name}"
    staged = f"_staged_{path.name}"
    con.register(staged, data)
    try:
        con.execute(f"CREATE OR REPLACE TABLE main.{quote_ident(name)} AS FROM {staged}")
    finally:
        con.unregister(staged)
    return f"main.{quote_ident(name)}"


def _delta(
    con: duckdb.DuckDBPyConnection, root: Path, store: str | None, extension_dir: Path | None
) -> Analytics:
    models = model_tables()
    chosen = _lake_store(root, lake.stores_in(root), store)
    notices: list[str] = []
    via_extension = True
    try:
        load_extension(con, "delta", extension_dir)
    except ExtensionUnavailable as exc:
        via_extension = False
        notices.append(
            f"cannot load DuckDB's delta extension ({exc}); "
            "reading the lake through the deltalake package instead (slower)"
        )
    present: set[str] = set()
    for name, table in models.items():
        path = root / name
        if not lake.is_delta_table(path):
            continue
        if via_extension:
            scan = f"delta_scan({sql_literal(str(path))})"
            where = f" WHERE store_id = {sql_literal(chosen)}" if chosen is not None else ""
        else:
            scan, where = _delta_from_package(con, path, chosen), ""
        columns = [str(r[0]) for r in con.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall()]
        _base_view(con, table, f"(SELECT * FROM {scan}{where})", columns, "snapshot")
        present.add(name)
    missing = _finish(con, models, present)
    _sandbox(con, [root])
    return Analytics(
        con=con, source="lake", tables=frozenset(present), missing=missing, notices=notices
    )

"""Run a named report or an ad-hoc query on an analytics connection."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs

from tracestore.db.types import pg_safe
from tracestore.errors import InvalidRequest, first_line
from tracestore.reports.catalog import Report
from tracestore.reports.connection import Analytics, AnalyticsError
from tracestore.reports.filters import Filters
from tracestore.reports.memory import MEMORY_LIMIT_ENV, memory_limit

# Table functions that reach a database outside DuckDB's read-only attachment (the
# postgres extension's postgres_execute can switch its transaction to read-write), or
# that run SQL text the check below cannot see (query, query_table).
_DENIED_PREFIXES = ("postgres_", "sqlite_")
_DENIED = frozenset({"query", "query_table", "pg_clear_cache"})
# Where a DuckDB error message starts quoting SQL: the statements it sends to the store
# (postgres_scanner's `COPY (SELECT ...`) are internals, not for the user.
_QUOTED_SQL = re.compile(r"""["']?\b(?:COPY \(|SELECT\b)""")

log = logging.getLogger("tracestore.reports")


@dataclass(slots=True)
class Result:
    """Rows of a report or query, with their DuckDB types and anything worth saying."""

    table: pa.Table
    types: list[str]
    source: str
    report: Report | None = None
    filters: Filters | None = None
    notices: list[str] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        """Column names, in order."""
        return list(self.table.column_names)


def public_reason(exc: BaseException) -> str:
    """The first line of a DuckDB error, cut before any SQL text it quotes."""
    text = first_line(exc)
    quoted = _QUOTED_SQL.search(text)
    if quoted is None:
        return text
    return text[: quoted.start()].rstrip(" :") + " (the statement is in the server log)"


def memory_hint(exc: duckdb.Error) -> str:
    """For DuckDB running out of memory: the limit it ran into and where it is set."""
    if not isinstance(exc, duckdb.OutOfMemoryException):
        return ""
    limit = memory_limit() or "DuckDB's default"
    return f" (DuckDB's memory limit here is {limit}: {MEMORY_LIMIT_ENV} sets it)"


def run_report(analytics: Analytics, report: Report, filters: Filters) -> Result:
    """Run `report` over `analytics` with `filters` bound as prepared parameters."""
    params = filters.bind(report.parameters, report.name)
    if analytics.source == "postgresql" and isinstance(params.get("env"), str):
        # The store's typed columns hold U+2400 for NUL on PostgreSQL (db/types.py), and a
        # NUL cannot even travel to it: look for what is stored, as the API's filters do.
        params["env"] = pg_safe(params["env"])
    try:
        table, types = analytics.fetch(report.sql, params)
    except duckdb.Error as exc:
        log.warning("report %s failed: %s", report.name, exc)
        raise AnalyticsError(
            f"report {report.name} failed: {public_reason(exc)}{memory_hint(exc)}"
        ) from exc
    notices = list(analytics.notices)
    absent = [t for t in report.requires if t in analytics.missing]
    if absent:
        # Rows computed without the data would read as "no drift", not "no drift data".
        table = table.slice(0, 0)
        notices.append(
            f"no {report.name} data: the {analytics.source} has no {', '.join(absent)} "
            f"table{'s' if len(absent) > 1 else ''} (a store or snapshot from before them)"
        )
    return Result(table, types, analytics.source, report, filters, notices)


def _function_names(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        name = node.get("function_name")
        if isinstance(name, str):
            yield name
        for value in node.values():
            yield from _function_names(value)
    elif isinstance(node, list):
        for value in node:
            yield from _function_names(value)


def check_select(analytics: Analytics, query: str) -> None:
    """Refuse anything but one SELECT that stays inside DuckDB (InvalidRequest says why)."""
    if not query.strip():
        raise InvalidRequest("empty query: give one SELECT statement")
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise InvalidRequest(f"bad SQL: {first_line(exc)}") from None
    if len(statements) != 1:
        raise InvalidRequest(f"give one SQL statement, not {len(statements)}")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise InvalidRequest(
            f"only SELECT queries run here (this is {kind.name}): the store is read-only"
        )
    serialized = analytics.con.execute("SELECT json_serialize_sql(?::VARCHAR)", [query])
    row = serialized.fetchone()
    # The standard library's parser: DuckDB writes a literal past a double's range as
    # `Infinity`, which orjson refuses ("internal error" for `SELECT 1e400`).
    tree = json.loads(row[0]) if row else {"error": True}
    if tree.get("error"):
        raise InvalidRequest(
            f"only plain SELECT queries run here: {tree.get('error_message', 'not a SELECT')}"
        )
    for name in _function_names(tree):
        lowered = name.lower()
        if lowered in _DENIED or lowered.startswith(_DENIED_PREFIXES):
            raise InvalidRequest(
                f"{name}() is not allowed here: it reaches the database outside DuckDB's "
                "read-only view of it"
            )


def run_sql(analytics: Analytics, query: str) -> Result:
    """Run one ad-hoc SELECT (refused if it could write or escape the read-only views)."""
    check_select(analytics, query)
    try:
        table, types = analytics.fetch(query)
    except duckdb.Error as exc:
        raise InvalidRequest(f"query failed: {first_line(exc)}{memory_hint(exc)}") from None
    return Result(table, types, analytics.source, notices=list(analytics.notices))
